"""HybridNodes: machines outside AWS join the cluster as EKS Hybrid Nodes over WireGuard.

A small gateway instance in a public subnet is the WireGuard hub: every machine dials it (UDP
51820, the only port open to the internet), the VPC's route tables send the remote node and pod
CIDRs to it. Each machine's node IP is its WireGuard address. Cilium gives each node a slice of
the remote pod CIDRs as it joins; the gateway routes each slice to its node, so VPC pods, the
control plane and Prometheus reach pods on the machines (infra/hybrid/gateway_sync.py). Credentials
come from an SSM hybrid activation per machine or IAM Roles Anywhere, mapped into the cluster by
a HYBRID_LINUX access entry.

Each machine's owner is root on it: the platform trusts nothing her node says about itself. The
gateway labels each machine's node once it has matched it to the machine by its credentials;
pods of a job or DevServer flavor on `hybrid` select the machines that admit their team or user
by those labels and tolerate those machines' taints (placement.py); admission policies hold
hybrid nodes, the gateway, tenants' pods and Cilium agents to the rest (infra/hybrid/admission.py).
The machines have their own Kueue flavor, which injects no toleration.
"""

import json

import pulumi
import pulumi_aws as aws
import pulumi_random as random

from infra.core.context import ClusterContext
from infra.core.helm import helm_release
from infra.core.iam import partition, policy_document
from infra.core.nodes import POOL_LABEL, SYSTEM_PLACEMENT
from infra.core.versions import CILIUM_CHART, CILIUM_IMAGES
from infra.eks.cluster import RemoteNodes
from infra.hybrid.admission import hybrid_admission
from infra.hybrid.config import HybridConfig
from infra.hybrid.credentials import node_credentials
from infra.hybrid.facts import HYBRID_MACHINES_ANNOTATION
from infra.hybrid.gateway import WIREGUARD_PORT, wireguard_gateway
from infra.hybrid.machines import (
    HYBRID_FLAVOR,
    HYBRID_NODE_AFFINITY,
    HYBRID_TAINT,
    bootstrap_script,
    node_config,
    spokes,
)
from infra.kueue.queues import Flavor
from mesh.wireguard import Hub, spoke_config

# The Pod Identity agent add-on's DaemonSet for hybrid nodes (from v1.3.3-eksbuild.1; EKS user
# guide, "Configure add-ons for hybrid nodes"): it reads the credentials file nodeadm keeps at
# /eks-hybrid/.aws/credentials with spec.hybrid.enableCredentialsFile, as IMDS is not there.
POD_IDENTITY_ON_HYBRID_NODES = json.dumps({"daemonsets": {"hybrid": {"create": True}}})
# Ports the hybrid nodes and their pods reach in the cluster security group (EKS user guide,
# "Prepare networking for hybrid nodes"): the API server, and CoreDNS, which runs on the system
# nodes ("if you run at least 1 replica of CoreDNS in the cloud, you must allow DNS traffic to
# the VPC where CoreDNS is running"). Cilium masquerades pod traffic leaving the node to the node
# address, so the node CIDR is the source in practice; the pod CIDR covers traffic it does not.
CLUSTER_INGRESS = {
    "https": ("tcp", 443, "Kubernetes API from hybrid nodes and their pods"),
    "dns-udp": ("udp", 53, "CoreDNS from hybrid nodes and their pods"),
    "dns-tcp": ("tcp", 53, "CoreDNS from hybrid nodes and their pods"),
}


def cilium_values(config: HybridConfig) -> dict:
    """Cilium as the CNI of the hybrid nodes only, in the IPAM mode AWS supports there.

    cluster-pool (EKS user guide, "Configure CNI for hybrid nodes"): the operator gives each node
    a /podCidrMaskSize slice of the remote pod CIDRs as it joins, recorded in its CiliumNode; the
    gateway reads those and routes each slice to its node (infra/hybrid/gateway_boot.py).
    """
    return {
        "image": CILIUM_IMAGES["agent"],
        "affinity": HYBRID_NODE_AFFINITY,
        # The chart's default, stated: a CNI agent must run on its nodes whatever their taints,
        # HYBRID_TAINT included.
        "tolerations": [{"operator": "Exists"}],
        "ipam": {
            "mode": "cluster-pool",
            "operator": {
                # AWS: the same CIDRs as the cluster's remote pod networks, never changed later.
                "clusterPoolIPv4PodCIDRList": [str(c) for c in config.remote_pod_cidrs],
                "clusterPoolIPv4MaskSize": config.pod_cidr_mask_size,
            },
        },
        # The operator (garbage collection, CRDs) runs with the other controllers on the system
        # nodes: there from the first `pulumi up`, before any machine joins, so the release's
        # readiness wait means something. It never restarts pods the VPC CNI manages.
        "operator": {
            "image": CILIUM_IMAGES["operator"],
            "replicas": 1,
            **SYSTEM_PLACEMENT,
            "unmanagedPodWatcher": {"restart": False},
        },
        # Its own DaemonSet would follow no hybrid affinity and land on the VPC's nodes.
        "envoy": {"enabled": False},
    }


