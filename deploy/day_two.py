"""What a change does to what already runs: the data it loses, the nodes it drifts, the jobs it
restarts. It reads the steps of a change (deploy/steps.py: offline from two plans, or from a real
`pulumi preview --json`) and words them for the platform engineer who is about to apply them.

The rules, from upstream source at the pinned versions:
- Data holders (infra/data_holders.py) are protected. The engine replaces a protected resource
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

from dataclasses import dataclass, field

from deploy.replace_rules import changed_paths
from deploy.steps import CREATE, DELETE, REPLACE, UPDATE, Step
from infra.config import StackConfig
from infra.data_holders import HOLDER_ANNOTATION, HOLDER_TAG, loss
from infra.declared import dig, kind_of, listed, pod_sets

NODEPOOL = "kubernetes:karpenter.sh/v1:NodePool"
NODECLASS = "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass"
JOB_TYPES = {
    "kubernetes:kubeflow.org/v1:PyTorchJob",
    "kubernetes:kubeflow.org/v2beta1:MPIJob",
    "kubernetes:trainer.kubeflow.org/v1alpha1:TrainJob",
}
RUNTIME = "kubernetes:trainer.kubeflow.org/v1alpha1:ClusterTrainingRuntime"
EKS_CLUSTER = "eks:index:Cluster"
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
HELM_RELEASE = "kubernetes:helm.sh/v3:Release"
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
    refusals: list[str] = field(default_factory=list)  # losses the stack file does not accept
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
    drifted = _drift(steps, config, found)
    _jobs(steps, config, drifted, stack, found)
    _runtimes(steps, found)
    held = [("job", name, entry, f"jobs[{name}]", "it") for name, entry in (jobs or {}).items()]
    held += [
        ("runtime", name, entry, "runtimes", "the TrainJobs running on it")
        for name, entry in (runtimes or {}).items()
    ]
    for what, name, entry, key, restarted in sorted(held, key=lambda h: h[:2]):
        if entry.get("heldBack"):
            found.restarts.append(
                f"{what} {name} keeps revision {entry['revision']}: the stack's changes to its "
                f"{', '.join(entry['heldBack'])} wait for {key}.revision "
                f"{entry['revision'] + 1}, which restarts {restarted}"
            )
    _controllers(steps, found)
    return found


def _data(steps: list[Step], config: StackConfig, found: Consequences) -> None:
    released = config.released
    lost = set()
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
        if holder not in released:
            found.refusals.append(
                f"{step.name} ({holder}) would be {what}, losing {loss(holder)}; to accept it, "
                f"add {{holder: {holder}, reason: ...}} to {ACKNOWLEDGE}"
            )
        elif step.op == DELETE and step.old.protect:
            found.refusals.append(
                f"{step.name} ({holder}) is protected where it is deployed: the engine deletes "
                f"it only once a `pulumi up` has lifted its protect. First apply the stack with "
                f"the acknowledgement and {holder} still in it, then remove it (or `pulumi state "
                f"unprotect '{step.urn}'`)"
            )
    for cause, names in sorted(others.items(), key=lambda item: -len(item[1])):
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        found.replaced.append(f"{cause}: {shown}")
    for holder in sorted(released - lost):
        found.notes.append(
            f"{ACKNOWLEDGE} lifts protect from {holder}, which this change does not lose; once "
            "the change that loses it is applied, remove the entry"
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
    version = next(
        (s for s in steps if s.type == EKS_CLUSTER and s.op == UPDATE and "version" in s.reasons),
        None,
    )
    if version is not None:
        old, new = version.old.inputs.get("version"), version.new.inputs.get("version")
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
    for step in steps:
        if step.type not in JOB_TYPES or step.op == CREATE:
            continue
        name = dig((step.new or step.old).inputs, "metadata", "name")
        if step.op == DELETE:
            found.restarts.append(f"job {name} is deleted: its pods are killed (checkpoints stay)")
        elif step.op == REPLACE:
            found.restarts.append(
                f"job {name} is deleted and created again ({', '.join(step.reasons[:2])}): it "
                "restarts from its newest checkpoint"
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


def _runtimes(steps: list[Step], found: Consequences) -> None:
    """The pools' ClusterTrainingRuntimes: their TrainJobs are not in the stack, so the plan
    names what a change does to whichever run on them."""
    for step in steps:
        if step.type != RUNTIME or step.op == CREATE:
            continue
        name = dig((step.new or step.old).inputs, "metadata", "name")
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
    for step in steps:
        if step.op != UPDATE:
            continue
        if step.type == EKS_CLUSTER and "version" in step.reasons:
            found.notes.append(
                f"the EKS control plane upgrades {step.old.inputs.get('version')} -> "
                f"{step.new.inputs.get('version')} first; add-ons and the system node group "
                "follow it (docs/platform/upgrades.md)"
            )
        elif step.type == NODE_GROUP and any(
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
