"""Teams have members: their stack config, their EKS access entries, and what the team's Role
lets them do, checked for real through the local Kubernetes API (tests.kube_api), which
authorizes every request with the dev plan's RBAC and Kubernetes' own verb mapping."""

import copy
import json
import re

import pytest
import yaml
from kubernetes import client, dynamic
from kubernetes.dynamic.exceptions import ForbiddenError

from infra.core.nodes import POOL_LABEL
from infra.core.tests.admission_rules import refusals
from infra.core.tests.crd_schema import CRD_DIR, conformance_errors
from infra.kueue.config import TeamConfig
from infra.kueue.queues import TEAM_LABEL
from infra.kueue.tests.kueue_rules import WORKLOAD_VERSION
from infra.operators.tests.job_crds import example_job, job_crds
from infra.stack.tests.test_config import error_for
from infra.teams.access import (
    DISRUPT_POLICY,
    DO_NOT_DISRUPT,
    EXEC_POLICY,
    PLACE_POLICY,
    POD_POLICY,
    PRIORITY_LABEL,
    QUEUE_LABEL,
    QUEUE_POLICY,
    QUEUE_RULE,
    member_groups,
)
from tests.kube_api import ADMIN, admission_policies, from_plan, user
from tests.plugin import ROOT, plan_of, stack_values
from trainer.cluster_copy import copy_pod

ACCESS_ENTRY = "aws:eks/accessEntry:AccessEntry"
SSO = (
    "arn:aws:iam::123456789012:role/aws-reserved/sso.amazonaws.com/us-west-2/"
    "AWSReservedSSO_MLEngineer_0123456789abcdef"
)
IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/tp-dev/trainer@sha256:" + "a" * 64
PYTORCHJOB = ("kubeflow.org/v1", "PyTorchJob")
RUNTIME = "kubernetes:trainer.kubeflow.org/v1alpha1:ClusterTrainingRuntime"


def teams_with(*members: list[str]) -> dict:
    return {"teams": [{"name": f"t{i}", "members": m} for i, m in enumerate(members)]}


@pytest.mark.parametrize(
    "arn",
    [
        SSO,
        # An Identity Center instance in us-east-1 leaves the region out of the path.
        "arn:aws:iam::123456789012:role/aws-reserved/sso.amazonaws.com/AWSReservedSSO_ML_0a1b2c",
        "arn:aws:iam::123456789012:role/ml/engineers",
        "arn:aws:iam::123456789012:user/bob",
        "arn:aws-us-gov:iam::123456789012:role/ml",
    ],
)
def test_members_are_iam_roles_or_users_identity_center_roles_with_their_path(arn):
    assert TeamConfig.model_validate({"name": "a", "members": [arn]}).members == [arn]


@pytest.mark.parametrize(
    ("members", "key", "allowed"),
    [
        (
            ["arn:aws:sts::123456789012:assumed-role/AWSReservedSSO_ML_0a1b2c/alice"],
            "queues.teams[t0].members[0]",
            "(not an arn:aws:sts::...:assumed-role/... session)",
        ),
        ([SSO, SSO], "queues.teams[t0]", "allowed: each ARN once"),
        (
            ["arn:aws:iam::123456789012:role/platform-admins"],
            "queues.teams[t0].members[0]",
            "allowed: a principal that is not a cluster admin",
        ),
    ],
)
def test_a_bad_member_is_named_with_what_is_allowed(members, key, allowed):
    message = error_for(queues=teams_with(members))
    assert f"training-platform:{key}:" in message and allowed in message, message


def test_a_principal_in_several_teams_gets_every_teams_group():
    other = "arn:aws:iam::123456789012:user/bob"
    teams = [TeamConfig(name=n, members=m) for n, m in (("a", [SSO]), ("b", [other, SSO]))]
    assert member_groups(teams) == {SSO: ["team:a", "team:b"], other: ["team:b"]}


def test_each_principal_has_one_access_entry_without_access_policy(stack_plan):
    """EKS refuses a second entry for a principal: a member who is also a DevServer user gets
    her team's group on the entry DevServers makes."""
    entries = stack_plan.of_type(ACCESS_ENTRY)
    principals = [e.inputs["principalArn"] for e in entries]
    assert len(principals) == len(set(principals))
    members = [e for e in entries if e.name.startswith("team-access-")]
    for entry in members:
        assert entry.inputs["type"] == "STANDARD"
        assert all(g.startswith("team:") for g in entry.inputs["kubernetesGroups"])
    associations = stack_plan.of_type("aws:eks/accessPolicyAssociation:AccessPolicyAssociation")
    assert not {a.inputs["principalArn"] for a in associations} & {
        e.inputs["principalArn"] for e in members
    }


