"""Self-service jobs on Kubeflow Trainer v2.3: the pools' ClusterTrainingRuntimes (one renderer
with the stack's PyTorchJobs), stack-config TrainJobs, the teams' self-service identity, the example
TrainJob of the docs, the Kubeflow SDK submitting through namespace RBAC, and what a change to a
runtime does to running work. Upstream's rules: infra/operators/tests/trainer_rules.py."""

import copy
import json

import pytest
import yaml

from deploy.day_two import consequences
from deploy.program import build_platform
from infra.core.declared import declared_in
from infra.core.nodes import POOL_LABEL
from infra.core.offline import run_offline
from infra.core.tests.crd_schema import CRD_DIR, cel_violations, conformance_errors, load_crd
from infra.integrations import plan_steps
from infra.jobs.config import SELF_SERVICE_ACCOUNT
from infra.jobs.declared import declared_jobs
from infra.kueue.config import TeamConfig
from infra.operators.tests import trainer_rules
from infra.operators.tests.job_pods import pod_failure_action, pod_failure_policy_errors
from infra.stack.loading import parse_stack_config
from infra.teams.access import team_group
from policies.offline import check
from tests.config_edits import PREBUILT_IMAGE
from tests.destroy_order import DestroyOrder
from tests.e2e.test_policies import plan_with
from tests.e2e.test_roll import create, kind
from tests.kube_api import rbac_of, user
from tests.kube_api.rbac import Authorizer
from tests.kube_api.server import BUILTIN, ApiError, KubeAPI
from tests.plugin import ROOT, plan_of, stack_values
from trainer.options import parse_options
from workloads.manifests import (
    CHECKPOINT_ENV,
    LAUNCH,
    QUEUE_LABEL,
    training_runtime,
)

RUNTIME = "kubernetes:trainer.kubeflow.org/v1alpha1:ClusterTrainingRuntime"
TRAINJOB = "kubernetes:trainer.kubeflow.org/v1alpha1:TrainJob"
PYTORCHJOB = "kubernetes:kubeflow.org/v1:PyTorchJob"
ASSOCIATION = "aws:eks/podIdentityAssociation:PodIdentityAssociation"
EXAMPLE = ROOT / "examples" / "trainjob.yaml"
# A TrainJob in the dev stack's config, beside its PyTorchJob and MPIJob.
STACK_TRAINJOB = {
    "name": "gpt-small-v2",
    "kind": "TrainJob",
    "nodePool": "gpu-small",
    "minNodes": 2,
    "maxNodes": 2,
    "queue": "team-a",
    "args": ["--model", "small", "--steps", "2000", "--global-batch", "64", "--micro-batch", "4"],
    "checkpoint": "s3",
}


def with_trainjob(**job) -> list[dict]:
    return [*stack_values("dev")["training-platform:jobs"], {**STACK_TRAINJOB, **job}]


@pytest.fixture(scope="module")
def trainjob_plan():
    return plan_of("dev", jobs=with_trainjob())


def runtimes_of(plan) -> dict[str, dict]:
    return {r.inputs["metadata"]["name"]: r for r in plan.of_type(RUNTIME)}


