"""TeamAccess: what a team's members may do in its namespace, and their way into the cluster.

Each team's namespace gets the Role `team-member`, bound to the group team:<team>: its members
submit, watch and delete their jobs, read what tells them how the jobs fare, reach the team's
TensorBoard, and fetch checkpoints from its shared file systems (trainer.fetch). Outside the
namespace they read only the platform's ClusterTrainingRuntimes (RUNTIMES_ROLE), beside what
every authenticated user has (discovery, the Trainer's public ConfigMap). A job
they create must name a queue (QUEUE_POLICY), or Kueue would not hold it.

Each member principal gets one EKS access entry (type STANDARD, no access policy: its rights are
this RBAC and nothing more) mapping it to the groups of every team it is a member of. EKS keeps
one entry per principal, so a member who is also a DevServer user keeps the entry DevServers
gives her, with her team groups added (member_groups).
"""

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from infra.components.context import ClusterContext
from infra.components.queues import TEAM_LABEL
from infra.components.rbac import CONNECT, READ, binding, group, rule
from infra.config import TeamConfig

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
    rule(["events.k8s.io"], ["events"], READ),
]


# Kueue holds only jobs that name a queue (its Configuration's manageJobsWithoutQueueName is
# off): one created without the label would run at once, outside the team's quota. RBAC cannot
# ask for a label; a ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1, GA in
# Kubernetes 1.30) refuses such a job in every team namespace (TEAM_LABEL: the teams' and their
# DevServer users'), whoever creates it. On create only: members cannot update a job, and an
# operator updating an older unlabelled job (its finalizers, on delete) must not be refused.
QUEUE_POLICY = "team-jobs-name-a-queue"
QUEUE_RULE = f"has(object.metadata.labels) && '{QUEUE_LABEL}' in object.metadata.labels"


def queue_policy_spec() -> dict:
    return {
        "failurePolicy": "Fail",
        "matchConstraints": {
            "namespaceSelector": {"matchExpressions": [{"key": TEAM_LABEL, "operator": "Exists"}]},
            "resourceRules": [
                {
                    "apiGroups": [group],
                    "apiVersions": ["*"],
                    "resources": resources,
                    "operations": ["CREATE"],
                }
                for group, resources in JOB_RESOURCES.items()
            ],
        },
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


def team_group(team: TeamConfig) -> str:
    return f"team:{team.name}"


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
        policy = k8s.admissionregistration.v1.ValidatingAdmissionPolicy(
            f"{name}-queue-label",
            metadata={"name": QUEUE_POLICY},
            spec=queue_policy_spec(),
            opts=cluster.in_cluster(self),
        )
        k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding(
            f"{name}-queue-label",
            metadata={"name": QUEUE_POLICY},
            spec={"policyName": QUEUE_POLICY, "validationActions": ["Deny"]},
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
