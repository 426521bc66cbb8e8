"""Cluster component: EKS settings that matter for security and operations, add-ons, node group."""

import json

import pytest

from infra.core.change import Change, Step
from infra.core.offline import SECRET, RecordedResource
from infra.core.versions import KUBERNETES_VERSIONS
from infra.eks.cluster import CONTROL_PLANE_LOG_TYPES
from infra.eks.day_two import LOG_GROUP, log_retention
from tests.plugin import plan_of


def eks_inputs(plan):
    return plan.one("eks:index:Cluster").inputs


def test_authentication_is_api_with_no_default_node_group_or_oidc(stack_plan):
    cluster = eks_inputs(stack_plan)
    assert cluster["authenticationMode"] == "API"
    assert cluster["skipDefaultNodeGroup"] is True
    assert cluster["createOidcProvider"] is False
    assert cluster["nodeAssociatePublicIpAddress"] is False


def test_all_control_plane_logs_on(stack_plan):
    assert sorted(eks_inputs(stack_plan)["enabledClusterLogTypes"]) == sorted(
        CONTROL_PLANE_LOG_TYPES
    )
    assert len(CONTROL_PLANE_LOG_TYPES) == 5


def test_secrets_encrypted_with_a_rotating_kms_key(stack_plan):
    key = stack_plan.one("aws:kms/key:Key", "cluster-secrets")
    assert key.inputs["enableKeyRotation"] is True
    assert eks_inputs(stack_plan)["encryptionConfigKeyArn"].startswith("arn:aws:kms:")
    assert key.urn in stack_plan.one("eks:index:Cluster").dependencies


def test_dev_endpoint_is_public_and_prod_restricted(dev_plan, prod_plan):
    assert eks_inputs(dev_plan)["publicAccessCidrs"] == ["0.0.0.0/0"]
    prod = eks_inputs(prod_plan)
    assert prod["endpointPrivateAccess"] is True
    assert prod["publicAccessCidrs"] == ["203.0.113.0/24", "198.51.100.0/24"]


def test_private_only_endpoint_sends_no_cidrs():
    plan = plan_of("dev", cluster={"endpoint": {"publicAccess": False}})
    cluster = eks_inputs(plan)
    assert cluster["endpointPublicAccess"] is False and cluster["endpointPrivateAccess"] is True
    assert "publicAccessCidrs" not in cluster


def test_admins_get_cluster_admin_access_entries(prod_plan):
    entries = eks_inputs(prod_plan)["accessEntries"]
    assert entries == {
        "admin-0": {
            "principalArn": "arn:aws:iam::123456789012:role/platform-admins",
            "accessPolicies": {
                "cluster-admin": {
                    "policyArn": "arn:aws:eks::aws:cluster-access-policy/"
                    "AmazonEKSClusterAdminPolicy",
                    "accessScope": {"type": "cluster"},
                }
            },
        }
    }


def test_core_addons_pinned(stack_plan):
    cluster = eks_inputs(stack_plan)
    pins = KUBERNETES_VERSIONS[cluster["version"]].addons
    assert cluster["vpcCniOptions"]["addonVersion"] == pins["vpc-cni"]
    assert cluster["kubeProxyAddonOptions"]["version"] == pins["kube-proxy"]
    agent = stack_plan.one("aws:eks/addon:Addon", "cluster-eks-pod-identity-agent").inputs
    assert agent["addonName"] == "eks-pod-identity-agent"
    assert agent["addonVersion"] == pins["eks-pod-identity-agent"]
    assert agent["clusterName"] == cluster["name"]


def test_coredns_is_a_managed_addon_at_the_pin_created_once_nodes_exist(stack_plan):
    # pulumi-eks creates no managed CoreDNS for a cluster without its default node group unless
    # told to (and a version alone does not): the program owns it, after the system nodes.
    assert eks_inputs(stack_plan)["corednsAddonOptions"]["enabled"] is False
    coredns = stack_plan.one("aws:eks/addon:Addon", "cluster-coredns")
    assert coredns.inputs["addonName"] == "coredns"
    pins = KUBERNETES_VERSIONS[eks_inputs(stack_plan)["version"]].addons
    assert coredns.inputs["addonVersion"] == pins["coredns"]
    assert coredns.inputs["resolveConflictsOnCreate"] == "OVERWRITE"
    nodes = stack_plan.one("aws:eks/nodeGroup:NodeGroup", "cluster-system")
    assert nodes.urn in coredns.dependencies