def test_the_dev_stacks_members_map_to_their_teams(dev_plan):
    groups = {
        e.inputs["principalArn"]: e.inputs.get("kubernetesGroups")
        for e in dev_plan.of_type(ACCESS_ENTRY)
    }
    assert groups[SSO] == ["team:team-a"]
    assert groups["arn:aws:iam::123456789012:role/research-ml"] == ["team:research"]
    # alice: DevServer user and team-a member, one entry.
    assert groups["arn:aws:iam::123456789012:role/dev-alice"] == [
        "dev:alice",
        "dev:users",
        "team:team-a",
    ]


def test_no_team_group_is_bound_outside_its_namespace(stack_plan):
    rbac = "kubernetes:rbac.authorization.k8s.io/v1"
    # Cluster-wide, team groups are bound to reading the ClusterTrainingRuntimes and nothing else.
    cluster_roles = {
        r.inputs["metadata"]["name"]: r.inputs for r in stack_plan.of_type(f"{rbac}:ClusterRole")
    }
    for binding in stack_plan.of_type(f"{rbac}:ClusterRoleBinding"):
        if any(s["name"].startswith("team:") for s in binding.inputs["subjects"]):
            assert cluster_roles[binding.inputs["roleRef"]["name"]]["rules"] == [
                {
                    "apiGroups": ["trainer.kubeflow.org"],
                    "resources": ["clustertrainingruntimes"],
                    "verbs": ["get", "list", "watch"],
                }
            ]
    teams = {
        t["name"]: t.get("namespace", t["name"])
        for t in stack_values(stack_plan.stack)["training-platform:queues"]["teams"]
    }
    bound = {
        (b.inputs["metadata"]["namespace"], s["name"])
        for b in stack_plan.of_type(f"{rbac}:RoleBinding")
        for s in b.inputs["subjects"]
        if s["name"].startswith("team:")
    }
    assert bound == {(ns, f"team:{team}") for team, ns in teams.items()}
    # A member's pod may run as any ServiceAccount of her namespace: none of them is bound to
    # anything, so her pods reach the API with no more than her own rights (their AWS roles are
    # the jobs' and TensorBoard's, by Pod Identity).
    accounts = [
        (b.inputs["metadata"].get("namespace"), s)
        for kind in ("RoleBinding", "ClusterRoleBinding")
        for b in stack_plan.of_type(f"{rbac}:{kind}")
        for s in b.inputs["subjects"]
        if s["kind"] == "ServiceAccount"
    ]
    assert accounts and not [a for a in accounts if a[1].get("namespace") in teams.values()]


