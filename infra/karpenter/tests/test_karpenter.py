"""Karpenter controller, NodePools and EC2NodeClasses from stack config; NVIDIA device plugin."""

import copy
import json

import pytest

from deploy.plan import summary
from infra.core.config import ConfigError
from infra.core.nodes import GPU_TAINT
from infra.core.versions import KARPENTER_CHART, KUBERNETES_VERSIONS, NVIDIA_DEVICE_PLUGIN_CHART
from infra.karpenter.karpenter import INTERRUPTION_EVENTS
from infra.karpenter.tests import karpenter_rules
from infra.stack.loading import load_stack_file, parse_stack_config
from tests.plugin import NO_DEV_SERVERS, plan_of, stack_values

NODEPOOL = "kubernetes:karpenter.sh/v1:NodePool"
NODECLASS = "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass"
RELEASE = "kubernetes:helm.sh/v3:Release"
CLUSTER_QUEUE = "kubernetes:kueue.x-k8s.io/v1beta2:ClusterQueue"


def spec_of(plan, type_, pool):
    (resource,) = [r for r in plan.of_type(type_) if r.inputs["metadata"]["name"] == pool]
    return resource.inputs["spec"]


def test_gpu_pool_limits_are_max_nodes_times_the_instance_figures(dev_plan):
    # g5.12xlarge: 4 GPUs, 48 vCPU, 192 GiB; p4d.24xlarge: 8 GPUs, 96 vCPU, 1152 GiB.
    assert spec_of(dev_plan, NODEPOOL, "gpu-small")["limits"] == {
        "nodes": "4",
        "nvidia.com/gpu": "16",
        "cpu": "192",
        "memory": "768Gi",
    }
    assert spec_of(dev_plan, NODEPOOL, "gpu-large")["limits"] == {
        "nodes": "16",
        "nvidia.com/gpu": "128",
        "cpu": "1536",
        "memory": "18432Gi",
    }


def test_cpu_pool_limits_take_the_largest_type_and_have_no_gpus(dev_plan):
    # m6i.4xlarge is the larger of the two: 16 vCPU, 64 GiB.
    assert spec_of(dev_plan, NODEPOOL, "cpu")["limits"] == {
        "nodes": "10",
        "cpu": "160",
        "memory": "640Gi",
    }


def requirement(spec, key):
    (req,) = [r for r in spec["template"]["spec"]["requirements"] if r["key"] == key]
    assert req["operator"] == "In"
    return req["values"]


def test_requirements_taints_and_labels_per_pool(dev_plan):
    small = spec_of(dev_plan, NODEPOOL, "gpu-small")
    large = spec_of(dev_plan, NODEPOOL, "gpu-large")
    cpu = spec_of(dev_plan, NODEPOOL, "cpu")
    assert requirement(small, "node.kubernetes.io/instance-type") == ["g5.12xlarge"]
    assert requirement(small, "karpenter.sh/capacity-type") == ["on-demand"]
    assert requirement(large, "karpenter.sh/capacity-type") == ["spot", "on-demand"]
    assert requirement(cpu, "node.kubernetes.io/instance-type") == ["m6i.2xlarge", "m6i.4xlarge"]
    for gpu_pool in (small, large):
        assert gpu_pool["template"]["spec"]["taints"] == [GPU_TAINT]
        assert gpu_pool["template"]["spec"]["expireAfter"] == "720h"
    assert "taints" not in cpu["template"]["spec"]
    assert (
        small["template"]["metadata"]["labels"][
            "training-platform.node-restriction.kubernetes.io/pool"
        ]
        == "gpu-small"
    )
    assert small["template"]["spec"]["nodeClassRef"] == {
        "group": "karpenter.k8s.aws",
        "kind": "EC2NodeClass",
        "name": "gpu-small",
    }


