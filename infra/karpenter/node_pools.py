"""NodePools: Karpenter EC2NodeClasses and NodePools, one pair per pool in stack config.

A pool's `maxNodes` is the single knob: its Karpenter `limits` here, its Kueue quota and the
plan's cost ceiling all come from NodePoolConfig.ceiling().
"""

import json

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s
import yaml

from infra.core.config import ConfigError
from infra.core.context import ClusterContext
from infra.core.nodes import EFA_NODE_LABELS, GPU_NODE_LABELS, GPU_TAINT, POOL_LABEL
from infra.core.tags import POOL_TAG
from infra.karpenter.config import NodePoolConfig
from infra.karpenter.facts import RESERVATIONS_ANNOTATION
from infra.vpc.network import discovery_tag

# POOL_LABEL reaches a pool's nodes through its template labels: Karpenter sets them on the Node
# through the API once it registers (kubernetes-sigs/karpenter v1.14.1
# pkg/controllers/nodeclaim/lifecycle/registration.go, syncNode), and leaves the
# node-restriction domain out of the kubelet's --node-labels (aws/karpenter-provider-aws v1.14.1
# pkg/providers/amifamily/resolver.go, RejectForbiddenLabels); its NodePool CRD refuses only
# karpenter.sh, karpenter.k8s.aws and kubernetes.io/hostname template labels.
GP3_BASELINE_IOPS = 3000
# The user data of every EC2NodeClass, a nodeadm NodeConfig (node.eks.aws/v1alpha1).
FAST_IMAGE_PULL_NODE_CONFIG = {
    "apiVersion": "node.eks.aws/v1alpha1",
    "kind": "NodeConfig",
    "spec": {"featureGates": {"FastImagePull": True}},
}
# No terminationGracePeriod on any pool: with one, Karpenter picks nodes whose pods carry
# karpenter.sh/do-not-disrupt as drift candidates and deletes those pods when it runs out
# (kubernetes-sigs/karpenter v1.14.1 pkg/controllers/disruption/types.go NewCandidate: an
# EventualDisruptionClass method, which Drift is, ignores the pods' blocking when the NodeClaim
# has a terminationGracePeriod; v1.15's annotations reference says the same). Without one,
# drift (an AMI or Kubernetes upgrade, a template edit) replaces only nodes that run no job or
# DevServer pod; `python -m deploy.roll` moves running jobs off drifted nodes on purpose, each
# restarting once from its checkpoint.


