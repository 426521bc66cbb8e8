"""TeamAccess: what a team's members may do in its namespace, and their way into the cluster.

Each team's namespace gets the Role `team-member`, bound to the group team:<team>: its members
submit, watch and delete their jobs, read what tells them how the jobs fare, reach the team's
TensorBoard, and fetch checkpoints (trainer.fetch). Outside the namespace they read only the
platform's ClusterTrainingRuntimes (RUNTIMES_ROLE), beside what every authenticated user has
(discovery, the Trainer's public ConfigMap). A job they create must name a queue (QUEUE_POLICY),
or Kueue would not hold it, keep Karpenter from draining its nodes (DISRUPT_POLICY), and name no
node and no priority (PLACE_POLICY); a pod they create must name a queue too, no priority, and
may not reach the system nodes (POD_POLICY).

Each member principal gets one EKS access entry (type STANDARD, no access policy: its rights are
this RBAC and nothing more) mapping it to the groups of every team it is a member of. EKS keeps
one entry per principal, so a member who is also a DevServer user keeps the entry DevServers
gives her, with her team groups added (member_groups).
"""

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from infra.core.context import ClusterContext
from infra.core.declared import REPLICA_SPEC_KEYS
from infra.core.nodes import SYSTEM_NODE_LABEL, SYSTEM_TAINT_KEY
from infra.core.rbac import CONNECT, READ, binding, group, rule
from infra.kueue.config import TENSORBOARD, TeamConfig
from infra.kueue.queues import TEAM_LABEL

ROLE = "team-member"
# Cluster-wide, members read the platform's ClusterTrainingRuntimes (what a TrainJob names in
# runtimeRef, and what TrainerClient.list_runtimes shows): image digests and pool settings, no
# secrets.
RUNTIMES_ROLE = "team-member-runtimes"
RUNTIMES_RULES = [rule(["trainer.kubeflow.org"], ["clustertrainingruntimes"], READ)]
JOBS = [*READ, "create", "delete"]
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# The job kinds members create, by API group.
JOB_RESOURCES = {"kubeflow.org": ["pytorchjobs", "mpijobs"], "trainer.kubeflow.org": ["trainjobs"]}
# What a member may do in her team's namespace. Jobs are created and deleted, never changed
# (no patch or update): a change to a queued job's spec or labels could take it around Kueue.
MEMBER_RULES = [
    *(rule([group], resources, JOBS) for group, resources in JOB_RESOURCES.items()),
    rule(["kueue.x-k8s.io"], ["workloads", "localqueues"], READ),
    # The Kubeflow SDK asks for a TrainingRuntime of the name in the namespace before the
    # cluster's (a 403 there fails TrainerClient.train); the platform ships none in namespaces.
    rule(["trainer.kubeflow.org"], ["trainingruntimes"], READ),
    # create and delete: trainer.fetch's copy pod (trainer/cluster_copy.py POD_RULES).
    rule([""], ["pods"], [*READ, "create", "delete"]),
    rule([""], ["pods/log"], ["get"]),
    # exec: trainer.fetch streams checkpoints out of its pod; port-forward: the TensorBoard.
    rule([""], ["pods/exec", "pods/portforward"], CONNECT),
    # services: `kubectl port-forward svc/tensorboard` reads the Service to find its pod.
    rule([""], ["events", "services"], READ),
    # The usage recorder's records of the team's jobs (infra/billing/usage_recorder.py), which
    # `devctl usage` reads; the platform keeps nothing secret in ConfigMaps of team namespaces.
    rule([""], ["configmaps"], READ),
    rule(["events.k8s.io"], ["events"], READ),
]


# Every namespace of a team: its own and its members' DevServer namespaces.
TEAM_NAMESPACES = {"matchExpressions": [{"key": TEAM_LABEL, "operator": "Exists"}]}
# The group each member's access entry maps her to, per team (team_group).
TEAM_GROUP_PREFIX = "team:"

# Kueue holds only jobs that name a queue (its Configuration's manageJobsWithoutQueueName is
# off): one created without the label would run at once, outside the team's quota. RBAC cannot
# ask for a label; a ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1, GA in
# Kubernetes 1.30) refuses such a job in every team namespace, whoever creates it. On create
# only: members cannot update a job, and an operator updating an older unlabelled job (its
# finalizers, on delete) must not be refused.
QUEUE_POLICY = "team-jobs-name-a-queue"
QUEUE_RULE = f"has(object.metadata.labels) && '{QUEUE_LABEL}' in object.metadata.labels"


