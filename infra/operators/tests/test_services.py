"""Training services: job operators, Kueue, queues derived from the NodePools, GPU metrics."""

import math

import pytest
import yaml

from deploy.program import OVERLAYS
from infra.core.config import ConfigError
from infra.core.nodes import SYSTEM_NODE_LABEL, SYSTEM_TOLERATION
from infra.core.tests.crd_schema import CRD_DIR, load_crd
from infra.core.versions import (
    DCGM_EXPORTER_CHART,
    JOBSET_VERSION,
    KUBE_PROMETHEUS_STACK_CHART,
    KUEUE_CHART,
    MPI_OPERATOR_VERSION,
    TRAINER_VERSION,
    TRAINING_OPERATOR_VERSION,
)
from infra.kueue.kueue import FRAMEWORKS
from infra.kueue.queues import TEAM_LABEL
from infra.operators.tests import trainer_rules
from infra.operators.training_operators import MPI_OPERATOR, TRAINER, TRAINING_OPERATOR
from infra.stack.loading import load_stack_file, parse_stack_config
from tests.plugin import STACKS, stack_values

RELEASE = "kubernetes:helm.sh/v3:Release"
KUEUE_TYPES = [
    f"kubernetes:kueue.x-k8s.io/v1beta2:{k}"
    for k in ("ResourceFlavor", "ClusterQueue", "LocalQueue")
]


def kustomization(directory=OVERLAYS / TRAINING_OPERATOR) -> dict:
    return yaml.safe_load((directory / "kustomization.yaml").read_text())


STANDALONE = "manifests/overlays/standalone"


@pytest.mark.parametrize(
    "directory, repository, overlay, version",
    [
        (
            OVERLAYS / TRAINING_OPERATOR,
            "github.com/kubeflow/trainer",
            STANDALONE,
            TRAINING_OPERATOR_VERSION,
        ),
        (
            OVERLAYS / MPI_OPERATOR,
            "github.com/kubeflow/mpi-operator",
            STANDALONE,
            MPI_OPERATOR_VERSION,
        ),
        (
            OVERLAYS / TRAINER,
            "github.com/kubeflow/trainer",
            trainer_rules.MANAGER_OVERLAY,
            TRAINER_VERSION,
        ),
    ],
)
def test_operators_are_pinned_upstream_overlays_placed_on_system_nodes(
    directory, repository, overlay, version
):
    (resource,) = kustomization(directory)["resources"]
    assert resource == f"https://{repository}//{overlay}?ref={version}"
    # An image the overlay leaves on a floating tag is pinned to the release's own.
    for image in kustomization(directory).get("images", []):
        assert image["newTag"] == version.removeprefix("v"), image
    (component,) = kustomization(directory)["components"]
    placement = kustomization((directory / component).resolve())
    assert placement["kind"] == "Component"
    (patch,) = placement["patches"]
    assert patch["target"]["kind"] == "Deployment" and "name" not in patch["target"]
    pod = yaml.safe_load(patch["patch"])["spec"]["template"]["spec"]
    assert pod == {"nodeSelector": SYSTEM_NODE_LABEL, "tolerations": [SYSTEM_TOLERATION]}


def test_training_operator_serves_pytorchjob_and_not_mpijob():
    (args_patch,) = [p for p in kustomization()["patches"] if p["target"]["kind"] == "Deployment"]
    (operation,) = yaml.safe_load(args_patch["patch"])
    assert operation["path"] == "/spec/template/spec/containers/0/args"
    schemes = [a.split("=", 1)[1] for a in operation["value"] if a.startswith("--enable-scheme=")]
    assert "pytorchjob" in schemes
    assert "mpijob" not in [s.lower() for s in schemes]


def test_trainer_v2_installs_its_controller_and_the_jobset_it_names_beside_v1(dev_plan):
    """The manager overlay (not the runtimes one) at the pinned tag, with the JobSet that tag's
    manifests name; its names collide with none of the v1 operators', Kueue's or the teams'."""
    assert TRAINER_VERSION == trainer_rules.TRAINER_VERSION
    assert JOBSET_VERSION == trainer_rules.JOBSET_OF_TRAINER[TRAINER_VERSION]
    assert trainer_rules.collisions() == []
    # The CRDs the tests validate against are the ones the rules name for each install.
    vendored = {
        load_crd(path)["metadata"]["name"]
        for folder in ("trainer", "training-operator", "mpi-operator")
        for path in (CRD_DIR / folder).glob("*.yaml")
    }
    installs = trainer_rules.INSTALLS
    assert vendored <= installs["trainer"].crds | installs["training-operator"].crds | {
        *installs["mpi-operator"].crds
    }
    assert {n for n in vendored if n.endswith(".trainer.kubeflow.org")} == {
        "trainjobs.trainer.kubeflow.org",
        "clustertrainingruntimes.trainer.kubeflow.org",
    }
    # No team may take a namespace an install runs in.
    for install in installs.values():
        values = stack_values(
            "dev", queues={"teams": [{"name": "t", "namespace": install.namespace}]}
        )
        with pytest.raises(ConfigError, match="is a system or DevServer user.s namespace"):
            parse_stack_config(values, "Pulumi.dev.yaml")
    trainer = dev_plan.one("kubernetes:kustomize/v2:Directory", "kubeflow-trainer")
    assert trainer.inputs["directory"].endswith(f"manifests/{TRAINER}")
    assert trainer.urn in dev_plan.one(RELEASE, "kueue").dependencies


