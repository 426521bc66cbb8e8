"""What a change does to what already runs: the data it loses, the nodes it drifts, the jobs it
restarts. It reads the steps of a change (infra/steps.py: offline from two plans, or from a
real `pulumi preview --json`) and words them for the platform engineer who is about to apply them.

The rules, from upstream source at the pinned versions:
- Data holders (infra/core/data_holders.py) are protected. The engine replaces a protected resource
  only when the program no longer protects it, and deletes one only when its deployed state is
  no longer protected (pulumi/pulumi pkg/resource/deploy/step_generator.go `new.Protect &&
  old.Protect`; step.go DeleteStep.Apply `s.old.Protect`): a deletion takes one `pulumi up` with
  the acknowledgement, then one that removes the holder.
- Karpenter v1.14.1 drifts a node when its NodePool's `spec.template` changes (its hash covers
  everything there but `requirements`: kubernetes-sigs/karpenter pkg/apis/v1/nodepool.go Hash),
  when a requirement no longer admits the node (pkg/controllers/nodeclaim/disruption/drift.go
  areRequirementsDrifted), when its EC2NodeClass's spec changes outside the selector terms
  (karpenter-provider-aws pkg/apis/v1/ec2nodeclass.go Hash), or when the AMI its alias resolves
  to changes: the alias's SSM path names the cluster's Kubernetes version
  (pkg/providers/amifamily/al2023.go resolvePath), so an upgrade drifts every node.
- Kueue v0.19.2 restarts a running job whose pod sets no longer match its Workload: counts and
  containers (image, command, args, env, resources), init containers
  (pkg/util/equality/podset.go comparePodTemplate); other pod fields reach only the job's next
  start (pkg/controller/jobframework/reconciler.go EquivalentToWorkload). It computes a TrainJob's
  pod sets from its live ClusterTrainingRuntime, so a runtime's container change restarts the
  running TrainJobs on it (tests/trainer_rules.py).
"""

import json
import re
from dataclasses import dataclass, field

from devservers.api import API_VERSION as DEVSERVERS_API_VERSION
from infra.core.data_holders import BUCKET, EFS, FSX, HOLDER_ANNOTATION, HOLDER_TAG, loss
from infra.core.declared import dig, kind_of, listed, pod_sets
from infra.core.kinds import HELM_RELEASE, NAMESPACE
from infra.core.replacement import changed_paths
from infra.eks.facts import EKS_CLUSTER, EKS_COMPONENT, NODE_GROUP
from infra.images.container_image import KEPT_BUILDS as ECR_KEPT_BUILDS
from infra.karpenter.facts import NODECLASS, NODEPOOL
from infra.operators.facts import JOB_TYPES, RUNTIME
from infra.stack.config import StackConfig
from infra.steps import CREATE, DELETE, REPLACE, UPDATE, Step
from infra.storage.facts import CLAIM, LIFECYCLE
from infra.vpc.facts import NAT_GATEWAY as NAT
from infra.vpc.facts import SUBNET
from workloads.manifests import CHECKPOINT_ENV

FLAVOR = f"kubernetes:{DEVSERVERS_API_VERSION}:DevServerFlavor"
# The control plane: pulumi-eks's component offline (its children are invisible under mocks), the
# aws:eks Cluster it creates in a real preview.
EKS_CLUSTERS = {EKS_COMPONENT, EKS_CLUSTER}
ACKNOWLEDGE = "training-platform:acknowledgeDataLoss"
# What EC2NodeClass drift leaves out of its hash: resolved dynamically, drifting only the nodes
# whose subnet, security groups, reservation or AMI no longer match (ec2nodeclass.go hash:"ignore").
NODECLASS_DYNAMIC = {
    "subnetSelectorTerms",
    "securityGroupSelectorTerms",
    "capacityReservationSelectorTerms",
    "amiSelectorTerms",
    "amiFamily",
    "ipPrefixCount",
}