def created_jobs() -> dict:
    """matchConstraints: the creation of a job of a kind members create, in a team namespace."""
    return {
        "namespaceSelector": TEAM_NAMESPACES,
        "resourceRules": [
            {
                "apiGroups": [group],
                "apiVersions": ["*"],
                "resources": resources,
                "operations": ["CREATE"],
            }
            for group, resources in JOB_RESOURCES.items()
        ],
    }


def queue_policy_spec() -> dict:
    return {
        "failurePolicy": "Fail",
        "matchConstraints": created_jobs(),
        "validations": [
            {
                "expression": QUEUE_RULE,
                "message": f"a job in a team namespace names its team's queue with the label "
                f"{QUEUE_LABEL}: Kueue admits nothing else, and the job would run outside the "
                "team's quota",
                "reason": "Invalid",
            }
        ],
    }


# A job whose pods may be disrupted is drained one node at a time: a drifted GPU node goes once
# it runs no pod that asks not to be (node_pools.py, a budget of one node), a CPU node is
# consolidated away, and an elastic job restarts from its checkpoint at each of them (a
# 16-node job 16 times). The stack's own jobs carry the annotation (workloads/manifests.py
# pod_template, and the training-pod-hygiene policy); so must a team's own, on every replica's
# pods. A TrainJob's pods get it from the platform's ClusterTrainingRuntimes; a runtime patch
# (spec.runtimePatches, strategically merged over the runtime's JobSet spec: kubeflow/trainer
# v2.3.0 pkg/runtime/core/trainingruntime.go, mergeRuntimePatches) could set it to anything
# else on the pod template, and may not. On create only, as the queue rule.
DISRUPT_POLICY = "team-jobs-stay-on-their-nodes"
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"


def kept(metadata: str) -> str:
    """CEL: whether the pod template metadata at `metadata` asks Karpenter not to disrupt."""
    annotations = f"{metadata}.annotations"
    return (
        f"has({metadata}) && has({annotations}) && '{DO_NOT_DISRUPT}' in {annotations} && "
        f"{annotations}['{DO_NOT_DISRUPT}'] == 'true'"
    )


def replicas_kept(kind: str, specs: str) -> str:
    """CEL: every replica's pod template of a `kind` job (`specs`: its replica specs' field)."""
    field = f"object.spec.{specs}"
    return (
        f"object.kind != '{kind}' || (has({field}) && "
        f"{field}.all(r, has({field}[r].template) && {kept(f'{field}[r].template.metadata')}))"
    )


# A TrainJob's runtime patches' pod templates, in CEL (patches_kept, patches_unplaced).
PATCHED_POD = "j.template.spec.template"


def every_patched_pod(condition: str) -> str:
    """CEL: `condition` holds for the pod template (PATCHED_POD) of every runtime patch of a
    TrainJob that has one; other kinds, and patches without pods, pass."""
    return (
        "object.kind != 'TrainJob' || !has(object.spec.runtimePatches) || "
        "object.spec.runtimePatches.all(p, !has(p.trainingRuntimeSpec) || "
        "!has(p.trainingRuntimeSpec.template) || !has(p.trainingRuntimeSpec.template.spec) || "
        "!has(p.trainingRuntimeSpec.template.spec.replicatedJobs) || "
        "p.trainingRuntimeSpec.template.spec.replicatedJobs.all(j, !has(j.template) || "
        f"!has(j.template.spec) || !has({PATCHED_POD}) || {condition}))"
    )


def patches_kept() -> str:
    """CEL: no runtime patch of a TrainJob sets the annotation on its pods to another value."""
    pods = f"{PATCHED_POD}.metadata.annotations"
    return every_patched_pod(
        f"!has({PATCHED_POD}.metadata) || !has({pods}) || "
        f"!('{DO_NOT_DISRUPT}' in {pods}) || {pods}['{DO_NOT_DISRUPT}'] == 'true'"
    )


def disrupt_policy_spec() -> dict:
    why = (
        "without it Karpenter drains the job's nodes one at a time (drift, consolidation) and "
        "the job restarts from its checkpoint once per node"
    )
    replicas = [
        {
            "expression": replicas_kept(kind, specs),
            "message": f"every replica's pod template of a {kind} in a team namespace is "
            f'annotated {DO_NOT_DISRUPT}: "true": {why}',
            "reason": "Invalid",
        }
        # The job kinds whose pod templates a team writes itself.
        for kind, specs in REPLICA_SPEC_KEYS.items()
    ]
    patches = {
        "expression": patches_kept(),
        "message": f'a TrainJob\'s runtimePatches leave {DO_NOT_DISRUPT}: "true", which the '
        f"platform's runtimes set on its pods: {why}",
        "reason": "Invalid",
    }
    return {
        "failurePolicy": "Fail",
        "matchConstraints": created_jobs(),
        "validations": [*replicas, patches],
    }


