"""HybridNodes: machines outside AWS join the cluster as EKS Hybrid Nodes over WireGuard.

A small gateway instance in a public subnet is the WireGuard hub: every machine dials it (UDP
51820, the only port open to the internet), the VPC's route tables send the remote node and pod
CIDRs to it. Each machine's node IP is its WireGuard address. Cilium gives each node a slice of
the remote pod CIDRs as it joins; the gateway routes each slice to its node, so VPC pods, the
control plane and Prometheus reach pods on the machines (hybrid_gateway_boot.py). Credentials
come from an SSM hybrid activation or IAM Roles Anywhere, mapped into the cluster by a
HYBRID_LINUX access entry. Hybrid nodes carry a label and a taint and have their own Kueue
flavor, so only pods that opt in (jobs naming `nodePool: hybrid`, which tolerate the taint) run
there.
"""

import ipaddress
import json
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s
import pulumi_random as random
import yaml

from infra.components.helm import helm_release
from infra.components.hybrid_gateway_boot import KEY_PLACEHOLDER, SyncTarget, user_data
from infra.components.iam import assume_role_policy, managed_policy_arn, partition
from infra.components.node_pools import GPU_NODE_LABELS, GPU_TOLERATION, POOL_LABEL
from infra.components.queues import Flavor
from infra.components.system_nodes import SYSTEM_PLACEMENT
from infra.config import HYBRID_POOL, HybridConfig, HybridMachine
from infra.cost import HYBRID_MACHINES_ANNOTATION
from infra.versions import (
    CILIUM_CHART,
    CILIUM_IMAGES,
    NODEADM_VERSION,
    NVIDIA_CONTAINER_TOOLKIT_VERSION,
    WIREGUARD_GATEWAY_AMI_PARAMETER,
)
from mesh.wireguard import Hub, Spoke, hub_interface, peer_section, spoke_config

HYBRID_FLAVOR = HYBRID_POOL
HYBRID_LABELS = {POOL_LABEL: HYBRID_FLAVOR, "training-platform/node-role": "hybrid"}
HYBRID_TAINT = {"key": "training-platform/hybrid", "value": "true", "effect": "NoSchedule"}
# For node agents (device plugins): a workload opts in through Kueue's flavor instead.
HYBRID_TOLERATION = {"key": HYBRID_TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}
# Agents every GPU node runs (device plugin, DCGM exporter), pool nodes and hybrid ones alike.
GPU_AGENT_TOLERATIONS = [GPU_TOLERATION, HYBRID_TOLERATION]
WIREGUARD_PORT = 51820
# The gateway's root volume: the size of the AL2023 AMI's own snapshot, stated so that the plan
# prices it (EC2 refuses a size below the snapshot's; the provider resizes in place).
GATEWAY_ROOT_GIB = 8
# The pinned release's binaries; a machine adds its architecture (amd64, arm64) and file name.
NODEADM_RELEASE = f"https://hybrid-assets.eks.amazonaws.com/releases/{NODEADM_VERSION}/bin/linux"
# Installed at one version together: each requires the others at exactly its own.
NVIDIA_CONTAINER_PACKAGES = [
    "nvidia-container-toolkit",
    "nvidia-container-toolkit-base",
    "libnvidia-container-tools",
    "libnvidia-container1",
]
NODEADM_CREDENTIAL_PROVIDER = {"ssm": "ssm", "iam-roles-anywhere": "iam-ra"}
# Where a Roles Anywhere machine keeps its certificate (CN = machine name) and key.
IRA_CERTIFICATE = "/etc/iam/pki/server.pem"
IRA_PRIVATE_KEY = "/etc/iam/pki/server.key"
# The Kubernetes group of the gateway's IAM role: it may list CiliumNodes, nothing else.
GATEWAY_GROUP = "hybrid-wireguard-gateway"
# The label EKS gives every hybrid node. The VPC CNI (aws-node) and the EBS and EFS CSI node
# agents are required to run on nodes without it (their charts at the pinned add-on versions).
HYBRID_NODE_AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {
                    "matchExpressions": [
                        {
                            "key": "eks.amazonaws.com/compute-type",
                            "operator": "In",
                            "values": ["hybrid"],
                        }
                    ]
                }
            ]
        }
    }
}
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
    gateway reads those and routes each slice to its node (hybrid_gateway_boot.py).
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


