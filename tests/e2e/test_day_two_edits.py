"""Every stack-config key of the prod stack, edited, through the real program: the edits that lose
data are exactly the INVENTORY's, each refused until acknowledged, and shown in the plan.

Each key gets one edit that validates (tests/config_edits.py), named list entries are removed and
renamed, and the COORDINATED edits cover what takes two keys at once or a direction (a smaller file
system). To stay fast, edits are planned in batches that validate together and lose disjoint
holders; a batch must lose exactly the union of its edits' inventory entries, so an edit that
loses data without an INVENTORY line fails the test.
"""

import pytest

from deploy.day_two import consequences
from deploy.program import build_platform
from infra.core.change import DELETE, REPLACE
from infra.core.day_two import holder_of
from infra.core.offline import run_offline
from infra.eks.day_two import EKS_CLUSTERS
from infra.integrations import plan_steps
from infra.stack.data_loss import DataLossAcknowledgement
from infra.stack.loading import parse_stack_config
from infra.storage.day_two import deleting_updates
from tests.config_edits import Edit, _valid, entry_edits, key_edits
from tests.plugin import plan_of, stack_values

STACK = "prod"
TEAMS = {f"queues.teams[{t}]" for t in ("team-a", "team-b", "research")}
CAROL = "devServers.users[carol]"
RECORDS = "billing.recordUsage"
EVERYTHING = {
    "cluster", "images", "storage.bucket", "storage.efs", "storage.fsx", RECORDS, CAROL, *TEAMS,
}  # fmt: skip

# Edits EKS refuses half way through `pulumi up` (infra/eks/day_two.py control_plane_network).
NETWORK_REFUSED = {"network.cidr", "network.azCount"}

# Edit -> the data holders it loses.
INVENTORY = {
    "region (and the EFA pool's zone)": EVERYTHING,
    "network.cidr": {"storage.fsx"},
    "cluster.name": {"cluster", "images", RECORDS, CAROL, *TEAMS},
    "storage.bucket.kms": {"storage.bucket"},
    "storage.efs.enabled": {"storage.efs"},
    "storage.fsx.enabled (and the jobs on it)": {"storage.fsx"},
    "storage.fsx.storageCapacityGib 4800 -> 2400": {"storage.fsx"},
    # S3 deletes the checkpoints the shorter expiry no longer keeps (an update in place).
    "storage.bucket.checkpointRetentionDays shorter": {"storage.bucket"},
    "storage.bucket.noncurrentVersionDays shorter": {"storage.bucket"},
    "devServers.enabled": {CAROL, "images"},
    "devServers.operatorImage.uri": {"images"},
    "karpenter.gpuRegistrationWatchImage.uri": {"images"},
    "image.uri": {"images"},
    "billing.usageRecorderImage.uri": {"images"},
    "billing.recordUsage": {RECORDS, "images"},
    "devServers.users[carol].name": {CAROL},
    "devServers.users[carol] removed": {CAROL},
    "devServers.users[carol] renamed": {CAROL},
    "queues.teams[team-a].name": {"queues.teams[team-a]"},
    "queues.teams[team-a].namespace": {"queues.teams[team-a]"},
    "queues.teams[team-b].namespace": {"queues.teams[team-b]"},
    "queues.teams[research].namespace": {"queues.teams[research]"},
    "queues.teams[team-a] removed": {"queues.teams[team-a]"},
    "queues.teams[team-a] renamed": {"queues.teams[team-a]"},
    # Carol is on team-b: removing the team removes her (what names it goes with it).
    "queues.teams[team-b] removed": {"queues.teams[team-b]", CAROL},
    "queues.teams[team-b] renamed": {"queues.teams[team-b]"},
    "queues.teams[research] removed": {"queues.teams[research]"},
    "queues.teams[research] renamed": {"queues.teams[research]"},
}


def _section(values: dict, name: str) -> dict:
    return values.setdefault(f"training-platform:{name}", {})


def _region(values: dict) -> dict:
    edited = {**values, "aws:region": "us-east-1"}
    pools = [dict(p) for p in values["training-platform:nodePools"]]
    for pool in pools:
        if pool.get("availabilityZone"):
            pool["availabilityZone"] = "us-east-1a"
    return {**edited, "training-platform:nodePools": pools}


def _without_fsx(values: dict) -> dict:
    storage = _section(values, "storage")
    edited = {**values, "training-platform:storage": {**storage, "fsx": {"enabled": False}}}
    edited["training-platform:jobs"] = [
        {**j, "checkpoint": "s3"} if j.get("checkpoint") == "fsx" else j
        for j in values["training-platform:jobs"]
    ]
    return edited


def _smaller_fsx(values: dict) -> dict:
    storage = _section(values, "storage")
    fsx = {**storage["fsx"], "storageCapacityGib": 2400}
    return {**values, "training-platform:storage": {**storage, "fsx": fsx}}