def node_pod(runtime: dict) -> dict:
    (job,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    return job["template"]["spec"]["template"]


# -- one renderer ---------------------------------------------------------------------------------


def test_runtime_pods_are_a_stack_pytorchjobs_pods_of_the_same_pool(dev_plan, prod_plan):
    """Placement, GPUs and EFA, /dev/shm, the shared file systems, Pod Security, grace period and
    annotations are the same; what differs is by design: the identity (the team's self-service
    account, not the job's own), the job label, and the command (the job's arguments; the
    runtime's from the TrainJob, its checkpoints in S3 under the job's namespace)."""
    compared = set()
    for plan in (dev_plan, prod_plan):
        runtimes = runtimes_of(plan)
        assert set(runtimes) == {
            f"torch-{p.inputs['metadata']['name']}"
            for p in plan.of_type("kubernetes:karpenter.sh/v1:NodePool")
        }
        for job in plan.of_type(PYTORCHJOB):
            worker = copy.deepcopy(job.inputs["spec"]["pytorchReplicaSpecs"]["Worker"]["template"])
            pool = worker["spec"]["nodeSelector"][POOL_LABEL]
            runtime = copy.deepcopy(node_pod(runtimes[f"torch-{pool}"].inputs))
            ours, theirs = runtime["spec"], worker["spec"]
            assert ours.pop("serviceAccountName") == SELF_SERVICE_ACCOUNT
            assert theirs.pop("serviceAccountName") == job.inputs["metadata"]["name"]
            # A new pod per failure, for its pod failure policy (a PyTorchJob: its replica's).
            assert ours.pop("restartPolicy") == "Never"
            theirs.pop("initContainers", None)  # a job checkpointing to FSx prepares its folder
            theirs["volumes"] = [v for v in theirs["volumes"] if v["name"] != "fsx"] + [
                v for v in ours["volumes"] if v["name"] == "fsx"
            ]
            (node,), (pytorch,) = ours.pop("containers"), theirs.pop("containers")
            assert node["name"] == "node" and pytorch["name"] == "pytorch"
            assert node["command"][: len(LAUNCH)] == pytorch["command"][: len(LAUNCH)] == LAUNCH
            for key in ("image", "resources", "volumeMounts", "securityContext"):
                assert node[key] == pytorch[key], (pool, key)
            platform_env = [e for e in node["env"] if "value" in e and e["name"] != CHECKPOINT_ENV]
            assert platform_env == pytorch["env"]
            assert ours == theirs, pool
            assert runtime["metadata"] == {"annotations": worker["metadata"]["annotations"]}
            compared.add((plan.stack, pool))
    assert {pool for _, pool in compared} == {"gpu-small", "gpu-large", "cpu"}


def test_runtimes_follow_the_trainers_contract_and_checkpoint_under_the_namespace(dev_plan):
    for name, runtime in runtimes_of(dev_plan).items():
        inputs = runtime.inputs
        assert inputs["metadata"]["labels"][trainer_rules.FRAMEWORK_LABEL] == "torch"
        (job,) = inputs["spec"]["template"]["spec"]["replicatedJobs"]
        assert job["name"] == trainer_rules.NODE
        labels = job["template"]["metadata"]["labels"]
        assert labels[trainer_rules.ANCESTOR_LABEL] == trainer_rules.ANCESTOR_TRAINER
        (container,) = node_pod(inputs)["spec"]["containers"]
        assert container["name"] == trainer_rules.NODE
        assert not {e["name"] for e in container["env"]} & set(trainer_rules.TORCHRUN_ENV)
        env = {e["name"]: e for e in container["env"]}
        label = env["TRAINJOB_NAME"]["valueFrom"]["fieldRef"]["fieldPath"]
        assert label == f"metadata.labels['{trainer_rules.JOBSET_NAME_LABEL}']"
        assert env[CHECKPOINT_ENV]["value"].endswith(
            "/checkpoints/$(TRAINJOB_NAMESPACE)/$(TRAINJOB_NAME)"
        )
        assert container["command"][-2:] == ["--checkpoint-dir", f"$({CHECKPOINT_ENV})"]
        # The runtime's image is the one its pool's stack jobs run: by digest.
        assert "@sha256:" in container["image"], name


# -- the Trainer's CRDs, with their CEL rules ------------------------------------------------


def test_a_runtimes_job_fails_at_once_on_bad_input_and_the_api_server_accepts_it(stack_plan):
    for runtime in stack_plan.of_type(RUNTIME):
        (replicated,) = runtime.inputs["spec"]["template"]["spec"]["replicatedJobs"]
        job = replicated["template"]["spec"]
        assert pod_failure_policy_errors(job) == []
        assert pod_failure_action(job, {"node": 2}) == "FailJob"
        # The rule the policy rests on: the Job API refuses it beside in-place restarts.
        restarting = copy.deepcopy(job)
        restarting["template"]["spec"]["restartPolicy"] = "OnFailure"
        assert pod_failure_policy_errors(restarting) == [
            'spec.podFailurePolicy: only "Never" is supported as restartPolicy'
        ]


def test_runtimes_and_a_stack_trainjob_conform_with_the_crds_cel_rules(trainjob_plan):
    objects = [r.inputs for r in trainjob_plan.of_type(RUNTIME) + trainjob_plan.of_type(TRAINJOB)]
    assert {o["kind"] for o in objects} == {"ClusterTrainingRuntime", "TrainJob"}
    assert {o["metadata"]["name"]: conformance_errors(o) + cel_violations(o) for o in objects} == {
        o["metadata"]["name"]: [] for o in objects
    }
    # The CEL rules are evaluated for real: one policy per runtime, a DNS-1035 job name.
    runtime = copy.deepcopy(objects[0])
    runtime["spec"]["mlPolicy"]["mpi"] = {}
    assert cel_violations(runtime) == [
        "<root>.spec.mlPolicy: Only one of the policy can be configured"
    ]
    (job,) = [copy.deepcopy(o) for o in objects if o["kind"] == "TrainJob"]
    job["metadata"]["name"] = "2nd-run"
    assert "RFC 1035" in " ".join(cel_violations(job))
    # spec.trainer is immutable: the program replaces a changed TrainJob instead.
    changed = copy.deepcopy(job)
    changed["spec"]["trainer"]["args"] = ["--steps", "1"]
    assert "<root>.spec.trainer: field is immutable" in cel_violations(changed, old=job)


def test_a_stack_trainjob_runs_on_its_pools_runtime_as_its_own_identity(trainjob_plan):
    (job,) = trainjob_plan.of_type(TRAINJOB)
    spec = job.inputs["spec"]
    runtime = runtimes_of(trainjob_plan)[spec["runtimeRef"]["name"]]
    assert spec["runtimeRef"]["name"] == "torch-gpu-small"
    container = node_pod(runtime.inputs)["spec"]["containers"][0]
    assert spec["trainer"]["image"] == container["image"]  # its own, held by its revision
    assert spec["trainer"]["numNodes"] == 2 and spec["trainer"]["numProcPerNode"] == 4
    assert spec["trainer"]["args"] == STACK_TRAINJOB["args"]
    (checkpoint,) = spec["trainer"]["env"]
    bucket = trainjob_plan.outputs["bucketName"]
    assert checkpoint == {
        "name": CHECKPOINT_ENV,
        "value": f"s3://{bucket}/checkpoints/team-a/gpt-small-v2",
    }
    (patch,) = spec["runtimePatches"]
    (node,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    pod = node["template"]["spec"]["template"]
    assert pod["spec"] == {"serviceAccountName": "gpt-small-v2"}  # no terminationGracePeriod
    assert pod["metadata"]["labels"] == {"training-platform/job": "gpt-small-v2"}
    associations = {
        (a.inputs["namespace"], a.inputs["serviceAccount"])
        for a in trainjob_plan.of_type(ASSOCIATION)
    }
    assert ("team-a", "gpt-small-v2") in associations
    # It comes after its runtime (the Trainer's webhook refuses it before), Trainer v2, Kueue and
    # its LocalQueue, and goes before them.
    trainer = trainjob_plan.one("kubernetes:kustomize/v2:Directory", "kubeflow-trainer")
    order = DestroyOrder.of(trainjob_plan)
    for needed in (runtime, trainer, trainjob_plan.one("kubernetes:helm.sh/v3:Release", "kueue")):
        assert needed.urn in job.dependencies
        assert order.deleted_before(job.urn, needed.urn)
    for each in runtimes_of(trainjob_plan).values():
        assert order.deleted_before(each.urn, trainer.urn)
    # The plan's expected figures see it as they see the other kinds.
    (declared,) = [j for j in declared_jobs(declared_in(trainjob_plan)) if j.name == "gpt-small-v2"]
    assert (declared.pool, declared.nodes, declared.ranks, declared.store) == (
        "gpu-small",
        2,
        8,
        "s3",
    )
    assert declared.options.steps == 2000


def test_a_hybrid_trainjob_is_refused():
    from infra.core.config import ConfigError
    from infra.hybrid.tests.test_hybrid import HYBRID, PRIVATE_ENDPOINT_OFF

    values = stack_values(
        "dev",
        hybrid=HYBRID,
        cluster=PRIVATE_ENDPOINT_OFF,
        jobs=with_trainjob(nodePool="hybrid", minNodes=1, maxNodes=1),
    )
    with pytest.raises(ConfigError, match="the hybrid machines have no ClusterTrainingRuntime"):
        parse_stack_config(values, "Pulumi.dev.yaml")


def test_the_policy_pack_holds_runtimes_and_trainjobs_to_the_training_rules(trainjob_plan):
    resources = [(r.type, copy.deepcopy(r.inputs)) for r in trainjob_plan.of_type(RUNTIME)]
    (job,) = trainjob_plan.of_type(TRAINJOB)
    assert check(plan_with(*resources, (TRAINJOB, copy.deepcopy(job.inputs)))) == []
    runtime = copy.deepcopy(resources[0][1])
    node_pod(runtime)["metadata"]["annotations"].clear()
    node_pod(runtime)["spec"]["securityContext"]["runAsUser"] = 0
    unlabelled = copy.deepcopy(job.inputs)
    unlabelled["metadata"]["labels"].pop(QUEUE_LABEL)
    unlabelled["spec"]["trainer"]["image"] = "trainer:latest"
    found = {v.policy for v in check(plan_with((RUNTIME, runtime), (TRAINJOB, unlabelled)))}
    assert {
        "training-pod-hygiene",
        "pods-restricted",
        "kueue-queue-label",
        "images-pinned",
    } <= found


# -- the teams' self-service identity ------------------------------------------------------------


def test_each_team_namespace_has_a_self_service_identity_on_its_checkpoints_only(dev_plan):
    order = DestroyOrder.of(dev_plan)
    config = parse_stack_config(stack_values("dev"), "Pulumi.dev.yaml")
    bucket = dev_plan.outputs["bucketName"]
    for team in config.queues.teams:
        namespace = team.namespace_name
        (account,) = [
            a
            for a in dev_plan.of_type("kubernetes:core/v1:ServiceAccount")
            if a.inputs["metadata"] == {"name": SELF_SERVICE_ACCOUNT, "namespace": namespace}
        ]
        (association,) = [
            a
            for a in dev_plan.of_type(ASSOCIATION)
            if (a.inputs["namespace"], a.inputs["serviceAccount"])
            == (namespace, SELF_SERVICE_ACCOUNT)
        ]
        (policy,) = [
            p
            for p in dev_plan.of_type("aws:iam/rolePolicy:RolePolicy")
            if p.name == f"team-{team.name}-jobs"
        ]
        statements = json.loads(policy.inputs["policy"])["Statement"]
        objects = next(s for s in statements if s["Sid"] == "ObjectsUnderPrefix")
        assert objects["Resource"].endswith(f":{bucket}/checkpoints/{namespace}/*")
        # The namespace (its jobs, which save a last checkpoint as they stop) goes first.
        (ns,) = [
            n
            for n in dev_plan.of_type("kubernetes:core/v1:Namespace")
            if n.inputs["metadata"]["name"] == namespace
        ]
        assert order.deleted_before(ns.urn, association.urn)
        assert order.deleted_before(ns.urn, policy.urn)
        assert order.deleted_before(account.urn, ns.urn)


# -- the docs' TrainJob ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "example_file,docs_page",
    [(EXAMPLE, "trainjob.md"), (ROOT / "examples" / "hello-trainjob.yaml", "quickstart.md")],
)
def test_the_example_trainjobs_are_a_dozen_lines_valid_for_the_dev_stack(
    dev_plan, example_file, docs_page
):
    text = example_file.read_text().replace("TEAM_QUEUE", "team-a")
    example = yaml.safe_load(text)
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert len(lines) <= 15
    assert conformance_errors(example) == [] and cel_violations(example) == []
    assert example["spec"]["runtimeRef"]["name"] in runtimes_of(dev_plan)
    teams = {
        q.inputs["metadata"]["name"]
        for q in dev_plan.of_type("kubernetes:kueue.x-k8s.io/v1beta2:LocalQueue")
    }
    assert example["metadata"]["labels"][QUEUE_LABEL] in teams
    env = {e["name"]: e["value"] for e in example["spec"]["trainer"].get("env", [])}
    checkpoint = env.get("CHECKPOINT_DIR", "s3://b/c")
    assert checkpoint.startswith(("s3://", "/efs/checkpoints/"))
    parse_options([*example["spec"]["trainer"]["args"], "--checkpoint-dir", checkpoint])
    relative = example_file.relative_to(ROOT).as_posix()
    assert relative in (ROOT / "docs" / "users" / docs_page).read_text()


# -- the Kubeflow SDK, as an ML engineer runs it ---------------------------------------------

IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/tp-dev/trainer@sha256:" + "b" * 64
TEAM = "team-a"
ALICE = user("arn:aws:iam::123456789012:role/alice", [team_group(TeamConfig(name=TEAM))])
# What the Trainer's manager overlay installs for its SDK (kubeflow/trainer v2.3.0 manifests/
# overlays/manager/kustomization.yaml configMapGenerator; base/rbac/public_configmap_role.yaml and
# public_configmap_role_binding.yaml: every authenticated user may read that one ConfigMap). The
# plan holds the overlay as one kustomize Directory, so its objects are written here.
PUBLIC = "kubeflow-trainer-public"
PUBLIC_RBAC = [
    {
        "kind": "Role",
        "metadata": {"name": PUBLIC, "namespace": "kubeflow-system"},
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["configmaps"],
                "resourceNames": [PUBLIC],
                "verbs": ["get", "list", "watch"],
            }
        ],
    },
    {
        "kind": "RoleBinding",
        "metadata": {"name": PUBLIC, "namespace": "kubeflow-system"},
        "roleRef": {"kind": "Role", "name": PUBLIC},
        "subjects": [
            {
                "kind": "Group",
                "name": "system:authenticated",
                "apiGroup": "rbac.authorization.k8s.io",
            }
        ],
    },
]