def remote_network_transform(config: HybridConfig) -> pulumi.ResourceTransform:
    """Sets remoteNetworkConfig on the aws:eks Cluster inside pulumi-eks's Cluster component.

    pulumi-eks 4.x does not expose the setting (pulumi/pulumi-eks#1512); transforms reach the
    resources of packaged components, so this adds it where pulumi-eks creates the cluster.
    """

    def transform(args: pulumi.ResourceTransformArgs) -> pulumi.ResourceTransformResult | None:
        if args.type_ != "aws:eks/cluster:Cluster":
            return None
        props = {**args.props, "remoteNetworkConfig": remote_network_config(config)}
        return pulumi.ResourceTransformResult(props=props, opts=args.opts)

    return transform


def kueue_flavor(config: HybridConfig) -> Flavor:
    """The machines' flavor: quota for all of them, and no injected toleration.

    Kueue assigns a flavor with nodeTaints only to pod sets that tolerate them, counting the
    pod's own tolerations and the flavor's spec.tolerations alike, and matches the pod's node
    selector only on the keys of the flavor's nodeLabels (kubernetes-sigs/kueue v0.19.2,
    pkg/scheduler/flavorassigner/flavorassigner.go, checkFlavorForPodSets and flavorSelector).
    Were the toleration injected, a pod set without a pool selector (a user's own GPU job) could
    spill onto the machines when the EC2 flavors are full; without it, only pods that carry the
    toleration (placement.py, for `nodePool: hybrid`) get this flavor. The annotation lists the
    machines' vCPUs, which EKS bills per hour (infra/cost.py).
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


def node_labels(machine: HybridMachine) -> dict[str, str]:
    # SSM-registered nodes are named after their managed instance id (mi-...): the machine label
    # says which machine a node is.
    labels = {**HYBRID_LABELS, "training-platform/machine": machine.name}
    if machine.gpus:
        labels.update(GPU_NODE_LABELS)
    return labels


def node_config(
    cluster_name: str, region: str, machine: HybridMachine, node_ip: str, hybrid: dict
) -> str:
    """nodeadm's NodeConfig for one machine; `hybrid` is its spec.hybrid credentials block."""
    taint = f"{HYBRID_TAINT['key']}={HYBRID_TAINT['value']}:{HYBRID_TAINT['effect']}"
    labels = ",".join(f"{k}={v}" for k, v in node_labels(machine).items())
    document = {
        "apiVersion": "node.eks.aws/v1alpha1",
        "kind": "NodeConfig",
        "spec": {
            "cluster": {"name": cluster_name, "region": region},
            "hybrid": hybrid,
            "kubelet": {
                "flags": [
                    f"--node-ip={node_ip}",
                    f"--node-labels={labels}",
                    f"--register-with-taints={taint}",
                ]
            },
        },
    }
    return yaml.safe_dump(document, sort_keys=False)


