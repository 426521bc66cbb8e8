"""Checks between sections, once each section is valid: a job's pool, queue and storage, a
flavor's pool, zones, AMI release, hybrid networks, public ingress, prices."""

from infra.core.catalog import (
    UnpricedError,
    load_prices,
)
from infra.core.config import HYBRID_POOL, allowed_list, did_you_mean
from infra.core.paths import PROJECT_DIR
from infra.core.pools import pod_room
from infra.core.versions import KUBERNETES_VERSIONS
from infra.hybrid.config import eks_service_cidr
from infra.jobs.config import code_errors, job_args_errors
from infra.karpenter.config import NODE_RESERVE, job_pod_fits
from infra.kueue.config import TENSORBOARD, queue_shortfall
from infra.stack.config import StackConfig
from infra.stack.policy import HYBRID_GATEWAY


def public_ingress_resources(config: StackConfig) -> list[str]:
    """What this stack opens to the internet on purpose, by resource name: the WireGuard
    gateway's security group of the hybrid section. policy.allowedPublicIngress names these."""
    return [HYBRID_GATEWAY] if config.hybrid else []


def _not_a_pool(name: str, config: "StackConfig") -> str:
    """The message for a reference (a job's, a flavor's) to a pool that does not exist."""
    pools = [p.name for p in config.node_pools]
    if name == HYBRID_POOL:
        return (
            f"{HYBRID_POOL} names the hybrid machines but the stack has no hybrid section; "
            + allowed_list(pools, "allowed: none yet")
            + ", or add a training-platform:hybrid section"
        )
    pools += [HYBRID_POOL] if config.hybrid else []
    return (
        f"{name!r} is not a node pool; "
        + did_you_mean(name, pools)
        + allowed_list(pools, "allowed: none yet, declare nodePools first")
    )


def dev_servers_errors(config: "StackConfig") -> list[tuple[tuple, str]]:
    """A DevServers section's flavors fit their pools, users name teams, names are unique."""
    section = config.dev_servers
    teams = [t.name for t in config.queues.teams]
    problems: list[tuple[tuple, str]] = []
    for what, items in (("flavors", section.flavors), ("users", section.users)):
        names = [item.name for item in items]
        for i, name in enumerate(names):
            if names.count(name) > 1:
                problems.append(
                    (("devServers", what, i, "name"), f"{name!r} repeats; allowed: unique names")
                )
    for i, flavor in enumerate(section.flavors):
        loc = ("devServers", "flavors", i)
        pool = config.pool_named(flavor.node_pool)
        if pool is None:
            problems.append(((*loc, "nodePool"), _not_a_pool(flavor.node_pool, config)))
            continue
        if pool.hybrid:
            problems += _hybrid_flavor_errors(flavor, loc, config)
            continue
        if flavor.machine is not None:
            problems.append(
                (
                    (*loc, "machine"),
                    f"{flavor.machine!r} on pool {pool.name}: a machine goes with nodePool "
                    f"{HYBRID_POOL} only; allowed: none",
                )
            )
        if pool.topology:
            # Kueue admits onto a topology flavor only pods that ask for topology (the platform
            # queue is not topology-only; kueue pkg/scheduler/flavorassigner/tas_flavorassigner.go,
            # checkPodSetAndFlavorMatchForTAS), and DevServer pods do not.
            problems.append(
                (
                    (*loc, "nodePool"),
                    f"pool {pool.name} places pods by topology (staticNodes), where Kueue admits "
                    "no DevServer; allowed: a pool without staticNodes",
                )
            )
            continue
        # A flavor's pod must fit on the smallest instance type of its pool, or it never
        # schedules: the same room a job pod asks for.
        smallest = min(pool.types, key=lambda t: (t.gpus, t.vcpu, t.memory_gib))
        vcpu, memory_gib = pod_room(smallest)
        limits = {
            "gpus": (flavor.gpus, smallest.gpus),
            "cpu": (flavor.cpu, vcpu),
            "memoryGib": (flavor.memory_gib, memory_gib),
        }
        for key, (asked, most) in limits.items():
            if asked > most:
                problems.append(
                    (
                        (*loc, key),
                        f"{asked} does not fit pool {pool.name}'s {smallest.name}; "
                        f"allowed: at most {most}",
                    )
                )
        if pool.gpu and flavor.gpus == 0:
            problems.append(
                (
                    (*loc, "gpus"),
                    f"0 on GPU pool {pool.name}; allowed: 1 to {smallest.gpus} "
                    "(CPU-only servers belong on a CPU pool)",
                )
            )
    for i, user in enumerate(section.users):
        for key, asked, smallest in (
            ("cpu", user.quota.cpu, min((f.cpu for f in section.flavors), default=0)),
            (
                "memoryGib",
                user.quota.memory_gib,
                min((f.memory_gib for f in section.flavors), default=0),
            ),
        ):
            if asked is not None and asked < smallest:
                problems.append(
                    (
                        ("devServers", "users", i, "quota", key),
                        f"{asked} is less than the smallest flavor asks for, so no server of "
                        f"{user.name}'s could start; allowed: at least {smallest}, or unset "
                        "(derived from the flavors, servers and gpus)",
                    )
                )
        if user.team not in teams:
            problems.append(
                (
                    ("devServers", "users", i, "team"),
                    f"{user.team!r} is not a team; "
                    + did_you_mean(user.team, [*teams])
                    + allowed_list([*teams], "allowed: none yet, declare queues.teams first"),
                )
            )
    if section.enabled and not section.flavors:
        problems.append((("devServers", "flavors"), "empty; allowed: at least one flavor"))
    return problems