# Where a team's job runs and how it ranks are the stack's to say, not the job's. `nodeName`
# binds a pod without the scheduler, past every NoSchedule taint, and the kubelet checks only
# NoExecute ones: a job's template naming a machine's node would run there though its team was
# never admitted (Kueue admits it by its queue's flavors, not by nodeName). A priority class
# (any, system-node-critical included, resolves in every namespace) or Kueue's
# WorkloadPriorityClass label would let a team preempt another in a shared ClusterQueue
# (withinClusterQueue: LowerPriority). Kueue at KUEUE_CHART takes a job's priority from that label
# first (pkg/controller/jobframework), else from the job's PriorityClass(): its run policy's
# schedulingPolicy.priorityClass, else its replicas' pod templates' priorityClassName
# (pkg/controller/jobs/kubeflow/kubeflowjob/kubeflowjob_controller.go). All three are refused
# in team namespaces, and in a TrainJob's runtime patches. On create only.
PLACE_POLICY = "team-jobs-keep-their-place"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
PLACED = ("nodeName", "priorityClassName")


def unplaced(spec: str) -> str:
    """CEL: the pod spec at `spec` names no node and no priority class."""
    return " && ".join(f"!has({spec}.{field})" for field in PLACED)


def replicas_unplaced(kind: str, specs: str) -> str:
    field = f"object.spec.{specs}"
    pods = f"{field}[r].template.spec"
    return (
        f"object.kind != '{kind}' || !has({field}) || {field}.all(r, "
        f"!has({field}[r].template) || !has({pods}) || ({unplaced(pods)}))"
    )


def patches_unplaced() -> str:
    pods = f"{PATCHED_POD}.spec"
    return every_patched_pod(f"!has({pods}) || ({unplaced(pods)})")


NO_PRIORITY_LABEL = (
    f"(!has(object.metadata.labels) || !('{PRIORITY_LABEL}' in object.metadata.labels))"
)


def place_policy_spec() -> dict:
    why = (
        "the scheduler places a team's pods by its queue's admission, and every team's work "
        "ranks alike in a shared queue"
    )
    return {
        "failurePolicy": "Fail",
        "matchConstraints": created_jobs(),
        "validations": [
            *(
                {
                    "expression": replicas_unplaced(kind, specs),
                    "message": f"a {kind}'s pod templates in a team namespace name no nodeName "
                    f"and no priorityClassName: {why}",
                    "reason": "Invalid",
                }
                for kind, specs in REPLICA_SPEC_KEYS.items()
            ),
            {
                "expression": "!has(object.spec.runPolicy) || "
                "!has(object.spec.runPolicy.schedulingPolicy) || "
                "!has(object.spec.runPolicy.schedulingPolicy.priorityClass)",
                "message": f"a job in a team namespace sets no runPolicy.schedulingPolicy."
                f"priorityClass: {why}",
                "reason": "Invalid",
            },
            {
                "expression": patches_unplaced(),
                "message": "a TrainJob's runtimePatches set no nodeName and no "
                f"priorityClassName on its pods: {why}",
                "reason": "Invalid",
            },
            {
                "expression": NO_PRIORITY_LABEL,
                "message": f"a job in a team namespace has no {PRIORITY_LABEL} label: {why}",
                "reason": "Invalid",
            },
        ],
    }


