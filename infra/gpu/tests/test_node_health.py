"""Node health and repair in the plan, checked against upstream's rules written down at the
pinned versions: Karpenter's NodeRepair gate (infra/karpenter/tests/karpenter_rules.py: the chart's
gates and how its template renders them), the EKS node monitoring agent add-on (tests/
node_monitoring_agent_rules.py: its configuration schema, its dcgm-server DaemonSet), the DCGM
exporter reading through the agent's host engine, and the GPU registration watcher's stack
config."""

import json

import jsonschema
import kubernetes_validate
import pytest

from infra.core.catalog import load_catalog
from infra.core.config import ConfigError
from infra.core.versions import KUBERNETES_VERSIONS
from infra.eks.tests import node_monitoring_agent_rules as agent
from infra.gpu.registration_watch import registration_timeout
from infra.hybrid.tests.test_hybrid import HYBRID, PRIVATE_ENDPOINT_OFF
from infra.karpenter.tests import karpenter_rules as karpenter
from infra.stack.loading import parse_stack_config
from tests.plugin import NO_DEV_SERVERS, ROOT, deep_merge, hadolint, plan_of, stack_values

RELEASE = "kubernetes:helm.sh/v3:Release"
NODEPOOL = "kubernetes:karpenter.sh/v1:NodePool"
ADDON = "aws:eks/addon:Addon"
CRONJOB = "kubernetes:batch/v1:CronJob"


def tolerates(toleration: dict, taint: dict) -> bool:
    """k8s.io/api/core/v1 toleration.go, ToleratesTaint."""
    if toleration.get("effect") and toleration["effect"] != taint["effect"]:
        return False
    if toleration.get("key") and toleration["key"] != taint["key"]:
        return False
    if toleration.get("operator", "Equal") == "Exists":
        return True
    return toleration.get("value", "") == taint.get("value", "")


def gpu_pool_taints(plan) -> list[dict]:
    return [
        taint
        for pool in plan.of_type(NODEPOOL)
        for taint in pool.inputs["spec"]["template"]["spec"].get("taints", [])
    ]


# --- Karpenter NodeRepair ---------------------------------------------------------------------


@pytest.mark.parametrize(("stack_config", "gate"), [({}, "true"), ({"nodeRepair": False}, "false")])
def test_node_repair_reaches_the_controller_through_the_chart_from_stack_config(stack_config, gate):
    """Our Helm values coalesced over the chart's (maps merge key by key), rendered into
    FEATURE_GATES as the chart's template does: NodeRepair is off unless stack config asks."""
    plan = plan_of("dev", karpenter=stack_config)
    ours = plan.one(RELEASE, "karpenter").inputs["values"]
    assert set(ours["settings"].get("featureGates", {})) <= set(karpenter.CHART_FEATURE_GATES)
    chart = {"settings": {"featureGates": karpenter.CHART_FEATURE_GATES}}
    env = karpenter.feature_gates_env(deep_merge(chart, ours))
    assert dict(g.split("=") for g in env.split(","))["NodeRepair"] == gate


# --- the node monitoring agent ----------------------------------------------------------------


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_the_node_monitoring_agent_is_a_pinned_addon_configured_as_its_schema_allows(
    stack, request
):
    plan = request.getfixturevalue(f"{stack}_plan")
    (addon,) = [
        a for a in plan.of_type(ADDON) if a.inputs["addonName"] == "eks-node-monitoring-agent"
    ]
    version = plan.one("eks:index:Cluster").inputs["version"]
    pins = KUBERNETES_VERSIONS[version].addons
    assert addon.inputs["addonVersion"] == pins["eks-node-monitoring-agent"]
    configuration = json.loads(addon.inputs["configurationValues"])
    # CreateAddon validates configurationValues against the add-on's schema
    # (describe-addon-configuration).
    jsonschema.Draft7Validator(agent.CONFIGURATION_SCHEMA).validate(configuration)
    # Created once the system nodes run (EKS waits for its pods) and the add-on's pods can pull.
    group = plan.one("aws:eks/nodeGroup:NodeGroup")
    assert group.urn in addon.dependencies


def test_the_agents_dcgm_host_engine_reaches_every_gpu_pool_node(dev_plan):
    """dcgm-server tolerates no taint by default; without the GPU taint's toleration it would
    run on none of our GPU nodes, and the agent's XID and DCGM checks would see no GPU."""
    assert agent.DCGM_SERVER_TOLERATIONS == []
    (addon,) = [
        a for a in dev_plan.of_type(ADDON) if a.inputs["addonName"] == "eks-node-monitoring-agent"
    ]
    tolerations = json.loads(addon.inputs["configurationValues"])["dcgmAgent"]["tolerations"]
    taints = gpu_pool_taints(dev_plan)
    assert taints and all(any(tolerates(t, taint) for t in tolerations) for taint in taints)
    # Its affinity (the add-on's default, kept) names the GPU instance types it runs on: every
    # GPU type a pool may use is among them; hybrid nodes are not.
    assert set(load_catalog().names(gpu=True)) <= agent.DCGM_SERVER_INSTANCE_TYPES
    assert "hybrid" in agent.DCGM_SERVER_EXCLUDED_COMPUTE_TYPES