def test_exactly_one_mpijob_crd_version_is_installed(dev_plan):
    (crd_patch,) = [
        p for p in kustomization()["patches"] if p["target"]["kind"] == "CustomResourceDefinition"
    ]
    assert crd_patch["target"]["name"] == "mpijobs.kubeflow.org"
    assert yaml.safe_load(crd_patch["patch"])["$patch"] == "delete"
    # What remains is the MPI operator's CRD, which serves v2beta1 only.
    crd = yaml.safe_load((CRD_DIR / "mpi-operator" / "kubeflow.org_mpijobs.yaml").read_text())
    assert [v["name"] for v in crd["spec"]["versions"] if v["served"]] == ["v2beta1"]
    mpi = dev_plan.one("kubernetes:kustomize/v2:Directory", "mpi-operator")
    training = dev_plan.one("kubernetes:kustomize/v2:Directory", "training-operator")
    assert mpi.urn in training.dependencies


def kueue_config(plan) -> dict:
    release = plan.one(RELEASE, "kueue").inputs
    assert (release["chart"], release["version"]) == (KUEUE_CHART.chart, KUEUE_CHART.version)
    return yaml.safe_load(release["values"]["managerConfig"]["controllerManagerConfigYaml"])


def test_kueue_integrations_and_all_or_nothing_admission(dev_plan):
    config = kueue_config(dev_plan)
    assert config["apiVersion"] == "config.kueue.x-k8s.io/v1beta2"
    assert {
        "kubeflow.org/pytorchjob",
        "kubeflow.org/mpijob",
        trainer_rules.KUEUE_TRAINJOB_FRAMEWORK,
    } <= set(config["integrations"]["frameworks"])
    assert config["integrations"]["frameworks"] == FRAMEWORKS
    # v1beta2: the block's presence switches it on; its values: infra/kueue/tests/test_kueue.py.
    assert "enable" not in config["waitForPodsReady"]


def test_kueue_webhooks_reach_only_the_namespaces_that_have_queues(stack_plan):
    """Kueue's pod webhook fails closed: it must not stand between any other pod and starting."""
    selector = kueue_config(stack_plan)["managedJobsNamespaceSelector"]
    assert selector == {"matchExpressions": [{"key": TEAM_LABEL, "operator": "Exists"}]}
    selected = {
        n.inputs["metadata"]["name"]
        for n in stack_plan.of_type("kubernetes:core/v1:Namespace")
        if TEAM_LABEL in n.inputs["metadata"].get("labels", {})
    }
    queued = {q.inputs["metadata"]["namespace"] for q in stack_plan.of_type(KUEUE_TYPES[2])}
    assert selected == queued and queued
    controllers = {r.inputs["namespace"] for r in stack_plan.of_type(RELEASE)}
    assert not controllers & selected and {"kube-system", "kueue-system"} <= controllers


def test_install_order_lets_a_first_up_succeed(stack_plan):
    kueue = stack_plan.one(RELEASE, "kueue")
    for install in stack_plan.of_type("kubernetes:kustomize/v2:Directory"):
        assert install.urn in kueue.dependencies
    for type_ in KUEUE_TYPES:
        for resource in stack_plan.of_type(type_):
            assert kueue.urn in resource.dependencies, resource.name
    for local_queue in stack_plan.of_type(KUEUE_TYPES[2]):
        namespace = local_queue.inputs["metadata"]["namespace"]
        (ns,) = [
            n
            for n in stack_plan.of_type("kubernetes:core/v1:Namespace")
            if n.inputs["metadata"]["name"] == namespace
        ]
        assert ns.urn in local_queue.dependencies


def by_name(plan, type_):
    return {r.inputs["metadata"]["name"]: r.inputs["spec"] for r in plan.of_type(type_)}


@pytest.mark.parametrize("stack", STACKS)
def test_platform_quota_equals_each_pools_karpenter_ceiling(stack, request):
    plan = request.getfixturevalue(f"{stack}_plan")
    config = load_stack_file(stack)
    (group,) = by_name(plan, KUEUE_TYPES[1])["platform"]["resourceGroups"]
    quota = {
        f["name"]: {r["name"]: r["nominalQuota"] for r in f["resources"]} for f in group["flavors"]
    }
    node_pools = by_name(plan, "kubernetes:karpenter.sh/v1:NodePool")
    assert set(quota) == set(node_pools) == {p.name for p in config.node_pools}
    for pool in config.node_pools:
        limits = node_pools[pool.name]["limits"]
        assert quota[pool.name]["cpu"] == limits["cpu"]
        assert quota[pool.name]["memory"] == limits["memory"]
        assert quota[pool.name]["nvidia.com/gpu"] == limits.get("nvidia.com/gpu", "0")
    # CPU flavors come first, so a job without GPU requests never lands on a GPU node.
    assert [f["name"] for f in group["flavors"]][0] == "cpu"