def cel_admission(kind_, obj):
    """The API server's CEL rules of the CRDs, which the local API does not model."""
    if kind_.group == "trainer.kubeflow.org":
        broken = cel_violations(obj)
        if broken:
            raise ApiError(422, "Invalid", f"{kind_.kind} is invalid: {'; '.join(broken)}")


@pytest.fixture(scope="module")
def trainer_api(dev_plan):
    # The team members' rights as the dev stack grants them (infra/teams/access.py).
    api = KubeAPI(Authorizer([*rbac_of(dev_plan), *PUBLIC_RBAC]), BUILTIN).start()
    api.admission.append(cel_admission)
    try:
        for path in sorted((CRD_DIR / "trainer").glob("*.yaml")):
            create(api, "customresourcedefinitions", "", load_crd(path), "apiextensions.k8s.io")
        api.settle()
        for namespace in ("kubeflow-system", TEAM, "research"):
            create(api, "namespaces", "", {"metadata": {"name": namespace}})
        data = {"kubeflow_trainer_version": trainer_rules.TRAINER_VERSION}
        create(api, "configmaps", "kubeflow-system", {"metadata": {"name": PUBLIC}, "data": data})
        config = parse_stack_config(stack_values("dev"), "Pulumi.dev.yaml")
        for pool in config.node_pools:
            runtime = training_runtime(pool, IMAGE, frozenset({"efs"}), "bucket")
            create(api, "clustertrainingruntimes", "", runtime, "trainer.kubeflow.org")
        yield api
    finally:
        api.stop()