READ, JOBS = ["get", "list", "watch"], ["get", "list", "watch", "create", "delete"]
# The whole of what a member may do in her team's namespace, written out: a right added to the
# Role (a service account token, config maps, claims...) fails the test below until it is here
# and in the docs' table.
MEMBER_RULES = [
    {"apiGroups": ["kubeflow.org"], "resources": ["pytorchjobs", "mpijobs"], "verbs": JOBS},
    {"apiGroups": ["trainer.kubeflow.org"], "resources": ["trainjobs"], "verbs": JOBS},
    {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads", "localqueues"], "verbs": READ},
    {"apiGroups": ["trainer.kubeflow.org"], "resources": ["trainingruntimes"], "verbs": READ},
    {"apiGroups": [""], "resources": ["pods"], "verbs": JOBS},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["pods/exec", "pods/portforward"], "verbs": ["get", "create"]},
    {"apiGroups": [""], "resources": ["events", "services"], "verbs": READ},
    # The usage recorder's records of the team's jobs (infra/billing/usage_recorder.py).
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": READ},
    {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": READ},
]
SECURITY_PAGE = ROOT / "docs" / "platform" / "security-and-tenancy.md"


def documented_member_rules() -> list[dict]:
    """The rows of the docs' table of the Role (API group, resources, verbs), as rules."""
    lines = SECURITY_PAGE.read_text().splitlines()
    start = lines.index("| API group | resources | verbs | for |") + 2
    rules = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        group, resources, verbs = (cell.strip() for cell in line.strip("|").split("|")[:3])
        rules.append(
            {
                "apiGroups": ["" if group == "core" else group.strip("`")],
                "resources": [r.strip(" `") for r in resources.split(",")],
                "verbs": [v.strip() for v in verbs.split(",")],
            }
        )
    return rules


def test_a_members_role_is_exactly_the_documented_table(stack_plan):
    roles = [
        r.inputs
        for r in stack_plan.of_type("kubernetes:rbac.authorization.k8s.io/v1:Role")
        if r.inputs["metadata"]["name"] == "team-member"
    ]
    assert roles and all(role["rules"] == MEMBER_RULES for role in roles)
    assert documented_member_rules() == MEMBER_RULES


def test_the_example_job_conforms_to_the_pytorchjob_crd():
    job = example_job("team-a", IMAGE)
    assert conformance_errors({**job, "metadata": {**job["metadata"], "namespace": "t"}}) == []
    assert (CRD_DIR / "training-operator" / "kubeflow.org_pytorchjobs.yaml").exists()


def node_selections(value) -> list[tuple[str, str | None]]:
    """(label, value) of every nodeSelector entry and node affinity expression in a manifest or
    a YAML fragment (value None: an Exists or DoesNotExist expression)."""
    found = []
    if isinstance(value, list):
        for item in value:
            found += node_selections(item)
    elif isinstance(value, dict):
        for key, item in value.items():
            if key == "nodeSelector" and isinstance(item, dict):
                found += [(label, str(v)) for label, v in item.items()]
            elif key == "matchExpressions" and isinstance(item, list):
                found += [(e["key"], v) for e in item for v in e.get("values") or [None]]
            else:
                found += node_selections(item)
    return found


def yaml_blocks(page) -> list:
    """The fenced YAML blocks of a Markdown page, parsed."""
    blocks = re.findall(r"^```ya?ml\n(.*?)^```", page.read_text(), re.M | re.S)
    return [yaml.safe_load(block) for block in blocks]


def test_the_examples_and_user_docs_select_only_labels_node_pools_set(dev_plan):
    """A job selecting a label no node carries never runs: every node label the examples and
    the users' docs select is one a NodePool of the dev stack puts on its nodes (its template's
    labels, or a value its requirements allow, which Karpenter labels the node with)."""
    import yaml

    labelled = set()
    for pool in dev_plan.of_type("kubernetes:karpenter.sh/v1:NodePool"):
        template = pool.inputs["spec"]["template"]
        labelled |= set(template["metadata"]["labels"].items())
        for requirement in template["spec"]["requirements"]:
            labelled |= {(requirement["key"], v) for v in requirement.get("values", [])}
            labelled.add((requirement["key"], None))
    documents = [yaml.safe_load(p.read_text()) for p in sorted((ROOT / "examples").glob("*.yaml"))]
    documents += [b for p in sorted((ROOT / "docs/users").glob("*.md")) for b in yaml_blocks(p)]
    selected = node_selections(documents)
    assert [s for s in selected if s not in labelled] == []
    assert ("training-platform.node-restriction.kubernetes.io/pool", "cpu") in selected
    # What the check would have caught: the label pools were selected by before.
    assert ("training-platform/pool", "cpu") not in labelled


@pytest.fixture(scope="module")
def cluster(dev_plan, tmp_path_factory):
    """The dev plan on the local API, with the job kinds served (infra.operators.tests.job_crds)
    and Kueue's queues; no kubelet: the test writes pods' status itself."""
    kueue = [
        _crd(f"kueue/kueue.x-k8s.io_{plural}.yaml") for plural in ("localqueues", "clusterqueues")
    ]
    api = from_plan(dev_plan, crds=[*job_crds(), *kueue])
    api.runtime = None
    entries = {
        e.inputs["principalArn"]: e.inputs.get("kubernetesGroups")
        for e in dev_plan.of_type(ACCESS_ENTRY)
    }
    api.member = user(SSO, entries[SSO])  # as EKS maps the access entry
    api.policies = admission_policies(dev_plan)
    yield api
    api.stop()


def _crd(path: str) -> dict:
    return yaml.safe_load((CRD_DIR / path).read_text())


def clients(api, who):
    token = api.add_token(who)
    configuration = client.Configuration()
    configuration.host, configuration.api_key = api.url, {"authorization": f"Bearer {token}"}
    api_client = client.ApiClient(configuration)
    return dynamic.DynamicClient(api_client), client.CoreV1Api(api_client)


def running_pod(api, namespace: str, name: str, labels: dict, log: str) -> None:
    """A pod as its operator and kubelet would leave it, running and having logged `log`."""
    pods = next(k for k in api.kinds.values() if k.plural == "pods")
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"containers": [{"name": "pytorch", "image": IMAGE}]},
    }
    created = api.call(api.create, pods, namespace, pod)
    run = f"containerd://{name}"
    status = {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True"}],
        "containerStatuses": [
            {
                "name": "pytorch",
                "containerID": run,
                "ready": True,
                "restartCount": 0,
                "state": {"running": {}},
                "image": IMAGE,
                "imageID": "",
                "started": True,
            }
        ],
    }
    api.call(api.replace, pods, created, {**created, "status": status})
    api.container_logs[run] = log