@dataclass
class Consequences:
    losses: list[str] = field(default_factory=list)
    # Replacements and deletions of what holds no data, grouped by what causes them.
    replaced: list[str] = field(default_factory=list)
    # What fails the plan as a mandatory policy does, each led by its rule: losses the stack file
    # does not accept (data-loss), a Kubernetes version EKS would refuse (kubernetes-version).
    refusals: list[str] = field(default_factory=list)
    drifts: list[str] = field(default_factory=list)
    restarts: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        sections = [
            ("Data lost", self.losses),
            ("Replaced or deleted (no data lost)", self.replaced),
            (
                "Nodes that drift (replaced by Karpenter once they run no job or DevServer)",
                self.drifts,
            ),
            ("Running work", self.restarts),
            ("Notes", self.notes),
        ]
        out = []
        for title, lines in sections:
            if lines:
                out += [f"  {title}:"] + [f"    {line}" for line in lines]
        return out or ["  nothing that exists is replaced, deleted, drifted or restarted"]


def holder_of(resource) -> str | None:
    """The data holder a resource is (its tag or annotation), or None."""
    if resource is None:
        return None
    inputs = resource.inputs
    for tags in (inputs.get("tags"), inputs.get("clusterTags")):
        if isinstance(tags, dict) and tags.get(HOLDER_TAG):
            return str(tags[HOLDER_TAG])
    annotation = dig(inputs, "metadata", "annotations", HOLDER_ANNOTATION)
    return str(annotation) if annotation else None


def consequences(
    steps: list[Step],
    config: StackConfig,
    stack: str,
    jobs: dict | None = None,
    runtimes: dict | None = None,
) -> Consequences:
    """`jobs`, `runtimes`: the stack's outputs of those names (workloads/training_job.py,
    workloads/training_runtimes.py), where known: what each revision holds back."""
    found = Consequences()
    _data(steps, config, found)
    _expiring(steps, config, found)
    _versions(steps, found)
    drifted = _drift(steps, config, found)
    _jobs(steps, config, drifted, stack, found)
    _runtimes(steps, found)
    _flavors(steps, found)
    _network(steps, found)
    _claims(steps, found)
    held = [("job", name, entry, f"jobs[{name}]", "it") for name, entry in (jobs or {}).items()]
    held += [
        ("runtime", name, entry, "runtimes", "the TrainJobs running on it")
        for name, entry in (runtimes or {}).items()
    ]
    deleted_claims = _deleted_claims(steps)
    for what, name, entry, key, restarted in sorted(held, key=lambda h: h[:2]):
        if entry.get("heldBack"):
            found.restarts.append(
                f"{what} {name} keeps revision {entry['revision']}: the stack's changes to its "
                f"{', '.join(entry['heldBack'])} wait for {key}.revision "
                f"{entry['revision'] + 1}, which restarts {restarted}"
            )
            gone = _mounts_deleted(entry.get("manifest") or {}, what, deleted_claims)
            if gone:
                found.refusals.append(
                    f"held-revision: {what} {name} keeps revision {entry['revision']}, whose "
                    f"pods mount {', '.join(gone)}, which this update deletes: the deletion "
                    f"waits for its pods, and none could start again; move {key}.revision to "
                    f"{entry['revision'] + 1} in this update"
                )
    if any(entry.get("heldBack") for *_, entry, _, _ in held):
        found.notes.append(
            f"what keeps an older revision pulls an older image, which ECR keeps while fewer "
            f"than {ECR_KEPT_BUILDS} newer builds exist: bump the revision before then"
        )
    _controllers(steps, found)
    return found


def _accepting(holder: str) -> str:
    return f"to accept it, add {{holder: {holder}, reason: ...}} to {ACKNOWLEDGE}"