def _shorter(key: str, default: int):
    """An edit making the bucket's `key` (days) one day shorter."""

    def edit(values: dict) -> dict:
        storage = _section(values, "storage")
        days = storage.get("bucket", {}).get(key, default)
        bucket = {**storage.get("bucket", {}), key: days - 1}
        return {**values, "training-platform:storage": {**storage, "bucket": bucket}}

    return edit


def _mpi_nodes(values: dict) -> dict:
    jobs = [
        {**j, "minNodes": 2, "maxNodes": 2} if j["kind"] == "MPIJob" else j
        for j in values["training-platform:jobs"]
    ]
    return {**values, "training-platform:jobs": jobs}


def _mpi_args(values: dict) -> dict:
    jobs = [
        {**j, "args": [*j["args"], "--seed", "7"]} if j["kind"] == "MPIJob" else j
        for j in values["training-platform:jobs"]
    ]
    return {**values, "training-platform:jobs": jobs}


def _ami(values: dict) -> dict:
    karpenter = {**_section(values, "karpenter"), "amiAlias": "al2023@v20261001"}
    return {**values, "training-platform:karpenter": karpenter}


def _subnets(values: dict) -> dict:
    network = {
        **_section(values, "network"),
        "privateSubnetCidrs": ["10.30.64.0/19", "10.30.96.0/19", "10.30.128.0/19"],
        "publicSubnetCidrs": ["10.30.0.0/22", "10.30.4.0/22", "10.30.8.0/22"],
    }
    return {**values, "training-platform:network": network}


def _pool(name: str, **changes):
    def edit(values: dict) -> dict:
        pools = [
            {k: v for k, v in {**p, **changes}.items() if v is not None} if p["name"] == name else p
            for p in values["training-platform:nodePools"]
        ]
        return {**values, "training-platform:nodePools": pools}

    return edit


RESERVATION = {"id": "cr-0123456789abcdef0", "instanceType": "p4d.24xlarge", "instanceCount": 2}
# What a single key's edit cannot do alone: the keys in the name change together.
COORDINATED = [
    Edit("region (and the EFA pool's zone)", _region),
    Edit("storage.fsx.enabled (and the jobs on it)", _without_fsx),
    Edit("storage.fsx.storageCapacityGib 4800 -> 2400", _smaller_fsx),
    Edit("storage.bucket.checkpointRetentionDays shorter", _shorter("checkpointRetentionDays", 30)),
    Edit("storage.bucket.noncurrentVersionDays shorter", _shorter("noncurrentVersionDays", 7)),
    Edit("jobs[gpt-large-mpi].minNodes and maxNodes", _mpi_nodes),
    Edit("jobs[gpt-large-mpi].args", _mpi_args),
    Edit("karpenter.amiAlias", _ami),
    Edit("network.privateSubnetCidrs and publicSubnetCidrs", _subnets),
    Edit(
        "nodePools[gpu-large].capacityReservations (with reserved capacity)",
        _pool(
            "gpu-large",
            capacityTypes=["reserved", "on-demand"],
            capacityReservations=[RESERVATION],
        ),
    ),
    Edit(
        "nodePools[gpu-large].efa off (and its zone)",
        _pool("gpu-large", efa=False, availabilityZone=None),
    ),
]
RENAMED = "renamed with what names it (entry edit)"
ONLY_EFA = "only an EFA pool has one"
CPU_POOL = "only GPU pools run the fabric check"
RESERVED = "with reserved capacity (COORDINATED on gpu-large)"
# Keys no edit of the prod stack can change on its own, and why.
NOT_EDITABLE = {
    "region": "with the EFA pool's zone (COORDINATED)",
    "network.privateSubnetCidrs": "with publicSubnetCidrs (COORDINATED)",
    "network.publicSubnetCidrs": "with privateSubnetCidrs (COORDINATED)",
    "network.controlPlaneSubnetCidrs": "one /28 or larger per AZ, free in the VPC: "
    "infra/vpc/tests/test_network.py plans one",
    "network.existingVpc": "adopting a VPC is a new stack's choice; "
    "infra/vpc/tests/test_network.py plans it",
    "karpenter.amiAlias": "a dated release (COORDINATED)",
    "nodePools[gpu-small].name": RENAMED,
    "nodePools[gpu-large].name": RENAMED,
    "queues.teams[team-b].name": RENAMED,
    "queues.teams[research].name": RENAMED,
    "nodePools[gpu-small].capacityReservations": RESERVED,
    "nodePools[gpu-large].capacityReservations": "with reserved capacity (COORDINATED)",
    "nodePools[cpu].capacityReservations": RESERVED,
    "nodePools[gpu-small].efa": "g5.12xlarge has no EFA",
    "nodePools[cpu].efa": "m6i has no EFA",
    "nodePools[gpu-large].efa": "with its zone (COORDINATED)",
    "nodePools[gpu-small].availabilityZone": ONLY_EFA,
    "nodePools[gpu-large].availabilityZone": ONLY_EFA,
    "nodePools[cpu].availabilityZone": ONLY_EFA,
    "nodePools[gpu-large].staticNodes": "a DevServer flavor runs on it (static pools take none)",
    "nodePools[cpu].fabricCheck.nodes": CPU_POOL,
    "nodePools[cpu].fabricCheck.maxBytes": CPU_POOL,
    "nodePools[cpu].fabricCheck.floors": CPU_POOL,
    "storage.fsx.enabled": "with the jobs that checkpoint to it (COORDINATED)",
    "policy.allowedPublicIngress": "names only what the stack opens to the internet (hybrid)",
    "jobs[gpt-large].kind": "an elastic job (minNodes < maxNodes) stays a PyTorchJob",
    "jobs[gpt-large-mpi].minNodes": "an MPIJob's minNodes equals its maxNodes (COORDINATED)",
    "jobs[gpt-large-mpi].maxNodes": "an MPIJob's minNodes equals its maxNodes (COORDINATED)",
    "jobs[gpt-large-mpi].args": "command and arguments (COORDINATED)",
    # One program per job: its own code or command replaces args (workloads/tests/test_stack_code.py
    # plans them, and a folder edit held back until the revision).
    **{
        f"jobs[{job}].{key}": "a program instead of args"
        for job in ("gpt-large", "gpt-large-mpi")
        for key in ("code", "command", "image")
    },
    "devServers.flavors[a100-8].nodePool": "no other pool holds 8 GPUs and 979 GiB",
    "devServers.flavors[gpu-1].machine": "a machine goes with nodePool hybrid (none here)",
    "devServers.flavors[a100-8].machine": "a machine goes with nodePool hybrid (none here)",
    "hybrid": "the hybrid section: infra/hybrid/tests/test_hybrid.py plans its edits",
    "acknowledgeDataLoss": "what the other edits are checked with",
}