def test_a_member_runs_her_job_in_her_teams_namespace_and_nothing_beyond(cluster):
    api = cluster
    member, core = clients(api, api.member)
    admin, _ = clients(api, ADMIN)
    jobs = member.resources.get(api_version=PYTORCHJOB[0], kind=PYTORCHJOB[1])

    # Submit the example, see it listed and watched.
    job = example_job("team-a", IMAGE)
    created = jobs.create(body=job, namespace="team-a")
    # The stack's own jobs of team-a are there too (the plan's).
    assert [j.metadata.name for j in jobs.get(namespace="team-a").items] == [
        "gpt-small",
        "hello-trainer",
        "smoke-cpu",
    ]
    watched = {e["object"].metadata.name for e in jobs.watch(namespace="team-a", timeout=3)}
    assert "hello-trainer" in watched

    # Its pods, their logs and events, its Kueue Workload and the team's queue: readable.
    labels = {"training.kubeflow.org/job-name": "hello-trainer"}
    running_pod(api, "team-a", "hello-trainer-worker-0", labels, '{"event": "start"}\n')
    log = core.read_namespaced_pod_log("hello-trainer-worker-0", "team-a", _preload_content=False)
    assert log.data == b'{"event": "start"}\n'
    events = admin.resources.get(api_version="v1", kind="Event")
    events.create(
        namespace="team-a",
        body={
            "metadata": {"name": "hello-trainer.1"},
            "involvedObject": {
                "kind": "PyTorchJob",
                "name": "hello-trainer",
                "namespace": "team-a",
                "uid": created.metadata.uid,
            },
            "reason": "Suspended",
            "message": "Kueue suspended the job",
            "type": "Normal",
        },
    )
    assert [e.reason for e in core.list_namespaced_event("team-a").items] == ["Suspended"]
    workloads = admin.resources.get(
        api_version=f"kueue.x-k8s.io/{WORKLOAD_VERSION}", kind="Workload"
    )
    workloads.create(namespace="team-a", body={"metadata": {"name": "pytorchjob-hello-trainer"}})
    mine = member.resources.get(api_version=f"kueue.x-k8s.io/{WORKLOAD_VERSION}", kind="Workload")
    assert [w.metadata.name for w in mine.get(namespace="team-a").items] == [
        "pytorchjob-hello-trainer"
    ]
    queues = member.resources.get(api_version="kueue.x-k8s.io/v1beta2", kind="LocalQueue")
    assert [q.metadata.name for q in queues.get(namespace="team-a").items] == ["team-a"]
    # TrainJobs and MPIJobs alike.
    trainjobs = member.resources.get(api_version="trainer.kubeflow.org/v1alpha1", kind="TrainJob")
    queued = {"name": "t", "labels": {QUEUE_LABEL: "team-a"}}
    trainjobs.create(namespace="team-a", body={"metadata": queued, "spec": {}})
    trainjobs.delete(name="t", namespace="team-a")
    assert api.refusals == []

    # Nothing else: not her job's spec once submitted, not the namespace's secrets, not another
    # team's namespace, nothing cluster-scoped.
    refused = [
        lambda: jobs.patch(
            name="hello-trainer",
            namespace="team-a",
            body={"metadata": {"labels": {"kueue.x-k8s.io/queue-name": "x"}}},
            content_type="application/merge-patch+json",
        ),
        lambda: core.list_namespaced_secret("team-a"),
        lambda: jobs.create(body=job, namespace="research"),
        lambda: jobs.get(namespace="research"),
        lambda: core.list_namespaced_pod("research"),
        lambda: mine.get(namespace="research"),
        lambda: jobs.get(),  # every namespace's
        lambda: core.list_node(),
        lambda: core.list_namespace(),
        lambda: core.create_namespace({"metadata": {"name": "mine"}}),
        lambda: member.resources.get(
            api_version="kueue.x-k8s.io/v1beta2", kind="ClusterQueue"
        ).get(),
    ]
    for call in refused:
        with pytest.raises((ForbiddenError, client.ApiException)) as caught:
            call()
        assert caught.value.status == 403
    assert len(api.refusals) == len(refused)
    assert api.refusals[2] == (
        f'pytorchjobs.kubeflow.org is forbidden: User "{SSO}" cannot create resource '
        '"pytorchjobs" in API group "kubeflow.org" in the namespace "research"'
    )
    api.refusals.clear()

    jobs.delete(name="hello-trainer", namespace="team-a")
    assert "hello-trainer" not in {j.metadata.name for j in jobs.get(namespace="team-a").items}
    assert api.refusals == []