def _data(steps: list[Step], config: StackConfig, found: Consequences) -> None:
    released = config.released
    lost = set()
    lost_mounts: set[str] = set()
    others: dict[str, list[str]] = {}
    for step in steps:
        if step.op not in (REPLACE, DELETE):
            continue
        holder = holder_of(step.old)
        if holder is None:
            cause = f"replaced ({step.reasons[0]})" if step.op == REPLACE else "deleted"
            others.setdefault(cause, []).append(f"{step.type.split(':')[-1]} {step.name}")
            continue
        lost.add(holder)
        what = "replaced" if step.op == REPLACE else "deleted"
        why = f" ({', '.join(step.reasons[:3])})" if step.reasons else ""
        line = f"{step.type.split(':')[-1]} {step.name} is {what}{why}: loses {loss(holder)}"
        found.losses.append(line)
        if holder in MOUNTED and holder not in lost_mounts:
            lost_mounts.add(holder)
            found.restarts.append(_mounted_lost(holder, config))
        if holder not in released:
            found.refusals.append(
                f"data-loss: {step.name} ({holder}) would be {what}, losing {loss(holder)}; "
                f"{_accepting(holder)}"
            )
        elif step.op == DELETE and step.old.protect:
            found.refusals.append(
                f"data-loss: {step.name} ({holder}) is protected where it is deployed: the engine "
                "deletes it only once a `pulumi up` has lifted its protect. First apply the stack "
                f"with the acknowledgement and {holder} still in it, then remove it (or `pulumi "
                f"state unprotect '{step.urn}'`)"
            )
    for cause, names in sorted(others.items(), key=lambda item: -len(item[1])):
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        found.replaced.append(f"{cause}: {shown}")
    for holder in sorted(released - lost):
        found.notes.append(
            f"{ACKNOWLEDGE} lifts protect from {holder}, which this change does not lose; once "
            "the change that loses it is applied, remove the entry"
        )


# Holders that running pods mount: (the jobs' checkpoint store there, what it is called).
MOUNTED = {FSX: ("fsx", "FSx for Lustre"), EFS: ("efs", "EFS")}


def _mounted_lost(holder: str, config: StackConfig) -> str:
    """What losing a file system that pods mount does to them."""
    store, what = MOUNTED[holder]
    line = (
        f"every pod that mounts {what} loses it, and the update waits for them: stop the jobs, "
        f"TrainJobs, TensorBoards (and DevServers, for EFS) that use it first"
    )
    on_it = sorted(j.name for j in config.jobs if j.checkpoint == store)
    if on_it:
        line += f"; {', '.join(on_it)} checkpoint there"
        if store == "fsx":
            line += " and resume from what reached the bucket"
    return line


def deleting_updates(steps: list[Step]) -> list[tuple[str, str]]:
    """(holder, what it deletes) of the in-place updates that delete data: an expiry in the
    bucket's lifecycle that reaches objects sooner than before (a shorter one, one on a prefix no
    rule expired, whatever its rule's id) deletes them as soon as S3 applies it (daily)."""
    found = []
    for step in steps:
        if step.type != LIFECYCLE or step.op != UPDATE:
            continue
        for path, what in (
            (("expiration", "days"), "objects"),
            (("noncurrentVersionExpiration", "noncurrentDays"), "old versions of objects"),
        ):
            before = _expiries(step.old.inputs, path)
            for prefix, now in _expiries(step.new.inputs, path):
                # Objects under `prefix` expired, before, after the least days of the rules
                # whose prefix covers them.
                was = min((d for p, d in before if prefix.startswith(p)), default=None)
                if was is not None and now >= was:
                    continue
                shown = prefix or "the whole bucket"
                since = f"{was} -> {now} days" if was else f"{now} days, where nothing expired"
                found.append(
                    (
                        BUCKET,
                        f"{step.name} ({BUCKET}) would be updated to delete the {what} under "
                        f"{shown} older than {now} days ({since})",
                    )
                )
    return found


def _expiries(lifecycle: dict, path: tuple[str, str]) -> list[tuple[str, int]]:
    """(prefix, days) of a lifecycle's enabled rules that expire after days at `path`."""
    return [
        (str(dig(rule, "filter", "prefix") or ""), int(dig(rule, *path)))
        for rule in listed(dig(lifecycle, "rules"))
        if rule.get("status") == "Enabled" and dig(rule, *path)
    ]


def _expiring(steps: list[Step], config: StackConfig, found: Consequences) -> None:
    for holder, line in deleting_updates(steps):
        found.losses.append(line)
        if holder not in config.released:
            found.refusals.append(f"data-loss: {line}; {_accepting(holder)}")


def _minor(version: object) -> tuple[int, int]:
    major, minor = str(version).split(".")[:2]
    return int(major), int(minor)


def _version_changes(steps: list[Step]) -> set[tuple[str, str]]:
    return {
        (str(s.old.inputs.get("version")), str(s.new.inputs.get("version")))
        for s in steps
        if s.type in EKS_CLUSTERS and s.op == UPDATE and "version" in s.reasons
    }


