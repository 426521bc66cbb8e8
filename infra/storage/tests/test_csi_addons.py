"""The CSI add-ons' configuration at each pinned build (infra/storage/csi_addons.py)."""

import pytest

from infra.core.versions import KUBERNETES_VERSIONS
from infra.storage.csi_addons import (
    EBS_ADDON,
    EFS_ADDON,
    FSX_ADDON,
    addon_configuration,
    driver_version,
    key_paths,
    schema_lacks,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("kubernetes", sorted(KUBERNETES_VERSIONS))
def test_ebs_node_agent_writes_no_node_where_its_build_can_say_so(kubernetes):
    """disableMutation came with the EBS chart 2.52.0 (driver v1.52.0); the 1.51 chart's schema
    refuses unknown keys under node.serviceAccount, so older builds are passed nothing there."""
    build = KUBERNETES_VERSIONS[kubernetes].addons[EBS_ADDON]
    node = (addon_configuration(EBS_ADDON, build) or {}).get("node")
    if driver_version(build) >= (1, 52, 0):
        assert node == {"serviceAccount": {"disableMutation": True}}
    else:
        assert node is None


def test_the_fsx_node_agent_keeps_off_hybrid_and_fargate_nodes():
    (term,) = addon_configuration(FSX_ADDON, "v1.7.0-eksbuild.1")["node"]["affinity"][
        "nodeAffinity"
    ]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term == {
        "matchExpressions": [
            {
                "key": "eks.amazonaws.com/compute-type",
                "operator": "NotIn",
                "values": ["fargate", "hybrid"],
            }
        ]
    }
    assert addon_configuration(EFS_ADDON, "v2.1.13-eksbuild.1") is None


def test_key_paths_stop_at_kubernetes_objects_and_the_schema_is_walked_by_properties():
    values = addon_configuration(EBS_ADDON, "v1.57.1-eksbuild.1")
    assert key_paths(values) == [
        ("controller", "nodeSelector"),
        ("node", "serviceAccount", "disableMutation"),
    ]
    schema = {"properties": {"node": {"properties": {"serviceAccount": {"properties": {}}}}}}
    assert schema_lacks(schema, ("node", "serviceAccount", "disableMutation"))
    assert not schema_lacks(schema, ("node", "serviceAccount"))


def test_a_build_that_is_no_eks_build_is_named():
    with pytest.raises(ValueError, match="'1.57.1' is not an EKS add-on build"):
        driver_version("1.57.1")