def test_gpu_nodes_are_only_removed_when_empty(dev_plan):
    for pool in ("gpu-small", "gpu-large"):
        disruption = spec_of(dev_plan, NODEPOOL, pool)["disruption"]
        assert disruption["consolidationPolicy"] == "WhenEmpty"
        assert {"nodes": "0", "reasons": ["Underutilized"]} in disruption["budgets"]
        # No reasons: one node at a time for every reason, repair's too (Karpenter 1.15).
        assert {"nodes": "1"} in disruption["budgets"]
    assert (
        spec_of(dev_plan, NODEPOOL, "cpu")["disruption"]["consolidationPolicy"]
        == "WhenEmptyOrUnderutilized"
    )


def test_node_class_security_settings(stack_plan):
    cluster = stack_plan.one("eks:index:Cluster").inputs["name"]
    for resource in stack_plan.of_type(NODECLASS):
        spec = resource.inputs["spec"]
        assert spec["amiSelectorTerms"] == [{"alias": "al2023@v20261020"}]
        assert spec["subnetSelectorTerms"] == [{"tags": {"karpenter.sh/discovery": cluster}}]
        assert spec["securityGroupSelectorTerms"] == [{"tags": {"karpenter.sh/discovery": cluster}}]
        assert spec["metadataOptions"]["httpTokens"] == "required"
        assert spec["metadataOptions"]["httpPutResponseHopLimit"] == 1
        (root,) = spec["blockDeviceMappings"]
        assert root["ebs"]["encrypted"] is True and root["ebs"]["volumeType"] == "gp3"
        assert spec["instanceProfile"] == f"KarpenterNode-{cluster}"


def test_gpu_root_volume_fits_cuda_images_and_ami_alias_follows_config(dev_plan):
    assert (
        spec_of(dev_plan, NODECLASS, "gpu-small")["blockDeviceMappings"][0]["ebs"]["volumeSize"]
        == "200Gi"
    )
    assert (
        spec_of(dev_plan, NODECLASS, "cpu")["blockDeviceMappings"][0]["ebs"]["volumeSize"]
        == "100Gi"
    )
    plan = plan_of("dev", karpenter={"amiAlias": "al2023@v20260201"})
    assert spec_of(plan, NODECLASS, "gpu-small")["amiSelectorTerms"] == [
        {"alias": "al2023@v20260201"}
    ]


def test_efa_pool_gets_an_efa_interface_per_network_card(dev_plan):
    interfaces = spec_of(dev_plan, NODECLASS, "gpu-large")["networkInterfaces"]
    assert interfaces[0] == {"networkCardIndex": 0, "deviceIndex": 0, "interfaceType": "interface"}
    efa_cards = sorted(
        i["networkCardIndex"] for i in interfaces if i["interfaceType"] == "efa-only"
    )
    assert efa_cards == [0, 1, 2, 3]  # p4d.24xlarge has four network cards
    assert "networkInterfaces" not in spec_of(dev_plan, NODECLASS, "gpu-small")


def statements(plan):
    policy = plan.one("aws:iam/rolePolicy:RolePolicy", "karpenter-controller").inputs["policy"]
    return json.loads(policy)["Statement"]


def test_controller_policy_is_scoped(dev_plan):
    for statement in statements(dev_plan):
        actions = (
            statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        )
        assert "*" not in actions and not any(a.endswith(":*") for a in actions)
        mutating = [
            a for a in actions if not a.split(":")[1].startswith(("Describe", "Get", "List"))
        ]
        if statement["Resource"] == "*":
            assert not mutating or statement.get("Condition"), statement["Sid"]
    by_sid = {s["Sid"]: s for s in statements(dev_plan)}
    deletion = by_sid["AllowScopedDeletion"]
    assert deletion["Condition"]["StringEquals"] == {
        "aws:ResourceTag/kubernetes.io/cluster/tp-dev": "owned"
    }
    assert by_sid["AllowRegionalReadActions"]["Condition"] == {
        "StringEquals": {"aws:RequestedRegion": "us-west-2"}
    }
    assert (
        by_sid["AllowPassingInstanceRole"]["Resource"]
        == "arn:aws:iam::123456789012:role/KarpenterNode-tp-dev"
    )
    assert (
        by_sid["AllowInterruptionQueueActions"]["Resource"]
        == "arn:aws:sqs:us-west-2:123456789012:karpenter-tp-dev"
    )
    assert not any("CreateInstanceProfile" in json.dumps(s) for s in statements(dev_plan))