def _versions(steps: list[Step], found: Consequences) -> None:
    """EKS upgrades a control plane one minor version at a time and never downgrades one
    (Amazon EKS user guide, "Update existing cluster to new Kubernetes version")."""
    for old, new in sorted(_version_changes(steps)):
        (old_major, old_minor), (new_major, new_minor) = _minor(old), _minor(new)
        if (new_major, new_minor) < (old_major, old_minor):
            why = "EKS never downgrades a control plane"
        elif new_major != old_major or new_minor > old_minor + 1:
            why = "EKS upgrades one minor version at a time"
        else:
            continue
        found.refusals.append(
            f"kubernetes-version: cluster.kubernetesVersion {old} -> {new}: {why}; allowed: "
            f"{old}, or {old_major}.{old_minor + 1}"
        )


def _deleted_claims(steps: list[Step]) -> set[tuple[str, str]]:
    """(namespace, name) of the claims an update deletes, but in namespaces it deletes: what ran
    there goes with them."""
    gone = {
        str(dig(s.old.inputs, "metadata", "name"))
        for s in steps
        if s.type == NAMESPACE and s.op == DELETE
    }
    claims = {
        (
            str(dig(s.old.inputs, "metadata", "namespace")),
            str(dig(s.old.inputs, "metadata", "name")),
        )
        for s in steps
        if s.type == CLAIM and s.op == DELETE
    }
    return {(ns, name) for ns, name in claims if ns not in gone}


def _mounts_deleted(manifest: dict, what: str, deleted: set[tuple[str, str]]) -> list[str]:
    """The claims a kept manifest's pods mount that are deleted: in its namespace for a job, in
    any (the team namespaces its TrainJobs run in) for a cluster-wide runtime."""
    claims = set(re.findall(r'"claimName": "([^"]+)"', json.dumps(manifest)))
    namespace = dig(manifest, "metadata", "namespace")
    return sorted(
        f"{ns}/{claim}" if what == "runtime" else claim
        for ns, claim in deleted
        if claim in claims and (what == "runtime" or ns == namespace)
    )


def _existing(steps: list[Step], types: set[str]):
    """(step, Kubernetes name) of each object of `types` that exists and changes or goes."""
    for step in steps:
        if step.type in types and step.op != CREATE:
            yield step, dig((step.new or step.old).inputs, "metadata", "name")


def _flavors(steps: list[Step], found: Consequences) -> None:
    """The DevServer operator replaces the pods of every server of a changed flavor, and stops
    those of a deleted one (devservers/operator.py on_flavor, controller.py _refused)."""
    for step, name in _existing(steps, {FLAVOR}):
        if step.op == DELETE:
            found.restarts.append(
                f"DevServer flavor {name} is deleted: the servers of that flavor stop (homes "
                "stay) until their owners pick another"
            )
        else:
            fields = sorted({p.split(".")[1].split("[")[0] for p in step.reasons if "." in p})
            found.restarts.append(
                f"DevServer flavor {name} changes ({', '.join(fields) or 'spec'}): every server "
                "of that flavor restarts on new pods (homes stay; what runs in them ends)"
            )


def _network(steps: list[Step], found: Consequences) -> None:
    """What a network change does to the nodes in it: a NAT gateway's open connections end with
    it; AWS refuses to delete a subnet while network interfaces are in it (EC2 DeleteSubnet:
    DependencyViolation), so its nodes must go first."""
    for step in steps:
        if step.type == NAT and step.op in (DELETE, REPLACE):
            found.notes.append(
                f"NAT gateway {step.name} is {'deleted' if step.op == DELETE else 'replaced'}: "
                "the connections of the nodes behind it to outside the VPC break (a pull, a "
                "download, a run's logging), and they go out through the route's new gateway"
            )
        if step.type == SUBNET and step.op in (DELETE, REPLACE):
            found.notes.append(
                f"subnet {step.name} is {'deleted' if step.op == DELETE else 'replaced'}: AWS "
                "refuses while a node, a mount target or a load balancer is in it, so the update "
                "fails until they are gone; Karpenter drifts its nodes (those running a job "
                "keep it: move them with deploy.roll)"
            )