def ec2_node_class_spec(
    pool: NodePoolConfig,
    cluster_name: str,
    instance_profile: str,
    ami_alias: str,
    tags: dict,
    placement_group: str | None = None,
) -> dict:
    throughput = pool.root_throughput_mibps()
    spec = {
        "instanceProfile": instance_profile,
        # For GPU instance types the alias resolves to the AL2023 NVIDIA variant by itself.
        "amiSelectorTerms": [{"alias": ami_alias}],
        "subnetSelectorTerms": [{"tags": discovery_tag(cluster_name)}],
        "securityGroupSelectorTerms": [{"tags": discovery_tag(cluster_name)}],
        "blockDeviceMappings": [
            {
                "deviceName": "/dev/xvda",
                "ebs": {
                    # CUDA images run to tens of GB; pulling several must not fill the root disk.
                    "volumeSize": f"{pool.disk_size_gib}Gi",
                    "volumeType": "gp3",
                    # Where images unpack onto it, its throughput bounds every cold start.
                    "throughput": throughput,
                    # gp3 allows at most 0.25 MiB/s per provisioned IOPS (AWS EBS user guide,
                    # "General Purpose SSD volumes"); 3000 IOPS is gp3's baseline, included.
                    "iops": max(GP3_BASELINE_IOPS, 4 * throughput),
                    "encrypted": True,
                    "deleteOnTermination": True,
                },
            }
        ],
        # nodeadm's FastImagePull: the SOCI snapshotter pulls and unpacks in parallel, 20
        # connections per image (awslabs/amazon-eks-ami nodeadm; nodeadm ignores it below 4 vCPU
        # and 7 GiB). Karpenter adds this NodeConfig to its own in the MIME user data it builds
        # (pkg/providers/amifamily/bootstrap/nodeadm.go, parseUserData). The kubelet already
        # pulls images in parallel: nodeadm writes serializeImagePulls: false by default
        # (nodeadm/internal/kubelet/config.go).
        "userData": yaml.safe_dump(FAST_IMAGE_PULL_NODE_CONFIG, sort_keys=False),
        # IMDSv2 only, one hop: pods cannot reach the node's credentials.
        "metadataOptions": {
            "httpEndpoint": "enabled",
            "httpProtocolIPv6": "disabled",
            "httpPutResponseHopLimit": 1,
            "httpTokens": "required",
        },
        "tags": {**tags, POOL_TAG: pool.name},
    }
    if pool.instance_store:
        # Karpenter has nodeadm build a RAID0 of the NVMe instance store and mount containerd's,
        # the SOCI snapshotter's and the pod logs' directories on it (nodeadm LocalStorageOptions;
        # Karpenter docs, concepts/nodeclasses.md, spec.instanceStorePolicy): images unpack onto
        # local NVMe instead of the network-attached root volume, and ephemeral-storage is the
        # instance store's size.
        spec["instanceStorePolicy"] = "RAID0"
    if pool.efa:
        spec["networkInterfaces"] = efa_network_interfaces(pool.efa_network_cards)
    if placement_group:
        spec["placementGroupSelector"] = {"name": placement_group}
    if pool.capacity_reservations:
        # Karpenter launches into these first where the NodePool allows `reserved`; Capacity
        # Blocks are selected the same way (Karpenter docs, tasks/odcrs.md, v1.14).
        spec["capacityReservationSelectorTerms"] = [
            r.selector_term() for r in pool.capacity_reservations
        ]
    return spec


def node_class_metadata(pool: NodePoolConfig) -> dict:
    """Beside the selector terms (all Karpenter reads), what each term is expected to select: the
    plan prices it as fixed cost (infra/core/cost.py); deploy.preflight checks the same against
    AWS."""
    metadata: dict = {"name": pool.name}
    if pool.capacity_reservations:
        expected = [
            {
                **r.selector_term(),
                "reservationType": r.reservation_type,
                "instanceType": r.instance_type,
                "instanceCount": r.instance_count,
                **({"durationHours": r.duration_hours} if r.duration_hours else {}),
                **({"upfrontFeeUsd": r.upfront_fee_usd} if r.upfront_fee_usd else {}),
            }
            for r in pool.capacity_reservations
        ]
        metadata["annotations"] = {RESERVATIONS_ANNOTATION: json.dumps(expected, sort_keys=True)}
    return metadata


def efa_network_interfaces(network_cards: int) -> list[dict]:
    """The primary ENI plus one EFA-only interface on every network card."""
    interfaces = [{"networkCardIndex": 0, "deviceIndex": 0, "interfaceType": "interface"}]
    interfaces.append({"networkCardIndex": 0, "deviceIndex": 1, "interfaceType": "efa-only"})
    interfaces += [
        {"networkCardIndex": card, "deviceIndex": 0, "interfaceType": "efa-only"}
        for card in range(1, network_cards)
    ]
    return interfaces