def bootstrap_script(
    machine: HybridMachine,
    cluster_name: str,
    kubernetes_version: str,
    credential_provider: str,
    wireguard_conf: str,
    node_config_yaml: str,
) -> str:
    """One page a machine's owner runs as root (Ubuntu 22.04/24.04) to join the cluster."""
    gpu = ""
    if machine.gpus:
        packages = " ".join(
            f"{p}={NVIDIA_CONTAINER_TOOLKIT_VERSION}" for p in NVIDIA_CONTAINER_PACKAGES
        )
        gpu = f"""
# 4. NVIDIA container toolkit, so containerd runs GPU containers on this machine's
#    {machine.gpus} x {machine.gpu_model or "GPU"}. Needs the NVIDIA driver (nvidia-smi works).
curl -fsSL https://nvidia.github.io/libnvidia-container/gpgkey \\
  | gpg --dearmor --yes -o /usr/share/keyrings/nvidia-container-toolkit-keyring.gpg
keyring=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg
curl -fsSL https://nvidia.github.io/libnvidia-container/stable/deb/nvidia-container-toolkit.list \\
  | sed "s#deb https://#deb [signed-by=$keyring] https://#" \\
  > /etc/apt/sources.list.d/nvidia-container-toolkit.list
apt-get update
apt-get install -y {packages}
nvidia-ctk runtime configure --runtime=containerd --set-as-default
systemctl restart containerd
"""
    provider = NODEADM_CREDENTIAL_PROVIDER[credential_provider]
    certificate = ""
    if credential_provider == "iam-roles-anywhere":
        certificate = (
            f"# Before running: this machine's certificate (CN={machine.name}) and key, signed "
            f"by the\n# stack's CA, at {IRA_CERTIFICATE} and {IRA_PRIVATE_KEY}.\n"
        )
    return f"""#!/usr/bin/env bash
# Hybrid node {machine.name} of EKS cluster {cluster_name}: run as root on Ubuntu 22.04/24.04.
# Generated by the stack; it holds secrets (WireGuard key, credentials): keep it private.
{certificate}
set -euo pipefail

# 1. WireGuard to the cluster's gateway (UDP {WIREGUARD_PORT} outbound; no inbound port needed).
apt-get update
apt-get install -y wireguard-tools curl gpg
install -m 600 /dev/stdin /etc/wireguard/wg0.conf <<'WIREGUARD'
{wireguard_conf.rstrip()}
WIREGUARD
systemctl enable --now wg-quick@wg0

# 2. nodeadm {NODEADM_VERSION}, the EKS hybrid nodes agent: kubelet, containerd, credentials
#    (Kubernetes {kubernetes_version}); checked against the release's own sha256sum file.
release={NODEADM_RELEASE}/$(dpkg --print-architecture)
download=$(mktemp -d)
curl -fsSLo "$download/nodeadm" "$release/nodeadm"
curl -fsSLo "$download/nodeadm.sha256" "$release/nodeadm.sha256"
(cd "$download" && sha256sum --check --strict nodeadm.sha256)
install -m 755 "$download/nodeadm" /usr/local/bin/nodeadm
nodeadm install {kubernetes_version} --credential-provider {provider}

# 3. Join: the node registers with its WireGuard address, hybrid label and taint.
install -d /etc/nodeadm
install -m 600 /dev/stdin /etc/nodeadm/nodeConfig.yaml <<'NODECONFIG'
{node_config_yaml.rstrip()}
NODECONFIG
nodeadm init -c file:///etc/nodeadm/nodeConfig.yaml
{gpu}"""


def spokes(
    config: HybridConfig, node_ips: dict[str, ipaddress.IPv4Address], private_keys: list[str]
) -> list[Spoke]:
    """The machines as WireGuard spokes, each at its node IP."""
    return [
        Spoke(m.name, key, node_ips[m.name])
        for m, key in zip(config.machines, private_keys, strict=True)
    ]


def _policy(statements: list[dict]) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": statements})


@dataclass(frozen=True)
class VpcPlacement:
    """Where the gateway goes and what it routes: the stack's VPC (infra/components/network.py)."""

    cidr: ipaddress.IPv4Network
    vpc_id: pulumi.Input[str]
    public_subnet_id: pulumi.Input[str]
    route_table_ids: list[pulumi.Input[str]]
    cluster_security_group_id: pulumi.Input[str]