def _claims(steps: list[Step], found: Consequences) -> None:
    """A claim bound to another volume keeps its name: the pods that mount it see other files from
    their next start, while the old volume keeps its own (a Retain volume stays, Released)."""
    for step in steps:
        rebound = [
            r for r in step.reasons if r.startswith(("spec.volumeName", "spec.storageClass"))
        ]
        if step.type == CLAIM and step.op == REPLACE and rebound:
            meta = step.new.inputs.get("metadata") or {}
            found.notes.append(
                f"claim {meta.get('namespace')}/{meta.get('name')} is bound to another volume "
                f"({', '.join(rebound)}): its pods see that volume's files from their next start "
                "(the old volume's stay on it): copy across what they must keep seeing"
            )


def _pool_nodes(step: Step) -> str:
    nodes = dig((step.new or step.old).inputs, "spec", "limits", "nodes")
    return f"up to {nodes} nodes" if nodes else "its nodes"


def _drift(steps: list[Step], config: StackConfig, found: Consequences) -> set[str]:
    """Pools whose nodes drift, with a line each."""
    drifted: dict[str, str] = {}
    pools = {
        dig((s.new or s.old).inputs, "metadata", "name"): s for s in steps if s.type == NODEPOOL
    }
    for old, new in sorted(_version_changes(steps))[:1]:
        for pool in config.node_pools:
            drifted[pool.name] = (
                f"{pool.name}: every node (AMI for Kubernetes {old} -> {new}); up to "
                f"{pool.max_nodes} nodes"
            )
    for step in steps:
        name = dig((step.new or step.old).inputs, "metadata", "name")
        if step.type == NODEPOOL:
            why = _nodepool_drift(step)
            if why and name not in drifted:
                drifted[name] = f"{name}: {why}; {_pool_nodes(step)}"
        elif step.type == NODECLASS and step.op == UPDATE:
            changed = {p.split(".")[1].split("[")[0] for p in step.reasons if p.startswith("spec.")}
            static = sorted(changed - NODECLASS_DYNAMIC)
            ami = "amiSelectorTerms" in changed
            if (static or ami) and name not in drifted:
                cause = f"EC2NodeClass {', '.join(static)}" if static else "a new AMI"
                pool = pools.get(name)
                nodes = _pool_nodes(pool) if pool else "its nodes"
                drifted[name] = f"{name}: every node ({cause}); {nodes}"
    found.drifts += [drifted[name] for name in sorted(drifted)]
    return set(drifted)


def _nodepool_drift(step: Step) -> str | None:
    if step.op == DELETE:
        return "deleted: Karpenter drains every node (running jobs and DevServers finish first)"
    if step.op == REPLACE:
        return "replaced: every node is drained and launched again"
    if step.op != UPDATE:
        return None
    old = dig(step.old.inputs, "spec", "template") or {}
    new = dig(step.new.inputs, "spec", "template") or {}
    hashed = [p for p in changed_paths(old, new) if not p.startswith("spec.requirements")]
    if hashed:
        fields = sorted({".".join(p.split(".")[:2]).split("[")[0] for p in hashed})
        return f"every node (template {', '.join(fields)})"
    removed = []
    before = _requirements(old)
    after = _requirements(new)
    for key, values in before.items():
        gone = sorted(values - after.get(key, values))
        if gone:
            removed.append(f"{key} {', '.join(gone)}")
    if set(after) - set(before):
        return f"every node (new requirement on {', '.join(sorted(set(after) - set(before)))})"
    if removed:
        return f"the nodes with {'; '.join(removed)} (no longer allowed)"
    return None


def _requirements(template: dict) -> dict[str, set[str]]:
    return {
        dig(r, "key"): set(map(str, listed(dig(r, "values"))))
        for r in listed(dig(template, "spec", "requirements"))
        if dig(r, "operator") == "In"
    }


