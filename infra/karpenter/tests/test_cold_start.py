"""Fast GPU node start: images unpack onto NVMe instance store where the type has it, onto a root
volume with the throughput FastImagePull needs where it does not, nodeadm pulls in parallel; and
the cold-start model that Kueue's timeouts come from moves with the instance type and the disk."""

import jsonschema
import pytest
import yaml

from infra.core.catalog import load_catalog
from infra.core.config import ConfigError
from infra.core.tests.crd_schema import cel_violations, conformance_errors
from infra.karpenter.cold_start import IMAGES, cold_start, fast_image_pull, pull_seconds
from infra.karpenter.config import NodePoolConfig
from infra.stack.loading import parse_stack_config
from tests.plugin import stack_values

NODECLASS = "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass"

# nodeadm's NodeConfig as written down from awslabs/amazon-eks-ami at tag v20260724 (commit
# 81fec2e895854f599974fe4d3d72f61c0a9aaffa): the group and kind (nodeadm/api/core.go,
# nodeadm/api/v1alpha1/groupversion_info.go), the fields of NodeConfig and NodeConfigSpec
# (nodeadm/api/v1alpha1/nodeconfig_types.go; spec's structs the platform does not set are plain
# objects) and the Feature enum (the +kubebuilder:validation:Enum on `type Feature string`).
# Closed: nodeadm's decoder is not strict (nodeadm/internal/api/bridge/decode.go), so a misspelt
# key is dropped without a word, and so is a gate it does not know
# (nodeadm/internal/api/featuregates.go, IsFeatureEnabled): either way the feature stays off.
NODEADM_FEATURES = ["InstanceIdNodeName", "FastImagePull"]
NODE_CONFIG = {
    "type": "object",
    "properties": {
        "apiVersion": {"const": "node.eks.aws/v1alpha1"},
        "kind": {"const": "NodeConfig"},
        "metadata": {"type": "object"},
        "spec": {
            "type": "object",
            "properties": {
                "cluster": {"type": "object"},
                "containerd": {"type": "object"},
                "instance": {"type": "object"},
                "kubelet": {"type": "object"},
                "featureGates": {
                    "type": "object",
                    "propertyNames": {"enum": NODEADM_FEATURES},
                    "additionalProperties": {"type": "boolean"},
                },
            },
            "additionalProperties": False,
        },
    },
    "required": ["apiVersion", "kind"],
    "additionalProperties": False,
}


def node_config_errors(node_config: dict) -> list[str]:
    return [
        f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
        for e in jsonschema.Draft7Validator(NODE_CONFIG).iter_errors(node_config)
    ]


def node_classes(plan) -> dict[str, dict]:
    return {r.inputs["metadata"]["name"]: r.inputs for r in plan.of_type(NODECLASS)}


def test_pools_with_nvme_unpack_images_on_a_raid0_of_it_the_others_on_ebs(dev_plan):
    """dev: g5.12xlarge (1 x 3800 GB NVMe) and p4d.24xlarge (8 x 1000 GB) have instance store,
    m6i has none (AWS instance store volume table, infra/core/catalog/instance_types.yaml)."""
    classes = node_classes(dev_plan)
    assert classes["gpu-small"]["spec"]["instanceStorePolicy"] == "RAID0"
    assert classes["gpu-large"]["spec"]["instanceStorePolicy"] == "RAID0"
    assert "instanceStorePolicy" not in classes["cpu"]["spec"]
    root = {name: c["spec"]["blockDeviceMappings"][0]["ebs"] for name, c in classes.items()}
    # nodeadm's FastImagePull guide: at least 600 MiB/s where images unpack onto the root volume.
    assert root["cpu"]["throughput"] >= 600
    assert root["gpu-small"]["throughput"] == 125  # gp3 baseline: the OS only
    for ebs in root.values():
        # gp3: at most 0.25 MiB/s per provisioned IOPS, 3000 to 16000 IOPS.
        assert 3000 <= ebs["iops"] <= 16000 and ebs["throughput"] <= ebs["iops"] / 4
    for manifest in classes.values():
        assert conformance_errors(manifest) == []
        assert cel_violations(manifest) == []


def test_every_node_class_turns_on_nodeadms_parallel_image_pull(stack_plan):
    for name, manifest in node_classes(stack_plan).items():
        node_config = yaml.safe_load(manifest["spec"]["userData"])
        assert node_config_errors(node_config) == [], name
        assert node_config["spec"]["featureGates"] == {"FastImagePull": True}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"featureGate": {"FastImagePull": True}}, "'featureGate' was unexpected"),
        ({"featureGates": {"FastImagePul": True}}, "'FastImagePul' is not one of"),
        ({"featureGates": {"FastImagePull": "true"}}, "'true' is not of type 'boolean'"),
    ],
)
def test_the_nodeadm_schema_catches_a_misspelt_setting(spec, expected):
    node_config = {"apiVersion": "node.eks.aws/v1alpha1", "kind": "NodeConfig", "spec": spec}
    assert any(expected in e for e in node_config_errors(node_config))


def pool(**fields) -> NodePoolConfig:
    return NodePoolConfig.model_validate({"name": "p", "maxNodes": 1, **fields})


def test_the_root_disks_throughput_bounds_a_pull_without_instance_store():
    m6i = load_catalog()["m6i.2xlarge"]
    image = IMAGES["runtime"]
    slow = pull_seconds(image, pool(instanceTypes=["m6i.2xlarge"], diskThroughputMibps=125), m6i)
    fast = pull_seconds(image, pool(instanceTypes=["m6i.2xlarge"]), m6i)
    assert slow > fast
    nvme = pool(instanceTypes=["g5.12xlarge"], diskThroughputMibps=125)
    assert cold_start(nvme).disk.startswith("NVMe RAID0")


def test_parallel_pull_applies_where_nodeadm_turns_it_on():
    """nodeadm/internal/containerd/config.go UseSOCISnapshotter: 4 vCPU and 7 GiB at least."""
    catalog = load_catalog()
    assert not fast_image_pull(catalog["m6i.large"])  # 2 vCPU
    assert fast_image_pull(catalog["m6i.xlarge"]) and fast_image_pull(catalog["g5.xlarge"])
    small = cold_start(pool(instanceTypes=["m6i.large"]))
    large = cold_start(pool(instanceTypes=["m6i.xlarge"]))
    assert small.pull_s > large.pull_s and not small.fast_pull


def test_a_pool_takes_the_cold_start_of_its_slowest_type():
    mixed = cold_start(pool(instanceTypes=["g5.48xlarge", "p4d.24xlarge"], efa=True))
    assert mixed.instance_type == "p4d.24xlarge"
    assert mixed.disk == "NVMe RAID0 8 x 1000 GB"


def test_catalog_has_the_figures_the_model_needs():
    catalog = load_catalog()
    for name in catalog.names():
        assert catalog[name].network_gbps > 0, name
    assert all(catalog[name].nvme for name in catalog.names(gpu=True))
    assert not any(catalog[name].nvme for name in catalog.names(gpu=False))


@pytest.mark.parametrize("throughput", [100, 1001])
def test_root_throughput_outside_what_karpenter_takes_is_a_config_error(throughput):
    pools = stack_values("dev")["training-platform:nodePools"]
    pools = [{**p, "diskThroughputMibps": throughput} if p["name"] == "cpu" else p for p in pools]
    values = stack_values("dev")
    values["training-platform:nodePools"] = pools
    with pytest.raises(ConfigError, match=r"nodePools\[cpu\]\.diskThroughputMibps"):
        parse_stack_config(values, "Pulumi.dev.yaml")