# A member may create pods (trainer.fetch's copy pod), and a pod of her own is no job: the job
# policy above does not see it. Kueue's pod integration (on: infra/kueue/kueue.py
# FRAMEWORKS) holds a pod that names a queue behind its scheduling gate until the queue admits
# it, and then adds its flavor's node labels and tolerations (kueue at KUEUE_CHART
# pkg/controller/jobs/pod/pod_webhook.go Default, pod_controller.go prepare); a pod without the
# label it leaves alone, to run at once outside every quota. Nor does it gate a pod whose
# controller owner is a job Kueue manages (jobframework.FindAncestorJobManagedByKueue, where
# "same-namespace ownership spoofing is out of scope"): a member could claim her own admitted
# job as owner. So a member's pod names a queue and no owner; and it may not reach the system
# nodes, which run the platform's controllers alone: no toleration of their taint (nor a
# key-less one, which tolerates every taint), no selection of their label, no nodeName (a pod
# bound to a node skips the scheduler, and with it every NoSchedule taint). Only requests of
# members (their team group): the platform's own pods there (the TensorBoard, on the system
# nodes) come from controllers. On create only: members cannot update pods.
POD_POLICY = "team-member-pods"
((SYSTEM_LABEL, SYSTEM_ROLE),) = SYSTEM_NODE_LABEL.items()
SPEC = "object.spec"
AFFINITY = f"{SPEC}.affinity.nodeAffinity"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def pods_in_team_namespaces(resources: list[str], operation: str) -> dict:
    """A policy's matchConstraints: `operation` on pods (or their `resources` subresources) in
    every team namespace."""
    rules = [{"apiGroups": [""], "apiVersions": ["v1"], "resources": resources,
              "operations": [operation]}]  # fmt: skip
    return {"namespaceSelector": TEAM_NAMESPACES, "resourceRules": rules}


MEMBER_CONDITION = {
    "name": "a-team-member",
    "expression": f"request.userInfo.groups.exists(g, g.startsWith('{TEAM_GROUP_PREFIX}'))",
}


def member_pods_policy_spec() -> dict:
    return {
        "failurePolicy": "Fail",
        "matchConstraints": pods_in_team_namespaces(["pods"], "CREATE"),
        "matchConditions": [MEMBER_CONDITION],
        "variables": [
            {
                "name": "tolerations",
                "expression": f"has({SPEC}.tolerations) ? {SPEC}.tolerations : []",
            },
            {
                "name": "selector",
                "expression": f"has({SPEC}.nodeSelector) ? {SPEC}.nodeSelector : {{}}",
            },
            {
                "name": "terms",
                "expression": f"has({SPEC}.affinity) && has({SPEC}.affinity.nodeAffinity) && "
                f"has({AFFINITY}.{REQUIRED}) ? {AFFINITY}.{REQUIRED}.nodeSelectorTerms : []",
            },
        ],
        "validations": [
            {
                "expression": QUEUE_RULE,
                "message": f"a pod of a team member names the team's queue with the label "
                f"{QUEUE_LABEL}: Kueue holds it until the queue admits it within the team's "
                "quota; without it the pod would run outside every quota",
                "reason": "Invalid",
            },
            {
                "expression": "!has(object.metadata.ownerReferences) || "
                "size(object.metadata.ownerReferences) == 0",
                "message": "a pod of a team member has no owner: Kueue would take it for part "
                "of its owner's admitted job and let it run outside the team's quota",
                "reason": "Invalid",
            },
            {
                "expression": f"!has({SPEC}.priorityClassName) && {NO_PRIORITY_LABEL}",
                "message": "a pod of a team member names no priority class (neither "
                f"priorityClassName nor {PRIORITY_LABEL}): a team's work ranks alike with "
                "every other team's in a shared queue",
                "reason": "Invalid",
            },
            {
                "expression": f"!has({SPEC}.nodeName)",
                "message": "a pod of a team member does not name its node: the scheduler "
                "places it, within the team's quota and off the system nodes",
                "reason": "Invalid",
            },
            {
                "expression": "!variables.tolerations.exists(t, !has(t.key) || t.key == '' || "
                f"t.key == '{SYSTEM_TAINT_KEY}')",
                "message": f"a pod of a team member tolerates neither the system nodes' taint "
                f"{SYSTEM_TAINT_KEY} nor every taint: the system nodes run the platform's "
                "controllers alone",
                "reason": "Invalid",
            },
            {
                "expression": f"!('{SYSTEM_LABEL}' in variables.selector) && "
                "!variables.terms.exists(t, has(t.matchExpressions) && "
                f"t.matchExpressions.exists(e, e.key == '{SYSTEM_LABEL}'))",
                "message": f"a pod of a team member does not select nodes by {SYSTEM_LABEL}: "
                f"the {SYSTEM_ROLE} nodes run the platform's controllers alone",
                "reason": "Invalid",
            },
        ],
    }


EXEC_POLICY = "team-members-run-nothing-on-the-system-nodes"
# A team's TensorBoard is the one pod of a team namespace on the system nodes (it reads what every
# job of the team writes, beside the platform's controllers); its Deployment's pods are named
# `<Deployment>-<hash>-<suffix>`.
SYSTEM_NODE_PODS = f"{TENSORBOARD}-"