def test_the_dcgm_exporter_reads_through_the_agents_host_engine_on_pool_nodes(dev_plan):
    """One host engine per node: the exporter on pool GPU nodes connects to dcgm-server's
    (dcgm-exporter's --remote-hostengine-info, env DCGM_REMOTE_HOSTENGINE_INFO) at the node's
    address, where dcgm-server publishes it (hostPort)."""
    exporter = dev_plan.one(RELEASE, "dcgm-exporter")
    env = exporter.inputs["values"]["extraEnv"]
    assert env == [
        {"name": "NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
        # $(NODE_IP) expands only to a variable defined before it in the list.
        {
            "name": "DCGM_REMOTE_HOSTENGINE_INFO",
            "value": f"$(NODE_IP):{agent.DCGM_HOST_ENGINE_HOST_PORT}",
        },
    ]
    (addon,) = [
        a for a in dev_plan.of_type(ADDON) if a.inputs["addonName"] == "eks-node-monitoring-agent"
    ]
    assert addon.urn in exporter.dependencies
    assert not [r for r in dev_plan.of_type(RELEASE) if r.name == "dcgm-exporter-hybrid"]


def test_hybrid_gpus_get_an_exporter_with_its_own_host_engine_and_pool_nodes_do_not():
    plan = plan_of("dev", hybrid=HYBRID, cluster=PRIVATE_ENDPOINT_OFF)
    pool = plan.one(RELEASE, "dcgm-exporter").inputs["values"]
    hybrid = plan.one(RELEASE, "dcgm-exporter-hybrid").inputs["values"]
    hybrid_taint = {"key": "training-platform/hybrid", "value": "true", "effect": "NoSchedule"}
    # The pool exporter never lands on a hybrid node (no agent, so no host engine, there)...
    assert not any(tolerates(t, hybrid_taint) for t in pool["tolerations"])
    # ...and the hybrid one, which embeds its engine, never on a pool node.
    (term,) = hybrid["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term["matchExpressions"] == [
        {"key": "eks.amazonaws.com/compute-type", "operator": "In", "values": ["hybrid"]}
    ]
    assert "extraEnv" not in hybrid


# --- the GPU registration watcher -------------------------------------------------------------


def watcher_args(plan) -> list[str]:
    cronjob = plan.one(CRONJOB, "gpu-registration-watch").inputs
    (container,) = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    return container["args"]


def test_the_default_timeout_is_the_slowest_gpu_pools_launch_with_margin(dev_plan):
    """infra/karpenter/cold_start.py: p4d 300 s boot + 30 s device plugin, g5 90 + 30; times 1.5, in
    whole minutes. dev has both: p4d's 495 s, 9 minutes."""
    pools = {p.name: p for p in parse_stack_config(stack_values("dev"), "dev").node_pools}
    assert registration_timeout([pools["gpu-small"]]) == 180
    assert registration_timeout([pools["gpu-small"], pools["gpu-large"]]) == 540
    assert "--timeout-seconds=540" in watcher_args(dev_plan)


def test_the_watcher_is_configured_from_stack_config():
    plan = plan_of(
        "dev", karpenter={"gpuRegistrationTimeout": "1h30m", "gpuRegistrationMaxDeletions": 0}
    )
    args = watcher_args(plan)
    assert "--timeout-seconds=5400" in args and "--max-deletions=0" in args


@pytest.mark.parametrize(
    ("karpenter", "key", "allowed"),
    [
        ({"gpuRegistrationTimeout": "30s"}, "gpuRegistrationTimeout", "allowed: 1m to 24h"),
        ({"gpuRegistrationTimeout": "25h"}, "gpuRegistrationTimeout", "allowed: 1m to 24h"),
        ({"gpuRegistrationMaxDeletions": 11}, "gpuRegistrationMaxDeletions", "less than or equal"),
        ({"gpuRegistrationMaxDeletions": -1}, "gpuRegistrationMaxDeletions", "greater than"),
        ({"nodeRepair": "yes"}, "nodeRepair", "valid boolean"),
    ],
)
def test_bad_node_health_config_is_one_clear_error(karpenter, key, allowed):
    with pytest.raises(ConfigError) as caught:
        parse_stack_config(stack_values("dev", karpenter=karpenter), "Pulumi.dev.yaml")
    (line,) = [
        line
        for line in str(caught.value).splitlines()
        if f"training-platform:karpenter.{key}:" in line
    ]
    assert allowed in line


def test_no_gpu_pool_no_watcher_and_no_exporter_but_the_agent_still_watches_every_node():
    cpu_only = [{"name": "cpu", "instanceTypes": ["m6i.large"], "maxNodes": 2}]
    plan = plan_of("dev", nodePools=cpu_only, jobs=[], devServers=NO_DEV_SERVERS)
    assert [c.name for c in plan.of_type(CRONJOB)] == ["usage-recorder"]
    assert not [r for r in plan.resources if r.name.startswith(("gpu-registration", "dcgm"))]
    assert [a.inputs["addonName"] for a in plan.of_type(ADDON)].count(
        "eks-node-monitoring-agent"
    ) == 1


def test_the_watcher_image_is_its_package_alone_and_its_dockerfile_passes_hadolint(dev_plan):
    image = dev_plan.one("docker-build:index:Image", "gpu-registration-watch-image-watcher").inputs
    assert image["context"] == {"location": "../gpuwatch"}
    assert image["target"] == "watcher"
    cronjob = dev_plan.one(CRONJOB, "gpu-registration-watch").inputs
    kubernetes_validate.validate(cronjob, "1.34", strict=True)
    pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert "/gpu-registration-watch@sha256:" in pod["containers"][0]["image"]
    assert hadolint(ROOT / "gpuwatch" / "Dockerfile") == ""