def test_a_job_without_its_queue_label_is_refused_in_every_team_namespace(dev_plan):
    """Kueue would not hold it (manageJobsWithoutQueueName is off): the plan's admission policy
    refuses it on create, for every job kind the team Role lets members create, in every
    namespace a team's jobs or DevServers live in. Its CEL rule is evaluated with cel-python."""
    import kubernetes_validate

    admission = "kubernetes:admissionregistration.k8s.io/v1"
    policies = {p.inputs["metadata"]["name"]: p.inputs for p in dev_plan.of_type(
        f"{admission}:ValidatingAdmissionPolicy")}  # fmt: skip
    bindings = {b.inputs["metadata"]["name"]: b.inputs for b in dev_plan.of_type(
        f"{admission}:ValidatingAdmissionPolicyBinding")}  # fmt: skip
    assert (
        set(policies)
        == set(bindings)
        == {QUEUE_POLICY, DISRUPT_POLICY, POD_POLICY, PLACE_POLICY, EXEC_POLICY}
    )
    for name, policy in policies.items():
        for manifest, kind in (
            (policy, "ValidatingAdmissionPolicy"),
            (bindings[name], "ValidatingAdmissionPolicyBinding"),
        ):
            kubernetes_validate.validate(
                {**manifest, "apiVersion": "admissionregistration.k8s.io/v1", "kind": kind},
                "1.34",
                strict=True,
            )
        assert bindings[name]["spec"] == {"policyName": name, "validationActions": ["Deny"]}

    policy = policies[QUEUE_POLICY]["spec"]
    job = example_job("team-a", IMAGE)
    unlabelled = {**job, "metadata": {"name": "x"}}
    relabelled = {**job, "metadata": {"name": "x", "labels": {"app": "x"}}}
    verdicts = [refusals(policy, "CREATE", j) for j in (job, unlabelled, relabelled)]
    assert verdicts == [[], [policy["validations"][0]["message"]]] + [
        [policy["validations"][0]["message"]]
    ]

    # Every resource a member may create needs the queue label on create: jobs by this policy,
    # pods by the member pods' policy.
    queued = [policies[QUEUE_POLICY], policies[POD_POLICY]]
    matched = {
        (group, resource)
        for p in queued
        for r in p["spec"]["matchConstraints"]["resourceRules"]
        if r["operations"] == ["CREATE"]
        for group in r["apiGroups"]
        for resource in r["resources"]
    }
    creatable = {
        (group, resource)
        for r in MEMBER_RULES
        if "create" in r["verbs"] and "/" not in r["resources"][0]  # not exec, port-forward
        for group in r["apiGroups"]
        for resource in r["resources"]
    }
    assert matched == creatable
    assert all(QUEUE_RULE in [v["expression"] for v in p["spec"]["validations"]]
               for p in queued)  # fmt: skip
    namespaces = [n.inputs["metadata"] for n in dev_plan.of_type("kubernetes:core/v1:Namespace")]
    for p in policies.values():
        (selector,) = p["spec"]["matchConstraints"]["namespaceSelector"]["matchExpressions"]
        labelled = {n["name"] for n in namespaces if selector["key"] in (n.get("labels") or {})}
        assert selector["operator"] == "Exists"
        assert labelled == {"team-a", "research", "dev-alice", "dev-bob"}


def annotated(job: dict, value: str | None, replica: str = "Worker", specs="pytorchReplicaSpecs"):
    """`job` with the annotation of one replica's pod template set to `value` (None: left out)."""
    changed = copy.deepcopy(job)
    metadata = changed["spec"][specs][replica]["template"].setdefault("metadata", {})
    annotations = metadata.setdefault("annotations", {})
    annotations.pop(DO_NOT_DISRUPT, None)
    if value is not None:
        annotations[DO_NOT_DISRUPT] = value
    return changed