def test_the_kubeflow_sdk_submits_watches_and_deletes_a_trainjob_in_its_namespace(
    trainer_api, tmp_path, monkeypatch
):
    from kubeflow.trainer import CustomTrainerContainer, KubernetesBackendConfig, TrainerClient
    from kubeflow.trainer.options import Labels, Name, TrainerArgs

    api = trainer_api
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(api.kubeconfig(api.add_token(ALICE), TEAM)))
    client = TrainerClient(KubernetesBackendConfig(namespace=TEAM, config_file=str(kubeconfig)))

    assert {r.name for r in client.list_runtimes()} == {
        "torch-gpu-small",
        "torch-gpu-large",
        "torch-cpu",
    }
    runtime = client.get_runtime("torch-gpu-small")
    assert (runtime.trainer.image, runtime.trainer.device, runtime.trainer.device_count) == (
        IMAGE,
        "gpu",
        "4",
    )
    name = client.train(
        runtime=runtime,
        trainer=CustomTrainerContainer(image=runtime.trainer.image, num_nodes=2),
        options=[
            Name("gpt-try"),
            Labels({QUEUE_LABEL: TEAM}),
            TrainerArgs(["--model", "small", "--steps", "2000"]),
        ],
    )
    stored = api.read("trainjobs", TEAM, name, group="trainer.kubeflow.org")
    assert conformance_errors(stored) == [] and cel_violations(stored) == []
    assert stored["metadata"]["labels"] == {QUEUE_LABEL: TEAM}
    assert stored["spec"]["runtimeRef"] == {
        "name": "torch-gpu-small",
        "kind": "ClusterTrainingRuntime",  # the CRD's default: the SDK names none
        "apiGroup": "trainer.kubeflow.org",
    }
    assert stored["spec"]["trainer"] == {
        "image": IMAGE,
        "numNodes": 2,
        "args": ["--model", "small", "--steps", "2000"],
    }
    # The first trainer pod as JobSet names it, and its log through the SDK. Streamed (follow),
    # the lines come through; read at once, kubernetes 36.0.3's read_namespaced_pod_log hands back
    # the bytes' repr (kubernetes-client/python#2596, the reason kubeflow 0.4.1 and later require
    # kubernetes<36: kubeflow/sdk#507, #511). The docs say to follow; this fails once it is fixed.
    pod = {
        "metadata": {
            "name": f"{name}-node-0-0-x",
            "labels": {
                trainer_rules.JOBSET_NAME_LABEL: name,
                "jobset.sigs.k8s.io/replicatedjob-name": "node",
                "batch.kubernetes.io/job-completion-index": "0",
            },
        },
        "spec": {"containers": [{"name": "node", "image": IMAGE}]},
    }
    created = create(api, "pods", TEAM, pod)
    status = {
        "phase": "Running",
        "containerStatuses": [
            {
                "name": "node",
                "containerID": "c1",
                "state": {"running": {}},
                "ready": True,
                "restartCount": 0,
                "image": IMAGE,
                "imageID": IMAGE,
            }
        ],
    }
    api.call(api.replace, kind(api, "pods"), created, {**created, "status": status})
    api.container_logs["c1"] = '{"step": 10, "loss": 4.2}\n{"step": 20, "loss": 3.9}\n'
    assert [j.name for j in client.list_jobs()] == [name]
    lines = ['{"step": 10, "loss": 4.2}', '{"step": 20, "loss": 3.9}']
    assert list(client.get_job_logs(name, follow=True)) == lines
    assert list(client.get_job_logs(name)) == [repr("\n".join(lines).encode() + b"\n")]
    client.delete_job(name)
    assert api.read("trainjobs", TEAM, name, group="trainer.kubeflow.org") is None
    assert api.refusals == []

    # Her rights end at her namespace.
    other = TrainerClient(
        KubernetesBackendConfig(namespace="research", config_file=str(kubeconfig))
    )
    with pytest.raises(RuntimeError, match="Failed to create TrainJob: research/"):
        other.train(runtime=runtime, trainer=CustomTrainerContainer(image=IMAGE, num_nodes=1))
    assert any('cannot create resource "trainjobs"' in r for r in api.refusals)