class HybridNodes(pulumi.ComponentResource):
    peer_configs: pulumi.Output[dict[str, str]]  # machine -> wg-quick config (secret)
    bootstraps: pulumi.Output[dict[str, str]]  # machine -> bootstrap script (secret)
    gateway_public_ip: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        config: HybridConfig,
        cluster_name: pulumi.Input[str],
        kubernetes_version: str,
        vpc: VpcPlacement,
        controller_prerequisites: list[pulumi.Resource],
        provider: k8s.Provider,
        tags: dict[str, str],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("training-platform:infra:HybridNodes", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self._name, self._config, self._tags = name, config, tags
        account = aws.get_caller_identity().account_id
        region = self._region = aws.get_region().region
        cluster_arn = pulumi.Output.concat(
            f"arn:{partition()}:eks:{region}:{account}:cluster/", cluster_name
        )
        remote_cidrs = [str(c) for c in config.remote_node_cidrs + config.remote_pod_cidrs]

        role, hybrid_credentials = self._credentials(cluster_arn, account)
        access_entry = aws.eks.AccessEntry(
            f"{name}-nodes",
            cluster_name=cluster_name,
            principal_arn=role.arn,
            type="HYBRID_LINUX",
            tags=tags,
            opts=child,
        )
        # Hybrid nodes stay NotReady until a CNI runs on them; the VPC CNI never does.
        helm_release(
            "cilium",
            CILIUM_CHART,
            "kube-system",
            cilium_values(config),
            pulumi.ResourceOptions(
                parent=self,
                provider=provider,
                depends_on=[*controller_prerequisites, access_entry],
            ),
        )
        # The machines and their pods reach the API server's ENIs and CoreDNS in the VPC
        # through the gateway.
        for kind, (protocol, port, description) in CLUSTER_INGRESS.items():
            for i, cidr in enumerate(remote_cidrs):
                aws.vpc.SecurityGroupIngressRule(
                    f"{name}-cluster-{kind}-{i}",
                    security_group_id=vpc.cluster_security_group_id,
                    description=description,
                    ip_protocol=protocol,
                    from_port=port,
                    to_port=port,
                    cidr_ipv4=cidr,
                    opts=child,
                )

        gateway_address, node_ips = config.addresses()
        network = config.remote_node_cidrs[0]
        keys = {
            machine.name: random.RandomBytes(f"{name}-wg-{machine.name}", length=32, opts=child)
            for machine in config.machines
        }
        gateway_key = random.RandomBytes(f"{name}-wg-gateway", length=32, opts=child)
        # One list for both ends: each machine's config and the gateway's peer for it.
        machine_spokes = pulumi.Output.all(*[keys[m.name].base64 for m in config.machines]).apply(
            lambda private_keys: spokes(config, node_ips, private_keys)
        )
        gateway_ip = self._gateway(
            vpc,
            remote_cidrs,
            machine_spokes,
            gateway_key,
            cluster_name,
            cluster_arn,
            account,
            provider,
        )

        def render(args: list) -> tuple[dict[str, str], dict[str, str]]:
            public_ip, gateway_private, credentials, all_spokes = args
            hub = Hub(gateway_private, gateway_address, public_ip, WIREGUARD_PORT, (vpc.cidr,))
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
            pulumi.Output.all(cluster=cluster_name, hybrid=hybrid_credentials),
            machine_spokes,
        ).apply(render)
        self.peer_configs = pulumi.Output.secret(rendered.apply(lambda r: r[0]))
        self.bootstraps = pulumi.Output.secret(rendered.apply(lambda r: r[1]))
        self.gateway_public_ip = gateway_ip
        self.register_outputs({"gatewayPublicIp": gateway_ip})

    def _credentials(self, cluster_arn, account):
        """The hybrid node role, its credential source, and each machine's spec.hybrid block."""
        name, config, tags, region = self._name, self._config, self._tags, self._region
        child = pulumi.ResourceOptions(parent=self)
        inline = [
            # nodeadm reads the endpoint, CA and service CIDR of the cluster.
            {"Effect": "Allow", "Action": "eks:DescribeCluster", "Resource": cluster_arn},
            # The EKS Pod Identity agent on the node fetches pod credentials.
            {
                "Effect": "Allow",
                "Action": "eks-auth:AssumeRoleForPodIdentity",
                "Resource": cluster_arn,
            },
        ]
        managed = [managed_policy_arn("AmazonEC2ContainerRegistryPullOnly")]
        if config.credential_provider == "ssm":
            trust = json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [
                        {
                            "Effect": "Allow",
                            "Principal": {"Service": "ssm.amazonaws.com"},
                            "Action": "sts:AssumeRole",
                            "Condition": {
                                "StringEquals": {"aws:SourceAccount": account},
                                "ArnEquals": {
                                    "aws:SourceArn": f"arn:{partition()}:ssm:{region}:{account}:*"
                                },
                            },
                        }
                    ],
                }
            )
            managed.append(managed_policy_arn("AmazonSSMManagedInstanceCore"))
            # `nodeadm uninstall` deregisters the machine from SSM: a write, so only on this
            # account's managed instances (the action's resource type); describing needs "*".
            inline += [
                {
                    "Effect": "Allow",
                    "Action": "ssm:DeregisterManagedInstance",
                    "Resource": f"arn:{partition()}:ssm:{region}:{account}:managed-instance/*",
                },
                {"Effect": "Allow", "Action": "ssm:DescribeInstanceInformation", "Resource": "*"},
            ]
        else:
            anchor = aws.rolesanywhere.TrustAnchor(
                f"{name}-anchor",
                name=f"{name}-hybrid-nodes",
                enabled=True,
                source={
                    "source_type": "CERTIFICATE_BUNDLE",
                    "source_data": {"x509_certificate_data": config.ca_bundle_pem},
                },
                tags=tags,
                opts=child,
            )
            trust = anchor.arn.apply(
                lambda arn: json.dumps(
                    {
                        "Version": "2012-10-17",
                        "Statement": [
                            {
                                "Effect": "Allow",
                                "Principal": {"Service": "rolesanywhere.amazonaws.com"},
                                "Action": [
                                    "sts:TagSession",
                                    "sts:SetSourceIdentity",
                                    "sts:AssumeRole",
                                ],
                                # A certificate acts only as the machine its CN names.
                                "Condition": {
                                    "StringEquals": {
                                        "sts:RoleSessionName": "${aws:PrincipalTag/x509Subject/CN}"
                                    },
                                    "ArnEquals": {"aws:SourceArn": arn},
                                },
                            }
                        ],
                    }
                )
            )
        role = aws.iam.Role(f"{name}-node", assume_role_policy=trust, tags=tags, opts=child)
        for i, arn in enumerate(managed):
            aws.iam.RolePolicyAttachment(
                f"{name}-node-{i}", role=role.name, policy_arn=arn, opts=child
            )
        aws.iam.RolePolicy(
            f"{name}-node",
            role=role.name,
            policy=pulumi.Output.from_input(inline).apply(_policy),
            opts=child,
        )
        if config.credential_provider == "ssm":
            activation = aws.ssm.Activation(
                f"{name}-activation",
                description=f"EKS hybrid nodes of {name}",
                iam_role=role.name,
                registration_limit=len(config.machines),
                expiration_date=config.ssm_activation.expiration_date(),
                tags=tags,
                opts=pulumi.ResourceOptions(parent=self, depends_on=[role]),
            )
            block = pulumi.Output.all(activation.activation_code, activation.id).apply(
                lambda a: {
                    "enableCredentialsFile": True,  # for POD_IDENTITY_ON_HYBRID_NODES
                    "ssm": {"activationCode": a[0], "activationId": a[1]},
                }
            )
            return role, block.apply(lambda b: {m.name: b for m in config.machines})
        profile = aws.rolesanywhere.Profile(
            f"{name}-profile",
            name=f"{name}-hybrid-nodes",
            enabled=True,
            role_arns=[role.arn],
            tags=tags,
            opts=child,
        )
        arns = pulumi.Output.all(anchor.arn, profile.arn, role.arn)
        return role, arns.apply(
            lambda a: {
                m.name: {
                    "enableCredentialsFile": True,
                    "iamRolesAnywhere": {
                        "nodeName": m.name,
                        "trustAnchorArn": a[0],
                        "profileArn": a[1],
                        "roleArn": a[2],
                        "certificatePath": IRA_CERTIFICATE,
                        "privateKeyPath": IRA_PRIVATE_KEY,
                    },
                }
                for m in config.machines
            }
        )

    def _gateway(
        self,
        vpc: VpcPlacement,
        remote_cidrs: list[str],
        machine_spokes: pulumi.Output[list[Spoke]],
        gateway_key: random.RandomBytes,
        cluster_name: pulumi.Input[str],
        cluster_arn: pulumi.Output[str],
        account: str,
        provider: k8s.Provider,
    ) -> pulumi.Output[str]:
        """The WireGuard hub instance, its peers, address, firewall and the VPC's routes."""
        name, config, tags, region = self._name, self._config, self._tags, self._region
        gateway_address = config.addresses()[0]
        child = pulumi.ResourceOptions(parent=self)
        group = aws.ec2.SecurityGroup(
            f"{name}-gateway",
            description="WireGuard gateway to EKS hybrid nodes",
            vpc_id=vpc.vpc_id,
            ingress=[
                # The only port open to the internet: WireGuard answers no unauthenticated packet.
                {
                    "protocol": "udp",
                    "from_port": WIREGUARD_PORT,
                    "to_port": WIREGUARD_PORT,
                    "cidr_blocks": ["0.0.0.0/0"],
                    "description": "WireGuard from the machines",
                },
                # Traffic the VPC routes to the machines enters the gateway to be forwarded.
                {
                    "protocol": "-1",
                    "from_port": 0,
                    "to_port": 0,
                    "cidr_blocks": [str(vpc.cidr)],
                    "description": "VPC traffic forwarded to the hybrid nodes",
                },
            ],
            egress=[{"protocol": "-1", "from_port": 0, "to_port": 0, "cidr_blocks": ["0.0.0.0/0"]}],
            tags={**tags, "Name": f"{name}-gateway"},
            opts=child,
        )
        # The gateway itself lists CiliumNodes; with a private endpoint it does so in the VPC.
        aws.vpc.SecurityGroupIngressRule(
            f"{name}-cluster-https-gateway",
            security_group_id=vpc.cluster_security_group_id,
            description="Kubernetes API from the hybrid nodes' WireGuard gateway",
            ip_protocol="tcp",
            from_port=443,
            to_port=443,
            referenced_security_group_id=group.id,
            opts=child,
        )
        key_parameter = aws.ssm.Parameter(
            f"{name}-gateway-key",
            type="SecureString",
            description="WireGuard private key of the hybrid nodes gateway",
            value=gateway_key.base64,
            tags=tags,
            opts=child,
        )
        # One parameter per machine, under one path: adding or removing a machine adds or
        # removes a parameter, which the gateway picks up without being replaced.
        peers_path = f"/{pulumi.get_project()}/{pulumi.get_stack()}/{name}-wireguard-peers"
        for i, machine in enumerate(config.machines):
            aws.ssm.Parameter(
                f"{name}-peer-{machine.name}",
                name=f"{peers_path}/{machine.name}",
                type="String",
                description=f"WireGuard peer of hybrid machine {machine.name} (public key only)",
                value=machine_spokes.apply(lambda all_spokes, i=i: peer_section(all_spokes[i])),
                tags=tags,
                opts=child,
            )
        role = aws.iam.Role(
            f"{name}-gateway",
            assume_role_policy=assume_role_policy("ec2.amazonaws.com"),
            tags=tags,
            opts=child,
        )
        # Exactly what the gateway calls: its key once at boot, the peers and the cluster's
        # endpoint on every sync. The key is a SecureString under the AWS managed key aws/ssm,
        # whose key policy lets SSM decrypt for callers in the account (no kms:Decrypt here);
        # `aws eks get-token` presigns sts:GetCallerIdentity, which needs no permission.
        peers_arn = f"arn:{partition()}:ssm:{region}:{account}:parameter{peers_path}"
        aws.iam.RolePolicy(
            f"{name}-gateway",
            role=role.name,
            policy=pulumi.Output.all(key_parameter.arn, cluster_arn).apply(
                lambda arns: _policy(
                    [
                        {"Effect": "Allow", "Action": "ssm:GetParameter", "Resource": arns[0]},
                        # Authorized against the requested path, not the parameters returned
                        # (Parameter Store, "How Parameter Store authorizes parameter retrieval").
                        {
                            "Effect": "Allow",
                            "Action": "ssm:GetParametersByPath",
                            "Resource": peers_arn,
                        },
                        {"Effect": "Allow", "Action": "eks:DescribeCluster", "Resource": arns[1]},
                    ]
                )
            ),
            opts=child,
        )
        self._gateway_cluster_access(role, cluster_name, provider)
        profile = aws.iam.InstanceProfile(f"{name}-gateway", role=role.name, opts=child)

        hub = Hub(
            KEY_PLACEHOLDER,
            gateway_address,
            "",
            WIREGUARD_PORT,
            behind_spokes=tuple(config.remote_pod_cidrs),
        )
        ami = aws.ssm.get_parameter_output(name=WIREGUARD_GATEWAY_AMI_PARAMETER).value
        instance = aws.ec2.Instance(
            f"{name}-gateway",
            ami=ami,
            instance_type=config.gateway_instance_type,
            subnet_id=vpc.public_subnet_id,
            vpc_security_group_ids=[group.id],
            iam_instance_profile=profile.name,
            # It forwards packets for addresses that are not its own.
            source_dest_check=False,
            # Reaches the package repositories at boot, before the Elastic IP is attached.
            associate_public_ip_address=True,
            # Nothing in it depends on the machines; a change of what it does depend on (the
            # networks, the boot script) needs a new instance, as user data runs once.
            user_data=pulumi.Output.all(key_parameter.name, cluster_name).apply(
                lambda args: user_data(
                    region,
                    args[0],
                    hub_interface(hub, config.remote_node_cidrs[0]),
                    SyncTarget(region, args[1], peers_path, tuple(config.remote_pod_cidrs)),
                )
            ),
            user_data_replace_on_change=True,
            metadata_options={"http_tokens": "required", "http_put_response_hop_limit": 1},
            root_block_device={
                "encrypted": True,
                "volume_type": "gp3",
                "volume_size": GATEWAY_ROOT_GIB,
            },
            tags={**tags, "Name": f"{name}-gateway"},
            # A newer AMI must not replace a working gateway (and its address) on every update.
            opts=pulumi.ResourceOptions(parent=self, ignore_changes=["ami"]),
        )
        address = aws.ec2.Eip(
            f"{name}-gateway",
            domain="vpc",
            instance=instance.id,
            tags={**tags, "Name": f"{name}-gateway"},
            opts=child,
        )
        for i, table in enumerate(vpc.route_table_ids):
            for j, cidr in enumerate(remote_cidrs):
                aws.ec2.Route(
                    f"{name}-route-{i}-{j}",
                    route_table_id=table,
                    destination_cidr_block=cidr,
                    network_interface_id=instance.primary_network_interface_id,
                    opts=child,
                )
        return address.public_ip

    def _gateway_cluster_access(
        self, role: aws.iam.Role, cluster_name: pulumi.Input[str], provider: k8s.Provider
    ) -> None:
        """The gateway's role may list CiliumNodes (their pod CIDRs), and do nothing else."""
        name = self._name
        aws.eks.AccessEntry(
            f"{name}-gateway",
            cluster_name=cluster_name,
            principal_arn=role.arn,
            type="STANDARD",
            kubernetes_groups=[GATEWAY_GROUP],
            tags=self._tags,
            opts=pulumi.ResourceOptions(parent=self),
        )
        in_cluster = pulumi.ResourceOptions(parent=self, provider=provider)
        k8s.rbac.v1.ClusterRole(
            f"{name}-gateway",
            metadata={"name": GATEWAY_GROUP},
            rules=[{"apiGroups": ["cilium.io"], "resources": ["ciliumnodes"], "verbs": ["list"]}],
            opts=in_cluster,
        )
        k8s.rbac.v1.ClusterRoleBinding(
            f"{name}-gateway",
            metadata={"name": GATEWAY_GROUP},
            role_ref={
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": GATEWAY_GROUP,
            },
            subjects=[
                {"kind": "Group", "name": GATEWAY_GROUP, "apiGroup": "rbac.authorization.k8s.io"}
            ],
            opts=in_cluster,
        )