def patched(trainjob: dict, annotations: dict) -> dict:
    """`trainjob` with a runtime patch of its own setting `annotations` on the node pods."""
    pods = {"template": {"metadata": {"annotations": annotations}}}
    patch = {"replicatedJobs": [{"name": "node", "template": {"spec": pods}}]}
    runtime = {"manager": "me", "trainingRuntimeSpec": {"template": {"spec": patch}}}
    return {**trainjob, "spec": {**trainjob["spec"], "runtimePatches": [runtime]}}


def test_a_teams_jobs_keep_karpenter_from_draining_their_nodes(dev_plan):
    """Without karpenter.sh/do-not-disrupt on every replica's pods, a drifted or consolidated
    job loses its nodes one at a time. The policy's CEL with cel-python, on what the examples,
    the stack and a member may submit."""
    from workloads.tests.test_trainjob import with_trainjob

    policy = admission_policies(dev_plan)[DISRUPT_POLICY]
    job = example_job("team-a", IMAGE)
    stack = plan_of("dev", jobs=with_trainjob())
    mpi = dev_plan.one("kubernetes:kubeflow.org/v2beta1:MPIJob").inputs
    trainjob = yaml.safe_load((ROOT / "examples" / "trainjob.yaml").read_text())
    admitted = [
        job,
        *(j.inputs for j in dev_plan.of_type("kubernetes:kubeflow.org/v1:PyTorchJob")),
        mpi,
        trainjob,
        stack.one("kubernetes:trainer.kubeflow.org/v1alpha1:TrainJob").inputs,
        patched(trainjob, {DO_NOT_DISRUPT: "true", "team": "a"}),
    ]
    for obj in admitted:
        assert refusals(policy, "CREATE", obj, namespace=TEAM_A) == [], obj["metadata"]["name"]
    master = copy.deepcopy(job)
    master["spec"]["pytorchReplicaSpecs"]["Master"] = copy.deepcopy(
        annotated(job, None)["spec"]["pytorchReplicaSpecs"]["Worker"]
    )
    refused = {
        "PyTorchJob": [annotated(job, None), annotated(job, "false"), master],
        "MPIJob": [annotated(mpi, None, "Launcher", "mpiReplicaSpecs")],
        "TrainJob": [
            patched(trainjob, {DO_NOT_DISRUPT: "false"}),
            patched(trainjob, {DO_NOT_DISRUPT: ""}),
        ],  # fmt: skip
    }
    for kind, objs in refused.items():
        for obj in objs:
            (message,) = refusals(policy, "CREATE", obj, namespace=TEAM_A)
            assert message.startswith((f"every replica's pod template of a {kind} ",
                                       f"a {kind}'s runtimePatches leave")), message  # fmt: skip
            assert "one at a time" in message
    # A TrainJob's pods get the annotation from its runtime: every one of the platform's.
    for runtime in dev_plan.of_type(RUNTIME):
        for replicated in runtime.inputs["spec"]["template"]["spec"]["replicatedJobs"]:
            pods = replicated["template"]["spec"]["template"]["metadata"]
            assert pods["annotations"][DO_NOT_DISRUPT] == "true"


def with_pod_spec(job: dict, replica: str, specs: str, **fields) -> dict:
    changed = copy.deepcopy(job)
    changed["spec"][specs][replica]["template"]["spec"].update(fields)
    return changed


def patched_spec(trainjob: dict, **fields) -> dict:
    """`trainjob` with a runtime patch of its own setting `fields` on the node pods' spec."""
    pods = {"template": {"spec": fields}}
    patch = {"replicatedJobs": [{"name": "node", "template": {"spec": pods}}]}
    runtime = {"manager": "me", "trainingRuntimeSpec": {"template": {"spec": patch}}}
    return {**trainjob, "spec": {**trainjob["spec"], "runtimePatches": [runtime]}}