def test_controller_identity_is_pod_identity_for_the_chart_service_account(dev_plan):
    role = dev_plan.one("aws:iam/role:Role", "karpenter-controller").inputs
    (trust,) = json.loads(role["assumeRolePolicy"])["Statement"]
    assert trust["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    assert sorted(trust["Action"]) == ["sts:AssumeRole", "sts:TagSession"]
    association = dev_plan.one(
        "aws:eks/podIdentityAssociation:PodIdentityAssociation", "karpenter-controller"
    ).inputs
    values = dev_plan.one(RELEASE, "karpenter").inputs["values"]
    assert (association["namespace"], association["serviceAccount"]) == (
        "kube-system",
        values["serviceAccount"]["name"],
    )


def test_nodes_join_through_an_ec2_linux_access_entry(dev_plan):
    entry = dev_plan.one("aws:eks/accessEntry:AccessEntry", "karpenter-node").inputs
    assert entry["type"] == "EC2_LINUX"
    assert entry["principalArn"] == "arn:aws:iam::123456789012:role/KarpenterNode-tp-dev"
    profile = dev_plan.one("aws:iam/instanceProfile:InstanceProfile").inputs
    assert profile["role"] == "KarpenterNode-tp-dev"


def test_interruption_queue_and_its_five_rules(dev_plan):
    queue = dev_plan.one("aws:sqs/queue:Queue").inputs
    assert queue["messageRetentionSeconds"] == 300 and queue["sqsManagedSseEnabled"] is True
    policy = json.loads(dev_plan.one("aws:sqs/queuePolicy:QueuePolicy").inputs["policy"])
    (deny,) = [s for s in policy["Statement"] if s["Effect"] == "Deny"]
    assert deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    rules = dev_plan.of_type("aws:cloudwatch/eventRule:EventRule")
    patterns = sorted(tuple(json.loads(r.inputs["eventPattern"])["detail-type"]) for r in rules)
    assert patterns == sorted((d,) for _, d in INTERRUPTION_EVENTS.values())
    assert len(rules) == 5
    targets = dev_plan.of_type("aws:cloudwatch/eventTarget:EventTarget")
    assert sorted(t.inputs["rule"] for t in targets) == sorted(r.inputs["name"] for r in rules)
    assert all(t.inputs["arn"].endswith(":karpenter-interruption") for t in targets)


def test_helm_release_pinned_and_configured(dev_plan):
    release = dev_plan.one(RELEASE, "karpenter").inputs
    assert (release["chart"], release["version"]) == (
        KARPENTER_CHART.chart,
        KARPENTER_CHART.version,
    )
    assert release["version"] == "1.15.1"
    settings = release["values"]["settings"]
    assert settings == {
        "clusterName": "tp-dev",
        "interruptionQueue": "karpenter-tp-dev",
        "featureGates": {"nodeRepair": True},
        "awsFeatureGates": {"rebootForRepair": True},
    }
    assert release["values"]["nodeSelector"] == {"training-platform/node-role": "system"}


def test_custom_resources_wait_for_the_karpenter_chart(dev_plan):
    release_urn = dev_plan.one(RELEASE, "karpenter").urn
    for resource in dev_plan.of_type(NODEPOOL) + dev_plan.of_type(NODECLASS):
        assert release_urn in resource.dependencies


def test_device_plugin_runs_only_on_gpu_nodes(dev_plan):
    plugin = dev_plan.one(RELEASE, "nvidia-device-plugin").inputs
    assert plugin["version"] == NVIDIA_DEVICE_PLUGIN_CHART.version
    selector = plugin["values"]["nodeSelector"]
    for pool in ("gpu-small", "gpu-large"):
        labels = spec_of(dev_plan, NODEPOOL, pool)["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items()
    assert (
        not selector.items()
        <= spec_of(dev_plan, NODEPOOL, "cpu")["template"]["metadata"]["labels"].items()
    )
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in plugin[
        "values"
    ]["tolerations"]


def test_no_device_plugin_without_gpu_pools():
    cpu_only = [{"name": "cpu", "instanceTypes": ["m6i.large"], "maxNodes": 2}]
    plan = plan_of("dev", nodePools=cpu_only, jobs=[], devServers=NO_DEV_SERVERS)
    assert not [r for r in plan.of_type(RELEASE) if r.name == "nvidia-device-plugin"]


def flavor_quotas(plan, queue):
    (resource,) = [r for r in plan.of_type(CLUSTER_QUEUE) if r.inputs["metadata"]["name"] == queue]
    (group,) = resource.inputs["spec"]["resourceGroups"]
    return {f["name"]: {r["name"]: r for r in f["resources"]} for f in group["flavors"]}


def test_max_nodes_edit_moves_that_pools_limits_quota_and_cost_together_and_nothing_else(dev_plan):
    pools = copy.deepcopy(stack_values("dev")["training-platform:nodePools"])
    pools[0]["maxNodes"] = 6
    edited = plan_of("dev", nodePools=pools)
    before = {r.urn: r.as_plan_entry() for r in dev_plan.resources}
    after = {r.urn: r.as_plan_entry() for r in edited.resources}
    assert before.keys() == after.keys()
    changed = sorted(urn.rsplit("::", 1)[1] for urn in before if before[urn] != after[urn])
    assert changed == ["nodepools-gpu-small", "queues-platform", "queues-team-research"]
    # Karpenter limits: 6 x g5.12xlarge (4 GPUs, 48 vCPU, 192 GiB).
    assert spec_of(edited, NODEPOOL, "gpu-small")["limits"] == {
        "nodes": "6",
        "nvidia.com/gpu": "24",
        "cpu": "288",
        "memory": "1152Gi",
    }
    # Kueue: the platform quota equals the new ceiling; the research team may borrow half of it.
    old, new = flavor_quotas(dev_plan, "platform"), flavor_quotas(edited, "platform")
    assert {k: v for k, v in new.items() if k != "gpu-small"} == {
        k: v for k, v in old.items() if k != "gpu-small"
    }
    assert {r: q["nominalQuota"] for r, q in new["gpu-small"].items()} == {
        "nvidia.com/gpu": "24",
        "cpu": "288",
        "memory": "1152Gi",
    }
    research = flavor_quotas(edited, "team-research")["gpu-small"]
    assert research["nvidia.com/gpu"] == {
        "name": "nvidia.com/gpu",
        "nominalQuota": "0",
        "borrowingLimit": "12",
    }
    # Cost ceiling: only the gpu-small row and the total change.
    edited_config = parse_stack_config(stack_values("dev", nodePools=pools), "Pulumi.dev.yaml")
    old_rows = summary(load_stack_file("dev"), dev_plan).splitlines()
    new_rows = summary(edited_config, edited).splitlines()
    differing = [(a, b) for a, b in zip(old_rows, new_rows, strict=True) if a != b]
    # The pool's row, the pools' total, research's borrowing row, the cost's NodePools and
    # ceiling (the floor and the expected figure stay: gpt-small asks 4 nodes either way).
    assert [a.split()[0] for a, _ in differing] == [
        "gpu-small",
        "total",
        "research",
        "NodePools",
        "ceiling",
    ]
    # 6 vs 4 x ($5.672 + a 200 GiB gp3 disk at $0.08/GiB-month)
    assert "34.16" in differing[0][1] and "22.78" in differing[0][0]


@pytest.mark.parametrize(
    ("pool", "key_path", "message"),
    [
        (
            {"instanceTypes": ["g5.13xlarge"]},
            "nodePools[gpu].instanceTypes[0]",
            "not a known instance type",
        ),
        ({"instanceTypes": ["g5.xlarge"], "efa": True}, "nodePools[gpu]", "g5.xlarge has no EFA"),
        (
            {"instanceTypes": ["p4d.24xlarge"], "efa": True},
            "nodePools[gpu].availabilityZone",
            "missing; an EFA pool keeps its nodes in one cluster placement group",
        ),
        ({"instanceTypes": ["g5.xlarge", "m6i.large"]}, "nodePools[gpu]", "mixes GPU and CPU"),
        ({"maxNodes": 0}, "nodePools[gpu].maxNodes", "greater than or equal to 1"),
        (
            {"capacityTypes": ["ondemand"]},
            "nodePools[gpu].capacityTypes[0]",
            "'on-demand', 'spot' or 'reserved'",
        ),
        ({"name": "GPU_small"}, "nodePools[0].name", "does not match"),
    ],
)
def test_bad_pool_config_is_a_config_error(pool, key_path, message):
    base = {"name": "gpu", "instanceTypes": ["g5.12xlarge"], "maxNodes": 2}
    with pytest.raises(ConfigError) as caught:
        parse_stack_config(stack_values("dev", nodePools=[{**base, **pool}]), "Pulumi.dev.yaml")
    line = next(x for x in str(caught.value).splitlines() if f"training-platform:{key_path}:" in x)
    assert message in line


def test_repeated_pool_names_are_a_config_error():
    pool = {"name": "gpu", "instanceTypes": ["g5.12xlarge"], "maxNodes": 2}
    with pytest.raises(ConfigError, match="nodePools names gpu repeat"):
        parse_stack_config(stack_values("dev", nodePools=[pool, pool]), "Pulumi.dev.yaml")


def test_efa_pool_zone_must_have_a_subnet_of_the_stack():
    pools = [
        {**p, "availabilityZone": "us-west-2c"} if p.get("efa") else p
        for p in stack_values("dev")["training-platform:nodePools"]
    ]
    with pytest.raises(ConfigError) as caught:
        plan_of("dev", nodePools=pools)  # azCount 2: us-west-2a and us-west-2b
    assert str(caught.value).splitlines()[1] == (
        "  training-platform:nodePools[gpu-large].availabilityZone: us-west-2c has no subnet of "
        "this stack; allowed: us-west-2a, us-west-2b (network.azCount picks the first AZs)"
    )


@pytest.mark.parametrize("node_repair", [True, False])
def test_the_controller_may_reboot_only_its_own_instances_and_only_when_repair_reboots(node_repair):
    """ec2:RebootInstances beside TerminateInstances, under the same tag scope (upstream's v1.15
    policy), and only with the RebootForRepair gate, which node repair with GPU pools turns on."""
    plan = plan_of("dev", karpenter={"nodeRepair": node_repair})
    (deletion,) = [s for s in statements(plan) if s.get("Sid") == "AllowScopedDeletion"]
    assert ("ec2:RebootInstances" in deletion["Action"]) == node_repair
    owned = {"aws:ResourceTag/kubernetes.io/cluster/tp-dev": "owned"}
    assert deletion["Condition"]["StringEquals"] == owned
    settings = plan.one(RELEASE, "karpenter").inputs["values"]["settings"]
    assert ("awsFeatureGates" in settings) == node_repair


def test_the_rules_were_read_for_the_pinned_karpenter():
    """A Karpenter bump fails here until karpenter_rules.py is read again for the new release."""
    assert karpenter_rules.READ_FOR == KARPENTER_CHART.version


@pytest.mark.parametrize("version", sorted(KUBERNETES_VERSIONS))
def test_the_pinned_karpenter_supports_every_supported_kubernetes_version(version):
    """Karpenter's compatibility matrix: a Kubernetes minor it does not list would launch nodes it
    was not built for (1.37 needs 1.15.x)."""
    oldest, newest = karpenter_rules.COMPATIBILITY[version]
    pinned = tuple(int(n) for n in KARPENTER_CHART.version.split(".")[:2])
    assert oldest <= pinned and (newest is None or pinned <= newest)