def node_pool_spec(pool: NodePoolConfig, zone: str | None = None) -> dict:
    """`zone` pins the pool to one AZ (EFA pools: a cluster placement group lives in one AZ)."""
    ceiling = pool.ceiling()
    labels = {
        POOL_LABEL: pool.name,
        **(GPU_NODE_LABELS if pool.gpu else {}),
        **(EFA_NODE_LABELS if pool.efa else {}),
    }
    template_spec = {
        "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": pool.name},
        "requirements": [
            {
                "key": "node.kubernetes.io/instance-type",
                "operator": "In",
                "values": pool.instance_types,
            },
            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": pool.capacity_types},
            {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
            {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]},
        ],
        "expireAfter": pool.expire_after,
    }
    if zone:
        template_spec["requirements"].append(
            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [zone]}
        )
    limits = {
        "nodes": str(ceiling.nodes),
        "cpu": str(ceiling.vcpu),
        "memory": f"{ceiling.memory_gib}Gi",
    }
    if pool.gpu:
        template_spec["taints"] = [GPU_TAINT]
        limits["nvidia.com/gpu"] = str(ceiling.gpus)
        # A training job holds its nodes end to end: remove a GPU node only once it is empty,
        # one node at a time, and never for underuse while pods still run on it. The budget of
        # one names no reasons, so it paces every reason, repair's too: from Karpenter 1.15
        # repair is a voluntary disruption under the budgets (the 20 % breaker is gone), and one
        # GPU node at a time keeps a fault that hits the whole pool (a bad AMI or driver) from
        # replacing it at once, and a real fault from waiting behind a flood (docs: fleet health).
        disruption = {
            "consolidationPolicy": "WhenEmpty",
            "consolidateAfter": "5m",
            "budgets": [{"nodes": "1"}, {"nodes": "0", "reasons": ["Underutilized"]}],
        }
    else:
        disruption = {
            "consolidationPolicy": "WhenEmptyOrUnderutilized",
            "consolidateAfter": "1m",
            "budgets": [{"nodes": "10%"}],
        }
    spec = {
        "template": {"metadata": {"labels": labels}, "spec": template_spec},
        "disruption": disruption,
        "limits": limits,
    }
    if pool.static_nodes:
        # A static NodePool keeps `replicas` nodes and takes no limit but `nodes` (its CRD's CEL
        # rule); maxNodes stays the one knob: replicas, limit, quota and cost all follow it.
        spec["replicas"] = ceiling.nodes
        spec["limits"] = {"nodes": str(ceiling.nodes)}
    return spec


class NodePools(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        pools: list[NodePoolConfig],
        cluster: ClusterContext,
        instance_profile: pulumi.Input[str],
        ami_alias: str,
        karpenter_release: pulumi.Resource,
        volume_driver: pulumi.Resource,
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("training-platform:infra:NodePools", name, None, opts)
        # The Karpenter chart brings the CRDs: nothing here can be created before it. Karpenter
        # terminates a node only once its volumes are detached (termination controller
        # awaitVolumeDetachment), which the EBS CSI driver does: both outlive the pools.
        child = cluster.in_cluster(self, karpenter_release, volume_driver)
        self.node_pools = {}
        for pool in pools:
            zone = placement_group = None
            if pool.efa:
                zone = pool.availability_zone
                if cluster.vpc.zones is not None and zone not in cluster.vpc.zones:
                    # Karpenter would find no subnet in the zone: pods would stay pending.
                    raise ConfigError(
                        f"Invalid stack config:\n  training-platform:nodePools[{pool.name}]."
                        f"availabilityZone: {zone} has no subnet of this stack; allowed: "
                        f"{', '.join(cluster.vpc.zones)} (network.azCount picks the first AZs)"
                    )
                # Nodes of one job talk over EFA: keep them on one network spine.
                placement_group = aws.ec2.PlacementGroup(
                    f"{name}-{pool.name}",
                    name=f"{cluster.config_name}-{pool.name}",
                    strategy="cluster",
                    tags=cluster.tags,
                    opts=pulumi.ResourceOptions(parent=self),
                ).name
            node_class = k8s.apiextensions.CustomResource(
                f"{name}-{pool.name}-nodeclass",
                api_version="karpenter.k8s.aws/v1",
                kind="EC2NodeClass",
                metadata=node_class_metadata(pool),
                spec=pulumi.Output.all(instance_profile, placement_group).apply(
                    lambda values, pool=pool: ec2_node_class_spec(
                        pool, cluster.config_name, values[0], ami_alias, cluster.tags, values[1]
                    )
                ),
                opts=child,
            )
            self.node_pools[pool.name] = k8s.apiextensions.CustomResource(
                f"{name}-{pool.name}",
                api_version="karpenter.sh/v1",
                kind="NodePool",
                metadata={"name": pool.name},
                spec=node_pool_spec(pool, zone),
                opts=pulumi.ResourceOptions.merge(
                    child, pulumi.ResourceOptions(depends_on=[node_class])
                ),
            )
        self.register_outputs({"nodePools": sorted(self.node_pools)})