def test_a_teams_job_names_no_node_and_no_priority(dev_plan):
    """A job's template naming a machine's node would run there past its taints, unadmitted; a
    priority class or Kueue's priority label would preempt other teams in a shared queue. Each
    way, per job kind, is refused; what the stack, the examples, devctl submit and the SDK
    write is admitted."""
    from tests.integration.test_user_code import rendered
    from workloads.tests.test_trainjob import with_trainjob

    policy = admission_policies(dev_plan)[PLACE_POLICY]
    job = example_job("team-a", IMAGE)
    mpi = dev_plan.one("kubernetes:kubeflow.org/v2beta1:MPIJob").inputs
    trainjob = yaml.safe_load((ROOT / "examples" / "trainjob.yaml").read_text())
    stack = plan_of("dev", jobs=with_trainjob())
    admitted = [
        job, mpi, trainjob, rendered("--name", "cnn"), rendered("--name", "cnn", "--nodes", "1:2"),
        *(j.inputs for j in dev_plan.of_type("kubernetes:kubeflow.org/v1:PyTorchJob")),
        stack.one("kubernetes:trainer.kubeflow.org/v1alpha1:TrainJob").inputs,
        patched(trainjob, {DO_NOT_DISRUPT: "true"}),
    ]  # fmt: skip
    for obj in admitted:
        assert refusals(policy, "CREATE", obj, namespace=TEAM_A) == [], obj["metadata"]["name"]
    machine = "mi-0123456789abcdef0"
    priority = "system-node-critical"
    labelled = copy.deepcopy(job)
    labelled["metadata"]["labels"][PRIORITY_LABEL] = "high"
    run_policy = copy.deepcopy(job)
    run_policy["spec"].setdefault("runPolicy", {})["schedulingPolicy"] = {"priorityClass": priority}
    refused = [
        with_pod_spec(job, "Worker", "pytorchReplicaSpecs", nodeName=machine),
        with_pod_spec(job, "Worker", "pytorchReplicaSpecs", priorityClassName=priority),
        with_pod_spec(mpi, "Launcher", "mpiReplicaSpecs", nodeName=machine),
        with_pod_spec(mpi, "Worker", "mpiReplicaSpecs", priorityClassName=priority),
        patched_spec(trainjob, nodeName=machine),
        patched_spec(trainjob, priorityClassName=priority),
        labelled,
        run_policy,
    ]
    for obj in refused:
        (message,) = refusals(policy, "CREATE", obj, namespace=TEAM_A)
        assert "every team's work ranks alike" in message


def test_a_members_pod_names_no_priority(dev_plan):
    policy = admission_policies(dev_plan)[POD_POLICY]
    assert refusals(policy, "CREATE", member_pod(), namespace=TEAM_A, **MEMBER) == []
    high = member_pod(priorityClassName="system-node-critical")
    labelled = member_pod()
    labelled["metadata"]["labels"][PRIORITY_LABEL] = "high"
    for pod in (high, labelled):
        (message,) = refusals(policy, "CREATE", pod, namespace=TEAM_A, **MEMBER)
        assert message.startswith("a pod of a team member names no priority class")


TEAM_A = {"metadata": {"name": "team-a", "labels": {TEAM_LABEL: "team-a"}}}
MEMBER = {"username": SSO, "groups": ("team:team-a", "system:authenticated")}
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Equal", "value": "true",
                  "effect": "NoSchedule"}  # fmt: skip