def _jobs(
    steps: list[Step], config: StackConfig, drifted: set[str], stack: str, found: Consequences
) -> None:
    for step, name in _existing(steps, JOB_TYPES):
        if step.op == DELETE:
            found.restarts.append(f"job {name} is deleted: its pods are killed (checkpoints stay)")
        elif step.op == REPLACE:
            old, new = _checkpoints(step.old), _checkpoints(step.new)
            resumes = (
                "it restarts from its newest checkpoint"
                if old == new
                else f"it starts again from step 0 at {new[1]} in {new[0]}: its checkpoints stay "
                f"at {old[1]} in {old[0]}"
            )
            found.restarts.append(
                f"job {name} is deleted and created again ({', '.join(step.reasons[:2])}): "
                f"{resumes}"
            )
        else:
            restarting = _kueue_restarts(step)
            if restarting:
                found.restarts.append(
                    f"job {name} restarts ({', '.join(restarting)}): Kueue suspends it, queues it "
                    "again and it resumes from its newest checkpoint"
                )
            else:
                found.restarts.append(
                    f"job {name}: its change reaches its pods only when they next start"
                )
    for job in config.jobs:
        if job.node_pool in drifted:
            found.restarts.append(
                f"job {job.name} keeps its {job.node_pool} nodes while it runs (do-not-disrupt, "
                f"no terminationGracePeriod); to move it now, restarting it once: "
                f".venv/bin/python -m deploy.roll --stack {stack} --pool {job.node_pool}"
            )


def _checkpoints(job) -> tuple[str, str]:
    """(namespace, checkpoint folder) of a job: its trainer's --checkpoint-dir, or a TrainJob's
    CHECKPOINT_DIR, else its runtime's default (S3, under the namespace); a shared file system's
    path is its namespace's own."""
    spec = job.inputs.get("spec") or {}
    found = re.search(r'"--checkpoint-dir", "([^"]+)"', json.dumps(spec))
    env = {e.get("name"): e.get("value") for e in listed(dig(spec, "trainer", "env"))}
    folder = found.group(1) if found else env.get(CHECKPOINT_ENV, "its runtime's default")
    return str(dig(job.inputs, "metadata", "namespace")), str(folder)


def _runtimes(steps: list[Step], found: Consequences) -> None:
    """The pools' ClusterTrainingRuntimes: their TrainJobs are not in the stack, so the plan
    names what a change does to whichever run on them."""
    for step, name in _existing(steps, {RUNTIME}):
        if step.op == DELETE:
            found.restarts.append(
                f"runtime {name} is deleted: TrainJobs that name it can no longer start "
                "(running ones run on until they stop)"
            )
            continue
        restarting = _kueue_restarts(step)
        if restarting:
            found.restarts.append(
                f"runtime {name} changes ({', '.join(restarting)}): each TrainJob running on it "
                "that does not set these itself restarts (Kueue suspends it, queues it again and "
                "it resumes from its newest checkpoint)"
            )
        else:
            found.restarts.append(
                f"runtime {name}: its change reaches the TrainJobs on it when they next start"
            )


def _kueue_restarts(step: Step) -> list[str]:
    """What of a job's (or runtime's) pod sets changed in a way Kueue restarts it for."""
    kind = kind_of(step.type)
    before, after = pod_sets(kind, step.old.inputs), pod_sets(kind, step.new.inputs)
    changed = []
    for role in sorted(set(before) | set(after)):
        (old_pods, old), (new_pods, new) = before.get(role, (0, {})), after.get(role, (0, {}))
        if old_pods != new_pods:
            changed.append(f"{role} replicas")
        for what in ("initContainers", "containers"):
            paths = changed_paths(dig(old, "spec", what) or [], dig(new, "spec", what) or [])
            fields = sorted({p.split(".", 1)[-1].split("[")[0] for p in paths} - {""})
            if paths:
                changed.append(f"{role} {what} {', '.join(fields) or 'list'}")
    return changed


def _controllers(steps: list[Step], found: Consequences) -> None:
    for old, new in sorted(_version_changes(steps)):
        found.notes.append(
            f"the EKS control plane upgrades {old} -> {new} first; add-ons and the system node "
            "group follow it (docs/platform/upgrades.md)"
        )
    for step in steps:
        if step.op != UPDATE:
            continue
        if step.type == NODE_GROUP and any(
            p.startswith(("version", "launchTemplate.version", "releaseVersion"))
            for p in step.reasons
        ):
            found.notes.append(
                f"node group {step.name}: EKS replaces its nodes one at a time (rolling update); "
                "the controllers on them restart elsewhere"
            )
        elif step.type == HELM_RELEASE and "version" in step.reasons:
            found.notes.append(
                f"Helm release {step.name}: chart {step.old.inputs.get('version')} -> "
                f"{step.new.inputs.get('version')}; its controller restarts, running jobs keep "
                "running"
            )