def test_the_example_submits_through_the_same_rbac(trainer_api, tmp_path):
    """kubectl's way: the YAML of the docs, created with the member's token."""
    from kubernetes import client as kube
    from kubernetes import config as kube_config

    api = trainer_api
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(api.kubeconfig(api.add_token(ALICE), TEAM)))
    custom = kube.CustomObjectsApi(kube_config.new_client_from_config(str(path)))
    example = yaml.safe_load(EXAMPLE.read_text())
    custom.create_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", TEAM, "trainjobs", example
    )
    stored = api.read("trainjobs", TEAM, example["metadata"]["name"], group="trainer.kubeflow.org")
    assert stored["spec"]["runtimeRef"]["kind"] == "ClusterTrainingRuntime"
    broken = copy.deepcopy(example)
    broken["metadata"]["name"] = "1st-try"  # the CRD's CEL rule: RFC 1035
    with pytest.raises(kube.ApiException) as refused:
        custom.create_namespaced_custom_object(
            "trainer.kubeflow.org", "v1alpha1", TEAM, "trainjobs", broken
        )
    assert refused.value.status == 422 and "RFC 1035" in refused.value.body


# -- day two -------------------------------------------------------------------------------------


def effects_of(base, jobs=None, **sections):
    values = stack_values("dev", jobs=jobs or with_trainjob(), **sections)
    config = parse_stack_config(values, "Pulumi.dev.yaml")
    after = run_offline(lambda: build_platform(config), "dev", values, None, base.outputs)
    outputs = after.outputs
    found = consequences(
        plan_steps(base, after), config, "dev", outputs.get("jobs"), outputs.get("runtimes")
    )
    return found, after