def remote_network_config(config: HybridConfig) -> dict:
    """The aws:eks Cluster's remoteNetworkConfig, in the engine's (camelCase) property names."""
    return {
        "remoteNodeNetworks": {"cidrs": [str(c) for c in config.remote_node_cidrs]},
        "remotePodNetworks": {"cidrs": [str(c) for c in config.remote_pod_cidrs]},
    }


def remote_nodes(config: HybridConfig) -> RemoteNodes:
    """What the cluster needs for the machines: remoteNetworkConfig on the aws:eks Cluster inside
    pulumi-eks's Cluster component, and the Pod Identity agent's DaemonSet for hybrid nodes.

    pulumi-eks 4.x does not expose the setting (pulumi/pulumi-eks#1512); transforms reach the
    resources of packaged components, so this adds it where pulumi-eks creates the cluster.
    """

    def transform(args: pulumi.ResourceTransformArgs) -> pulumi.ResourceTransformResult | None:
        if args.type_ != "aws:eks/cluster:Cluster":
            return None
        props = {**args.props, "remoteNetworkConfig": remote_network_config(config)}
        return pulumi.ResourceTransformResult(props=props, opts=args.opts)

    return RemoteNodes(transform, POD_IDENTITY_ON_HYBRID_NODES)


def kueue_flavor(config: HybridConfig) -> Flavor:
    """The machines' flavor: quota for all of them, and no injected toleration.

    Kueue assigns a flavor with nodeTaints only to pod sets that tolerate them, counting the
    pod's own tolerations and the flavor's spec.tolerations alike, and matches the pod's node
    selector only on the keys of the flavor's nodeLabels (kubernetes-sigs/kueue at KUEUE_CHART,
    pkg/scheduler/flavorassigner/flavorassigner.go, checkFlavorForPodSets and flavorSelector).
    Were the toleration injected, a pod set without a pool selector (a user's own GPU job) could
    spill onto the machines when the EC2 flavors are full; without it, only pods that carry the
    toleration (placement.py, for `nodePool: hybrid`) get this flavor. One flavor for all
    machines: Kueue gives a PodSet one flavor for all its pods, so a flavor per machine would
    admit no job across machines, and one per tenant would let a pod that tolerates the taint
    take any tenant's (its node labels are a pod's to match, not the namespace's). Which machines
    a pod may use its own affinity and tolerations say (placement.py), and the machine-tolerations
    admission policy holds tenants' own pods to them. The annotation lists the machines' vCPUs,
    which EKS bills per hour (infra/core/cost.py).
    """
    ceiling = config.pool().ceiling()
    vcpus = [{"name": m.name, "vcpu": m.vcpu} for m in config.machines]
    return Flavor(
        name=HYBRID_FLAVOR,
        spec={"nodeLabels": {POOL_LABEL: HYBRID_FLAVOR}, "nodeTaints": [HYBRID_TAINT]},
        amounts={
            "cpu": ceiling.vcpu,
            "memory": ceiling.memory_gib,
            "nvidia.com/gpu": ceiling.gpus,
        },
        annotations={HYBRID_MACHINES_ANNOTATION: json.dumps(vcpus)},
    )