def exec_policy_spec() -> dict:
    """Members exec into their own pods (trainer.fetch streams checkpoints out of its copy pod),
    never into the TensorBoard: a shell there would run on the system nodes. A CONNECT request's
    object is the PodExecOptions, not the pod, so the rule goes by the pod's name (the request's
    name). Port-forward, how members reach the TensorBoard, stays allowed."""
    return {
        "failurePolicy": "Fail",
        "matchConstraints": pods_in_team_namespaces(["pods/exec", "pods/attach"], "CONNECT"),
        "matchConditions": [MEMBER_CONDITION],
        "validations": [
            {
                "expression": f"!request.name.startsWith('{SYSTEM_NODE_PODS}')",
                "message": "a team member runs no process in the team's TensorBoard: it runs on "
                "the system nodes, which run the platform's controllers alone (kubectl "
                "port-forward reaches it)",
                "reason": "Forbidden",
            }
        ],
    }


# Policy name -> (resource name suffix, spec).
POLICIES = {
    QUEUE_POLICY: ("queue-label", queue_policy_spec),
    DISRUPT_POLICY: ("do-not-disrupt", disrupt_policy_spec),
    PLACE_POLICY: ("keep-their-place", place_policy_spec),
    POD_POLICY: ("member-pods", member_pods_policy_spec),
    EXEC_POLICY: ("no-exec-on-system-nodes", exec_policy_spec),
}


def team_group(team: TeamConfig) -> str:
    return f"{TEAM_GROUP_PREFIX}{team.name}"


def member_groups(teams: list[TeamConfig]) -> dict[str, list[str]]:
    """Each member principal's team groups, in the order of the teams."""
    groups: dict[str, list[str]] = {}
    for team in teams:
        for arn in team.members:
            groups.setdefault(arn, []).append(team_group(team))
    return groups


class TeamAccess(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        teams: list[TeamConfig],
        namespaces: dict[str, k8s.core.v1.Namespace],  # team name -> its namespace
        cluster: ClusterContext,
        # Principals whose access entry another component makes (DevServer users): it carries
        # their member_groups.
        entries_elsewhere: set[str],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("training-platform:infra:TeamAccess", name, None, opts)
        for policy_name, (suffix, spec) in POLICIES.items():
            policy = k8s.admissionregistration.v1.ValidatingAdmissionPolicy(
                f"{name}-{suffix}",
                metadata={"name": policy_name},
                spec=spec(),
                opts=cluster.in_cluster(self),
            )
            k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding(
                f"{name}-{suffix}",
                metadata={"name": policy_name},
                spec={"policyName": policy_name, "validationActions": ["Deny"]},
                opts=cluster.in_cluster(self, policy),
            )
        runtimes = k8s.rbac.v1.ClusterRole(
            f"{name}-runtimes",
            metadata={"name": RUNTIMES_ROLE},
            rules=RUNTIMES_RULES,
            opts=cluster.in_cluster(self),
        )
        binding(
            k8s.rbac.v1.ClusterRoleBinding,
            f"{name}-runtimes",
            {"name": RUNTIMES_ROLE},
            ("ClusterRole", RUNTIMES_ROLE),
            [group(team_group(team)) for team in teams],
            cluster.in_cluster(self, runtimes),
        )
        for team in teams:
            namespace = namespaces[team.name]
            metadata = {"name": ROLE, "namespace": namespace.metadata.name}
            role = k8s.rbac.v1.Role(
                f"{name}-{team.name}",
                metadata=metadata,
                rules=MEMBER_RULES,
                opts=cluster.in_cluster(self, namespace),
            )
            binding(
                k8s.rbac.v1.RoleBinding,
                f"{name}-{team.name}",
                metadata,
                ("Role", ROLE),
                [group(team_group(team))],
                cluster.in_cluster(self, namespace, role),
            )
        for arn, groups in member_groups(teams).items():
            if arn in entries_elsewhere:
                continue
            aws.eks.AccessEntry(
                f"{name}-{principal_name(arn)}",
                cluster_name=cluster.name,
                principal_arn=arn,
                kubernetes_groups=groups,
                type="STANDARD",
                tags=cluster.tags,
                opts=pulumi.ResourceOptions(parent=self),
            )
        self.register_outputs({})


def principal_name(arn: str) -> str:
    """A resource name for a principal's entry that stays as members come and go: its account,
    kind and name (IAM names are unique per account and kind, whatever the path)."""
    account, resource = arn.split(":")[4:6]
    kind, _, path = resource.partition("/")
    return f"{account}-{kind}-{path.rsplit('/', 1)[-1]}"