def test_a_new_image_waits_for_the_runtimes_revision_which_restarts_their_trainjobs(trainjob_plan):
    effects, after = effects_of(trainjob_plan, image={"uri": PREBUILT_IMAGE})
    held = [r for r in effects.restarts if r.startswith("runtime ") and "keeps revision 1" in r]
    assert len(held) == 3 and all(
        "changes to its image wait for runtimes.revision 2" in r for r in held
    )
    assert any(r.startswith("job gpt-small-v2 keeps revision 1") for r in effects.restarts)
    before = {
        r.urn: r.inputs for r in trainjob_plan.of_type(RUNTIME) + trainjob_plan.of_type(TRAINJOB)
    }
    assert all(before[r.urn] == r.inputs for r in after.of_type(RUNTIME) + after.of_type(TRAINJOB))

    jobs = with_trainjob(revision=2)
    effects, after = effects_of(
        trainjob_plan, jobs, image={"uri": PREBUILT_IMAGE}, runtimes={"revision": 2}
    )
    restarts = [r for r in effects.restarts if r.startswith("runtime ") and " changes (" in r]
    assert len(restarts) == 3 and all("node containers image" in r for r in restarts)
    (replaced,) = [r for r in effects.restarts if r.startswith("job gpt-small-v2 ")]
    assert "deleted and created again (spec" in replaced
    assert {
        node_pod(r.inputs)["spec"]["containers"][0]["image"] for r in after.of_type(RUNTIME)
    } == {PREBUILT_IMAGE}


def test_a_trainjob_moved_to_another_queue_starts_from_step_0_and_the_plan_says_where():
    """Its checkpoint folder is its trainer's CHECKPOINT_DIR, under its namespace's prefix."""
    before = plan_of("dev", jobs=with_trainjob())
    values = stack_values("dev", jobs=with_trainjob(queue="research"))
    config = parse_stack_config(values, "Pulumi.dev.yaml")
    after = run_offline(lambda: build_platform(config), "dev", values, None, before.outputs)
    effects = consequences(plan_steps(before, after), config, "dev")
    (line,) = [r for r in effects.restarts if r.startswith("job gpt-small-v2")]
    assert "it starts again from step 0 at s3://" in line
    assert "/checkpoints/research/gpt-small-v2 in research: its checkpoints stay at s3://" in line
    assert line.endswith(
        "/checkpoints/team-a/gpt-small-v2 in team-a (copy its newest step-* folder there first "
        "to carry on from it)"
    )