class HybridNodes(pulumi.ComponentResource):
    peer_configs: pulumi.Output[dict[str, str]]  # machine -> wg-quick config (secret)
    bootstraps: pulumi.Output[dict[str, str]]  # machine -> bootstrap script (secret)
    gateway_public_ip: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        config: HybridConfig,
        cluster: ClusterContext,
        kubernetes_version: str,
        user_label: str,  # the label naming a DevServer namespace's user
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("training-platform:infra:HybridNodes", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        account = aws.get_caller_identity().account_id
        region = aws.get_region().region
        cluster_arn = pulumi.Output.concat(
            f"arn:{partition()}:eks:{region}:{account}:cluster/", cluster.name
        )
        remote_cidrs = [str(c) for c in config.remote_node_cidrs + config.remote_pod_cidrs]

        role, hybrid_credentials, activation_ids = node_credentials(
            self, name, config, region, account, cluster_arn, cluster.tags
        )
        access_entry = aws.eks.AccessEntry(
            f"{name}-nodes",
            cluster_name=cluster.name,
            principal_arn=role.arn,
            type="HYBRID_LINUX",
            tags=cluster.tags,
            opts=child,
        )
        # Hybrid nodes stay NotReady until a CNI runs on them; the VPC CNI never does.
        cilium = helm_release(
            "cilium",
            CILIUM_CHART,
            "kube-system",
            cilium_values(config),
            cluster.in_cluster(self, *cluster.controller_prerequisites, access_entry),
        )
        # The machines and their pods reach the API server's ENIs and CoreDNS in the VPC
        # through the gateway.
        for kind, (protocol, port, description) in CLUSTER_INGRESS.items():
            for i, cidr in enumerate(remote_cidrs):
                aws.vpc.SecurityGroupIngressRule(
                    f"{name}-cluster-{kind}-{i}",
                    security_group_id=cluster.vpc.cluster_security_group_id,
                    description=description,
                    ip_protocol=protocol,
                    from_port=port,
                    to_port=port,
                    cidr_ipv4=cidr,
                    opts=child,
                )

        network = config.remote_node_cidrs[0]
        keys = {
            machine.name: random.RandomBytes(f"{name}-wg-{machine.name}", length=32, opts=child)
            for machine in config.machines
        }
        gateway_key = random.RandomBytes(f"{name}-wg-gateway", length=32, opts=child)
        # One list for both ends: each machine's config and the gateway's peer for it.
        machine_spokes = pulumi.Output.all(*[keys[m.name].base64 for m in config.machines]).apply(
            lambda private_keys: spokes(config, private_keys)
        )
        gateway_ip, gateway_key_arn = wireguard_gateway(
            self,
            name,
            config,
            cluster,
            region,
            account,
            cluster_arn,
            remote_cidrs,
            machine_spokes,
            gateway_key,
            activation_ids,
        )
        # AmazonSSMManagedInstanceCore lets a managed node read every SSM parameter, SecureStrings
        # under aws/ssm included: not the gateway's WireGuard key, with which a machine's owner
        # could answer the other machines as their hub.
        aws.iam.RolePolicy(
            f"{name}-node-denied",
            role=role.name,
            policy=gateway_key_arn.apply(
                lambda arn: policy_document(
                    [
                        {
                            "Effect": "Deny",
                            "Action": [
                                "ssm:GetParameter",
                                "ssm:GetParameters",
                                "ssm:GetParameterHistory",
                            ],
                            "Resource": arn,
                        }
                    ]
                )
            ),
            opts=child,
        )
        hybrid_admission(self, config, cluster, user_label, cilium)

        def render(args: list) -> tuple[dict[str, str], dict[str, str]]:
            public_ip, gateway_private, credentials, all_spokes = args
            hub = Hub(
                gateway_private,
                config.gateway_address,
                public_ip,
                WIREGUARD_PORT,
                (cluster.vpc.cidr,),
            )
            peers, pages = {}, {}
            for machine, spoke in zip(config.machines, all_spokes, strict=True):
                peers[machine.name] = spoke_config(hub, network, spoke)
                node_yaml = node_config(
                    credentials["cluster"],
                    region,
                    machine,
                    str(spoke.address),
                    credentials["hybrid"][machine.name],
                )
                pages[machine.name] = bootstrap_script(
                    machine,
                    credentials["cluster"],
                    kubernetes_version,
                    config.credential_provider,
                    peers[machine.name],
                    node_yaml,
                )
            return peers, pages

        rendered = pulumi.Output.all(
            gateway_ip,
            gateway_key.base64,
            pulumi.Output.all(cluster=cluster.name, hybrid=hybrid_credentials),
            machine_spokes,
        ).apply(render)
        self.peer_configs = pulumi.Output.secret(rendered.apply(lambda r: r[0]))
        self.bootstraps = pulumi.Output.secret(rendered.apply(lambda r: r[1]))
        self.gateway_public_ip = gateway_ip
        self.register_outputs({"gatewayPublicIp": gateway_ip})