@pytest.fixture(scope="module")
def base():
    return stack_values(STACK), plan_of(STACK)


def batches(values: dict, edits: list[Edit]) -> list[list[Edit]]:
    """First-fit batches of edits that validate together and lose disjoint holders."""
    found: list[tuple[list[Edit], dict, set]] = []
    for edit in edits:
        loses = INVENTORY.get(edit.key, set())
        for batch, batch_values, lost in found:
            if lost & loses or (loses == EVERYTHING and lost) or (lost == EVERYTHING):
                continue
            try:
                combined = edit(batch_values)
            except ValueError:  # the batch took away what this edit changes
                continue
            if _valid(combined):
                batch.append(edit)
                found[found.index((batch, batch_values, lost))] = (batch, combined, lost | loses)
                break
        else:
            found.append(([edit], edit(values), set(loses)))
    return [batch for batch, _, _ in found]


def test_every_key_edit_that_loses_data_is_in_the_inventory_and_refused(base):
    values, plan = base
    edits, stuck = key_edits(values)
    assert sorted(stuck) == sorted(NOT_EDITABLE)
    edits += COORDINATED + entry_edits(values)
    names = {e.key for e in edits}
    assert set(INVENTORY) <= names, set(INVENTORY) - names
    for batch in batches(values, edits):
        edited = values
        for edit in batch:
            edited = edit(edited)
        config = parse_stack_config(edited, f"Pulumi.{STACK}.yaml")
        after = run_offline(lambda c=config: build_platform(c), STACK, edited, None, plan.outputs)
        steps = plan_steps(plan, after)
        lost = {holder_of(s.old) for s in steps if s.op in (REPLACE, DELETE)} - {None}
        lost |= {holder for holder, _ in deleting_updates(steps)}
        expected = set().union(*(INVENTORY.get(e.key, set()) for e in batch))
        assert lost == expected, ([e.key for e in batch], lost ^ expected)
        effects = consequences(steps, config, STACK)
        for holder in lost:
            assert any(f"({holder}) would be" in r for r in effects.refusals), holder
        acknowledged = config.model_copy(
            update={
                "acknowledge_data_loss": [
                    DataLossAcknowledgement(holder=h, reason="sweep") for h in sorted(lost)
                ]
            }
        )
        left = consequences(steps, acknowledged, STACK).refusals
        # What EKS would refuse whatever the stack file acknowledges: the VPC or its zones.
        network = [r for r in left if r.startswith("eks-network:")]
        cluster_goes = any(s.type in EKS_CLUSTERS and s.op in (REPLACE, DELETE) for s in steps)
        moved = any(e.key in NETWORK_REFUSED for e in batch) and not cluster_goes
        assert bool(network) == moved, ([e.key for e in batch], network)
        left = [r for r in left if r not in network]
        # Deleting a protected holder still takes the acknowledged update first.
        deleted = {holder_of(s.old) for s in steps if s.op == DELETE} - {None}
        assert all("protected where it is deployed" in r for r in left), left
        assert len(left) == len([s for s in steps if s.op == DELETE and holder_of(s.old)])
        assert {h for h in deleted if any(f"({h})" in r for r in left)} == deleted