def cross_reference_errors(config: StackConfig) -> list[tuple[tuple, str]]:
    """Checks between sections (a job's pool, queue and storage), once each section is valid."""
    pools = {p.name: p for p in config.node_pools}
    teams = {t.name: t for t in config.queues.teams}
    storage = {"s3": True, "fsx": config.storage.fsx.enabled, "efs": config.storage.efs.enabled}
    problems: list[tuple[tuple, str]] = []
    if not pools and (config.queues.teams or config.jobs):
        problems.append(
            (
                ("nodePools",),
                "is empty but queues.teams or jobs need capacity; allowed: at least one pool",
            )
        )
    elif not pools and config.hybrid is None:
        # Kueue's CRD refuses a ClusterQueue without flavors (resourceGroups[].flavors minItems 1).
        problems.append(
            (
                ("nodePools",),
                "is empty, which leaves the platform ClusterQueue without a flavor (Kueue refuses "
                "it) and the platform without capacity; allowed: at least one pool",
            )
        )
    for i, pool in enumerate(config.node_pools):
        zone, loc = pool.availability_zone, ("nodePools", i, "availabilityZone")
        if zone and zone[:-1] != config.region:
            problems.append(
                (
                    loc,
                    f"pool {pool.name}: {zone} is not in region {config.region}; allowed: "
                    f"{config.region}a, {config.region}b, ...",
                )
            )
        if pool.efa and not zone:
            problems.append(
                (
                    loc,
                    f"pool {pool.name}: missing; an EFA pool keeps its nodes in one cluster "
                    "placement group, which lives in one AZ; allowed: an AZ of the stack's "
                    f"subnets where {', '.join(pool.instance_types)} is offered, e.g. "
                    f"{config.region}a (.venv/bin/python -m deploy.preflight checks the offering)",
                )
            )
        too_small = [t.name for t in pool.types if not job_pod_fits(pool, t)]
        if too_small and config.jobs:
            cpu, memory_gib = pool.job_pod_requests()
            problems.append(
                (
                    ("nodePools", i, "instanceTypes"),
                    f"{', '.join(too_small)} cannot hold a job pod ({cpu} vCPU, {memory_gib} GiB "
                    f"after about {NODE_RESERVE['vcpu']} vCPU and {NODE_RESERVE['memory_gib']} "
                    "GiB node reserve); allowed: larger types",
                )
            )
        if pool.name == HYBRID_POOL:
            problems.append(
                (
                    ("nodePools", i, "name"),
                    f"{HYBRID_POOL} is the name of the hybrid machines' pool (their node label "
                    "and Kueue flavor); allowed: any other name",
                )
            )
    names = [j.name for j in config.jobs]
    for i, job in enumerate(config.jobs):
        loc = ("jobs", i)
        if names.count(job.name) > 1:
            problems.append(((*loc, "name"), f"{job.name!r} repeats; allowed: unique job names"))
        pool = config.job_pool(job)
        team = teams.get(job.queue)
        if pool is None:
            problems.append(((*loc, "nodePool"), _not_a_pool(job.node_pool, config)))
        elif pool.hybrid and job.kind == "TrainJob":
            problems.append(
                (
                    (*loc, "kind"),
                    "the hybrid machines have no ClusterTrainingRuntime (their pods are sized "
                    "per job), and a job without `kind` is a TrainJob; allowed: kind PyTorchJob "
                    "or MPIJob there",
                )
            )
        elif not pool.hybrid and job.kind == "PyTorchJob" and job.min_nodes == job.max_nodes:
            problems.append(
                (
                    (*loc, "kind"),
                    "a PyTorchJob runs on the training operator v1, which upstream no longer "
                    "maintains: it is kept for elastic jobs and the hybrid machines alone; "
                    "allowed: leave `kind` out (a TrainJob) or MPIJob for a fixed size, or "
                    "minNodes < maxNodes for an elastic job",
                )
            )
        elif job.max_nodes > pool.max_nodes:
            most = (
                f"the {pool.max_nodes} hybrid machines that admit team {job.queue} (one pod "
                f"each: {', '.join(m.name for m in pool.machines) or 'none'}; a machine's owner "
                "and allow say whom it admits)"
                if pool.hybrid
                else f"pool {pool.name}'s maxNodes {pool.max_nodes}"
            )
            problems.append(
                (
                    (*loc, "maxNodes"),
                    f"{job.max_nodes} exceeds {most}; allowed: at most {pool.max_nodes}",
                )
            )
        elif team is not None:
            shortfall = queue_shortfall(job, pool, team)
            if shortfall:
                problems.append(
                    (
                        (*loc, "maxNodes"),
                        f"{shortfall}; allowed: fewer nodes, or a larger borrowingLimitPercent or "
                        "pool",
                    )
                )
        if team is None:
            problems.append(
                (
                    (*loc, "queue"),
                    f"{job.queue!r} is not a team queue; {did_you_mean(job.queue, [*teams])}"
                    + allowed_list([*teams], "allowed: none yet, declare queues.teams first"),
                )
            )
        if team is not None and team.tensorboard and job.name == TENSORBOARD:
            # A job's ServiceAccount is named after it (workloads/training_job.py).
            problems.append(
                (
                    (*loc, "name"),
                    f"{TENSORBOARD} is the ServiceAccount of team {team.name}'s TensorBoard; "
                    "allowed: any other name",
                )
            )
        problems += [((*loc, "args"), message) for message in job_args_errors(job)]
        builds = not config.image.uri
        problems += [((*loc, "code"), said) for said in code_errors(job, PROJECT_DIR, builds)]
        if pool is not None and pool.hybrid and job.checkpoint != "s3":
            # The EFS and FSx CSI node agents do not run on hybrid nodes (README, Cluster mode).
            problems.append(
                (
                    (*loc, "checkpoint"),
                    f"{job.checkpoint} is not mounted on the hybrid machines, whose nodes run no "
                    "EFS or FSx CSI agent; allowed: s3",
                )
            )
        elif not storage[job.checkpoint]:
            problems.append(
                (
                    (*loc, "checkpoint"),
                    f"{job.checkpoint} is not enabled in storage; allowed: "
                    + ", ".join(k for k, on in storage.items() if on),
                )
            )
    return (
        problems
        + _hybrid_errors(config)
        + dev_servers_errors(config)
        + _members_errors(config)
        + _ami_release_errors(config)
        + _public_ingress_errors(config)
    )