def test_flavors_select_their_pool_and_carry_the_gpu_taint(dev_plan):
    flavors = by_name(dev_plan, KUEUE_TYPES[0])
    assert flavors["gpu-small"]["nodeLabels"] == {
        "training-platform.node-restriction.kubernetes.io/pool": "gpu-small"
    }
    assert flavors["gpu-small"]["nodeTaints"] == [
        {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
    ]
    assert flavors["gpu-small"]["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}
    ]
    assert "nodeTaints" not in flavors["cpu"] and "tolerations" not in flavors["cpu"]


def test_teams_get_namespaces_local_queues_and_optional_borrowing_queues(prod_plan):
    local_queues = {
        (r.inputs["metadata"]["namespace"], r.inputs["metadata"]["name"]): r.inputs["spec"]
        for r in prod_plan.of_type(KUEUE_TYPES[2])
        if r.parent.endswith("::queues")
    }
    assert local_queues == {
        ("team-a", "team-a"): {"clusterQueue": "platform"},
        ("team-b", "team-b"): {"clusterQueue": "platform"},
        ("research-jobs", "research"): {"clusterQueue": "team-research"},
    }
    queues = by_name(prod_plan, KUEUE_TYPES[1])
    assert {q["cohortName"] for q in queues.values()} == {"training-platform"}
    assert queues["platform"]["namespaceSelector"] == {
        "matchLabels": {"training-platform/queue-access": "true"}
    }
    assert queues["team-research"]["namespaceSelector"] == {
        "matchLabels": {"training-platform/team": "research"}
    }
    assert queues["platform"]["preemption"] == {
        "reclaimWithinCohort": "Any",
        "withinClusterQueue": "LowerPriority",
    }
    (group,) = queues["team-research"]["resourceGroups"]
    gpu_large = {
        r["name"]: r for f in group["flavors"] if f["name"] == "gpu-large" for r in f["resources"]
    }
    # 25% of 16 x p4d.24xlarge: 32 of 128 GPUs, borrowed, none owned.
    assert gpu_large["nvidia.com/gpu"] == {
        "name": "nvidia.com/gpu",
        "nominalQuota": "0",
        "borrowingLimit": "32",
    }
    assert gpu_large["memory"]["borrowingLimit"] == f"{math.ceil(18432 * 0.25)}Gi"
    namespaces = {
        n.inputs["metadata"]["name"]: n.inputs["metadata"]["labels"]
        for n in prod_plan.of_type("kubernetes:core/v1:Namespace")
    }
    assert namespaces["team-a"]["training-platform/queue-access"] == "true"
    assert namespaces["research-jobs"]["training-platform/queue-access"] == "false"


def test_dcgm_exporter_on_gpu_nodes_and_prometheus_only_when_asked(dev_plan, prod_plan):
    for plan in (dev_plan, prod_plan):
        dcgm = plan.one(RELEASE, "dcgm-exporter").inputs
        assert dcgm["version"] == DCGM_EXPORTER_CHART.version
        assert dcgm["values"]["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in dcgm[
            "values"
        ]["tolerations"]
    assert not [r for r in dev_plan.of_type(RELEASE) if r.name == "kube-prometheus-stack"]
    assert dev_plan.one(RELEASE, "dcgm-exporter").inputs["values"]["serviceMonitor"] == {
        "enabled": False
    }
    stack = prod_plan.one(RELEASE, "kube-prometheus-stack")
    assert stack.inputs["version"] == KUBE_PROMETHEUS_STACK_CHART.version
    assert (
        stack.inputs["values"]["grafana"]["dashboards"]["gpu"]["dcgm-exporter"]["gnetId"] == 12239
    )
    dcgm = prod_plan.one(RELEASE, "dcgm-exporter")
    assert dcgm.inputs["values"]["serviceMonitor"] == {"enabled": True}
    assert stack.urn in dcgm.dependencies


@pytest.mark.parametrize(
    ("queues", "message"),
    [
        ({"teams": [{"name": "a"}, {"name": "a"}]}, "team names a repeat"),
        (
            {"teams": [{"name": "a", "namespace": "x"}, {"name": "b", "namespace": "x"}]},
            "team namespaces x repeat",
        ),
        (
            {"teams": [{"name": "a", "borrowingLimitPercent": 0}]},
            "queues.teams[a].borrowingLimitPercent",
        ),
        ({"reclaimWithinCohort": "Always"}, "'Never', 'LowerPriority' or 'Any'"),
    ],
)
def test_bad_queue_config_is_a_config_error(queues, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_stack_config(stack_values("dev", queues=queues), "Pulumi.dev.yaml")