def test_system_node_group_sized_from_config_on_private_subnets(prod_plan):
    group = prod_plan.one("aws:eks/nodeGroup:NodeGroup", "cluster-system").inputs
    assert group["instanceTypes"] == ["m6i.xlarge"]
    assert group["capacityType"] == "ON_DEMAND"
    assert group["scalingConfig"] == {"minSize": 3, "desiredSize": 3, "maxSize": 6}
    subnets = {r.name: r.outputs["id"] for r in prod_plan.of_type("aws:ec2/subnet:Subnet")}
    assert group["subnetIds"] == [subnets[f"network-private-{i}"] for i in range(3)]
    # The control plane's interfaces go to subnets of their own, where no node is.
    control_plane = [subnets[f"network-control-plane-{i}"] for i in range(3)]
    assert eks_inputs(prod_plan)["subnetIds"] == control_plane
    assert not set(control_plane) & set(group["subnetIds"])
    assert group["labels"] == {"training-platform/node-role": "system"}
    # Tainted: only controllers, which tolerate it, run there.
    assert group["taints"] == [
        {"key": "CriticalAddonsOnly", "value": "true", "effect": "NO_SCHEDULE"}
    ]


def test_system_nodes_use_imdsv2_one_hop_and_encrypted_root(stack_plan):
    template = stack_plan.one("aws:ec2/launchTemplate:LaunchTemplate", "cluster-system-node").inputs
    assert template["metadataOptions"] == {
        "httpEndpoint": "enabled",
        "httpTokens": "required",
        "httpPutResponseHopLimit": 1,
    }
    (root,) = template["blockDeviceMappings"]
    assert root["ebs"]["encrypted"] == "true" and root["ebs"]["volumeType"] == "gp3"


def test_node_role_trusts_ec2_only(dev_plan):
    role = dev_plan.one("aws:iam/role:Role", "cluster-system-node").inputs
    (statement,) = json.loads(role["assumeRolePolicy"])["Statement"]
    assert statement["Principal"] == {"Service": "ec2.amazonaws.com"}


def test_cluster_security_group_tagged_for_karpenter(dev_plan):
    tag = dev_plan.one("aws:ec2/tag:Tag", "cluster-cluster-sg-discovery").inputs
    assert tag["key"] == "karpenter.sh/discovery" and tag["value"] == "tp-dev"
    assert tag["resourceId"].startswith("sg-")


def test_kubernetes_provider_gets_the_cluster_kubeconfig(stack_plan):
    provider = stack_plan.one("pulumi:providers:kubernetes", "cluster-k8s")
    assert provider.inputs["kubeconfig"] == SECRET
    assert stack_plan.one("eks:index:Cluster").urn in provider.dependencies


@pytest.mark.parametrize(
    ("old", "new", "lost"), [(90, 30, "90 -> 30"), (90, 365, None), (0, 7, "forever -> 7")]
)
def test_a_shorter_log_retention_names_the_logs_it_deletes(old, new, lost):
    """CloudWatch deletes the events older than a shortened retention (0: kept forever)."""

    def group(days):
        inputs = {"name": "/aws/eks/tp/cluster", "retentionInDays": days}
        return RecordedResource("urn:x::logs", LOG_GROUP, "logs", "", "", [], inputs, True)

    step = Step("update", "urn:x::logs", LOG_GROUP, group(old), group(new), ["retentionInDays"])
    change = Change([step], "prod", frozenset(), {}, ())
    log_retention(change)
    named = change.found.losses
    assert named[0].startswith(f"log group logs: retention {lost} days") if lost else not named