def _members_errors(config: StackConfig) -> list[tuple[tuple, str]]:
    """EKS keeps one access entry per principal: an admin's already grants cluster-admin, and a
    member's team group could not be added to it (cluster.py's entries carry none)."""
    admins = set(config.cluster.admin_principal_arns)
    return [
        (
            ("queues", "teams", i, "members", j),
            f"{arn} is in cluster.adminPrincipalArns, whose access entry is cluster-admin; "
            "allowed: a principal that is not a cluster admin",
        )
        for i, team in enumerate(config.queues.teams)
        for j, arn in enumerate(team.members)
        if arn in admins
    ]


def _ami_release_errors(config: StackConfig) -> list[tuple[tuple, str]]:
    """Karpenter finds AMIs of a release for the cluster's Kubernetes version only."""
    version = config.cluster.kubernetes_version
    first = f"al2023@{KUBERNETES_VERSIONS[version].first_al2023_release}"
    if config.karpenter.ami_alias >= first:  # one format, al2023@vYYYYMMDD: text order is time
        return []
    return [
        (
            ("karpenter", "amiAlias"),
            f"{config.karpenter.ami_alias} has no AMI for Kubernetes {version}: the first AL2023 "
            f"release for Kubernetes {version} is {first.removeprefix('al2023@')}; allowed: "
            f"{first} or later",
        )
    ]


def _public_ingress_errors(config: StackConfig) -> list[tuple[tuple, str]]:
    opened = public_ingress_resources(config)
    return [
        (
            ("policy", "allowedPublicIngress", i),
            f"{name!r} is not a resource this stack opens to the internet; "
            + did_you_mean(name, opened)
            + allowed_list(
                opened,
                f"allowed: none, nothing here faces the internet ({HYBRID_GATEWAY} "
                "comes with a hybrid section)",
            ),
        )
        for i, name in enumerate(config.policy.allowed_public_ingress)
        if name not in opened
    ]