def member_pod(**spec) -> dict:
    """A pod a member writes: in her team's queue, selecting a GPU pool, unless `spec` says
    otherwise."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "mine", "namespace": "team-a", "labels": {QUEUE_LABEL: "team-a"}},
        "spec": {
            "nodeSelector": {POOL_LABEL: "gpu-small"},
            "tolerations": [GPU_TOLERATION],
            "containers": [{"name": "c", "image": IMAGE}],
            **spec,
        },
    }


SYSTEM_ROLE = {"key": "training-platform/node-role", "operator": "In", "values": ["system"]}
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
SYSTEM_AFFINITY = {
    "nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": [SYSTEM_ROLE]}]}}
}
# Her own admitted job as the pod's controller: Kueue would not gate the pod.
OWNER = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "hello-trainer",
         "uid": "0", "controller": True}  # fmt: skip
OWNED = {**member_pod(), "metadata": {**member_pod()["metadata"], "ownerReferences": [OWNER]}}
UNQUEUED = {**member_pod(), "metadata": {"name": "mine", "namespace": "team-a"}}
SYSTEM_EQUAL = {"key": "CriticalAddonsOnly", "value": "true", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    ("pod", "refused"),
    [
        (member_pod(), None),
        (copy_pod("team-a", "/efs/checkpoints/job", IMAGE, "team-a"), None),
        (UNQUEUED, "queue"),
        (member_pod(tolerations=[{"key": "CriticalAddonsOnly", "operator": "Exists"}]), "taint"),
        (member_pod(tolerations=[SYSTEM_EQUAL]), "taint"),
        (member_pod(tolerations=[{"operator": "Exists"}]), "taint"),  # every taint
        (member_pod(nodeSelector={"training-platform/node-role": "system"}), "select"),
        (member_pod(affinity=SYSTEM_AFFINITY), "select"),
        (member_pod(nodeName="ip-10-20-1-1.us-west-2.compute.internal"), "node"),
        (OWNED, "owner"),
    ],
    ids=[
        "gpu-pod",
        "copy-pod",
        "no-queue",
        "system-exists",
        "system-equal",
        "any-taint",
        "system-selector",
        "system-affinity",
        "node-name",
        "owned",
    ],
)
def test_a_members_own_pod_names_her_queue_and_keeps_off_the_system_nodes(dev_plan, pod, refused):
    """Kueue's pod integration holds only pods that name a queue, and not those owned by a job
    it manages; the system nodes are the controllers'. The policy's CEL with cel-python."""
    policy = admission_policies(dev_plan)[POD_POLICY]
    found = refusals(policy, "CREATE", pod, namespace=TEAM_A, resource=("", "pods"), **MEMBER)
    words = {"queue": "names the team's queue", "taint": "tolerates neither", "node": "name its "
             "node", "select": "select nodes by", "owner": "has no owner"}  # fmt: skip
    assert found == [] if refused is None else len(found) == 1 and words[refused] in found[0]
    # The platform's own pods there come from controllers (the TensorBoard's ReplicaSet): not
    # a member's request, not this policy's.
    controller = "system:serviceaccount:kube-system:replicaset-controller"
    assert refusals(policy, "CREATE", pod, username=controller, namespace=TEAM_A,
                    resource=("", "pods")) is None  # fmt: skip


def test_the_api_refuses_a_members_pod_outside_her_queue_and_a_job_that_may_be_drained(cluster):
    """The same policies, enforced by the local API on the member's own requests: a one-line
    refusal the client shows as the API server words it."""
    api = cluster
    member, core = clients(api, api.member)
    with pytest.raises(client.ApiException) as caught:
        core.create_namespaced_pod("team-a", {**member_pod(), "metadata": {"name": "bare"}})
    message = json.loads(caught.value.body)["message"]
    assert caught.value.status == 422 and message.startswith(
        "pods \"bare\" is forbidden: ValidatingAdmissionPolicy 'team-member-pods' with binding "
        "'team-member-pods' denied request: a pod of a team member names the team's queue"
    )
    created = core.create_namespaced_pod("team-a", member_pod())
    core.delete_namespaced_pod(created.metadata.name, "team-a")

    jobs = member.resources.get(api_version=PYTORCHJOB[0], kind=PYTORCHJOB[1])
    with pytest.raises(client.ApiException) as caught:
        jobs.create(body=annotated(example_job("team-a", IMAGE), None), namespace="team-a")
    assert caught.value.status == 422 and json.loads(caught.value.body)["message"].startswith(
        'pytorchjobs.kubeflow.org "hello-trainer" is forbidden: ValidatingAdmissionPolicy '
        "'team-jobs-stay-on-their-nodes' with binding 'team-jobs-stay-on-their-nodes' denied "
        "request: every replica's pod template of a PyTorchJob in a team namespace is annotated "
        'karpenter.sh/do-not-disrupt: "true"'
    )
    assert api.refusals == []


@pytest.mark.parametrize(
    ("resource", "pod", "who", "refused"),
    [
        ("pods/exec", "tensorboard-7d9c5b6f4-x2x9q", MEMBER, True),
        ("pods/attach", "tensorboard-7d9c5b6f4-x2x9q", MEMBER, True),
        ("pods/exec", "checkpoint-copy", MEMBER, False),  # trainer.fetch's copy pod
        ("pods/portforward", "tensorboard-7d9c5b6f4-x2x9q", MEMBER, None),  # how she reads it
        ("pods/exec", "tensorboard-7d9c5b6f4-x2x9q", {"groups": ("system:masters",)}, None),
    ],
)
def test_no_member_runs_a_process_in_the_tensorboard_on_the_system_nodes(
    dev_plan, resource, pod, who, refused
):
    """The team's TensorBoard is the one pod of a team namespace on the system nodes: a member's
    exec or attach there is refused (the CONNECT request names the pod), her own pods' and
    port-forward are not; the platform's administrators are not members."""
    policy = admission_policies(dev_plan)[EXEC_POLICY]
    verdict = refusals(policy, "CONNECT", {"kind": "PodExecOptions"}, namespace=TEAM_A,
                       resource=("", resource), name=pod, **who)  # fmt: skip
    if refused is None:
        assert verdict is None
    else:
        assert bool(verdict) == refused, verdict