def _hybrid_flavor_errors(flavor, loc: tuple, config: StackConfig) -> list[tuple[tuple, str]]:
    """A hybrid flavor names its machine, and fits it with the room a job pod gets there
    (pod_room): its servers run there alone, as their homes are on its disk."""
    machines = {m.name: m for m in config.hybrid.machines}
    if flavor.machine not in machines:
        found = "none" if flavor.machine is None else repr(flavor.machine)
        return [
            (
                (*loc, "machine"),
                f"{found}: a hybrid flavor names the machine its servers run on; "
                + did_you_mean(flavor.machine or "", [*machines])
                + allowed_list([*machines], "allowed: a hybrid.machines name"),
            )
        ]
    machine = machines[flavor.machine]
    vcpu, memory = pod_room(machine)
    if flavor.gpus <= machine.gpus and flavor.cpu <= vcpu and flavor.memory_gib <= memory:
        return []
    return [
        (
            loc,
            f"{flavor.gpus} GPUs, {flavor.cpu} vCPU, {flavor.memory_gib} GiB does not fit "
            f"machine {machine.name}; allowed: at most {machine.gpus} GPUs, {vcpu} vCPU, "
            f"{memory} GiB",
        )
    ]


def _tenant_errors(config: StackConfig) -> list[tuple[tuple, str]]:
    """Each machine's owner and allowed tenants are users and teams of this stack."""
    known = {
        "user": [u.name for u in config.dev_servers.users],
        "team": [t.name for t in config.queues.teams],
    }
    where = {"user": "devServers.users", "team": "queues.teams"}
    problems = []
    for i, machine in enumerate(config.hybrid.machines):
        named = [(("owner",), machine.owner)]
        named += [(("allow", j), tenant) for j, tenant in enumerate(machine.allow)]
        for key, tenant in named:
            kind, name = tenant.split(":", 1)
            if name not in known[kind]:
                problems.append(
                    (
                        ("hybrid", "machines", i, *key),
                        f"{tenant!r} names no {kind} of {where[kind]}; "
                        + did_you_mean(name, known[kind])
                        + allowed_list([f"{kind}:{n}" for n in known[kind]], "allowed: none yet"),
                    )
                )
    return problems


def _hybrid_errors(config: StackConfig) -> list[tuple[tuple, str]]:
    """Hybrid nodes against the rest of the stack: endpoint mode and the VPC's addresses."""
    if config.hybrid is None:
        return []
    problems = _tenant_errors(config)
    endpoint = config.cluster.endpoint
    if endpoint.public_access and endpoint.private_access:
        problems.append(
            (
                ("cluster", "endpoint"),
                "hybrid nodes need publicAccess or privateAccess, not both (the endpoint would "
                "resolve to public IPs for nodes outside the VPC); allowed: one of them true",
            )
        )
    # EKS refuses remote networks that overlap each other, the VPC or the service CIDR (EKS
    # user guide, "Prepare networking for hybrid nodes"); the VPC's routes would misdirect them.
    vpc, services = config.network.cidr, eks_service_cidr(config.network.cidr)
    taken = [("the VPC cidr", vpc), ("the cluster's service CIDR", services)]
    remote = {
        "remoteNodeCidrs": config.hybrid.remote_node_cidrs,
        "remotePodCidrs": config.hybrid.remote_pod_cidrs,
    }
    for key, cidrs in remote.items():
        for i, cidr in enumerate(cidrs):
            clash = next(((what, c) for what, c in taken if cidr.overlaps(c)), None)
            if clash:
                problems.append(
                    (
                        ("hybrid", key, i),
                        f"{cidr} overlaps {clash[0]} {clash[1]}; allowed: a range outside "
                        f"the VPC ({vpc}), the service CIDR ({services}) and the other remote "
                        "CIDRs",
                    )
                )
            taken.append((f"hybrid.{key}[{i}]", cidr))
    if config.network.existing_vpc is not None:
        problems.append(
            (
                ("hybrid",),
                "hybrid nodes need routes in the VPC's route tables, which an adopted VPC "
                "(network.existingVpc) keeps to itself; allowed: hybrid with this stack's VPC",
            )
        )
    return problems


def price_errors(config: StackConfig) -> list[tuple[tuple, str]]:
    """The plan prices every node at the stack's region: each type and store needs a price there."""
    try:
        prices = load_prices(config.region)
    except UnpricedError as e:
        return [(("region",), str(e))]
    wanted = [
        (
            ("cluster", "systemNodeGroup", "instanceType"),
            config.cluster.system_node_group.instance_type,
        )
    ]
    for i, pool in enumerate(config.node_pools):
        wanted += [
            (("nodePools", i, "instanceTypes", j), t) for j, t in enumerate(pool.instance_types)
        ]
    if config.hybrid is not None:
        wanted.append((("hybrid", "gatewayInstanceType"), config.hybrid.gateway_instance_type))
    problems = []
    for loc, name in wanted:
        try:
            prices.instance(name)
        except UnpricedError as e:
            problems.append((loc, str(e)))
    if config.storage.fsx.enabled:
        try:
            prices.fsx_key(config.storage.fsx.throughput_per_tib)
        except UnpricedError as e:
            problems.append((("storage", "fsx", "throughputPerTib"), str(e)))
    return problems
