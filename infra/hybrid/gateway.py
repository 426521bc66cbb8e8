"""The hybrid nodes' WireGuard gateway: an instance in a public subnet with an Elastic IP, the hub
every machine dials, its firewall, its machines (one SSM parameter each, read every 30 s by its
sync, infra/hybrid/gateway_sync.py), its IAM, its access to the cluster (list CiliumNodes, label the
machines' nodes), and the VPC's routes through it.
"""

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s
import pulumi_random as random

from infra.core.context import ClusterContext
from infra.core.iam import assume_role_policy, partition, policy_document
from infra.core.nodes import MACHINE_LABEL, POOL_LABEL
from infra.core.versions import WIREGUARD_GATEWAY_AMI_PARAMETER
from infra.hybrid.config import HybridConfig
from infra.hybrid.gateway_boot import (
    KEY_PLACEHOLDER,
    GatewayNetworks,
    SyncTarget,
    gateway_interface,
    user_data,
)
from infra.hybrid.gateway_sync import machine_parameter
from mesh.wireguard import Spoke, public_key

WIREGUARD_PORT = 51820
# The gateway's root volume: the size of the AL2023 AMI's own snapshot, stated so that the plan
# prices it (EC2 refuses a size below the snapshot's; the provider resizes in place).
GATEWAY_ROOT_GIB = 8
# The Kubernetes group of the gateway's IAM role: it may list CiliumNodes and Nodes and patch
# Nodes, and the gateway admission policy (infra/hybrid/admission.py) lets its patches change the
# hybrid machines' two labels and nothing else.
GATEWAY_GROUP = "hybrid-wireguard-gateway"
# ICMP "fragmentation needed" (type 3, code 4): path MTU discovery through the tunnel, whose MTU
# is below the VPC's (EC2 user guide, "Path MTU Discovery").
FRAGMENTATION_NEEDED = (3, 4)


def wireguard_sources(config: HybridConfig) -> list[str]:
    """Where WireGuard may come from: the machines' public addresses when every one has one,
    else anywhere (a machine behind a changing address could not join)."""
    addresses = [m.public_address for m in config.machines]
    if all(addresses):
        return sorted({f"{a}/32" for a in addresses})
    return ["0.0.0.0/0"]


def wireguard_gateway(
    owner: pulumi.Resource,
    name: str,
    config: HybridConfig,
    cluster: ClusterContext,
    region: str,
    account: str,
    cluster_arn: pulumi.Output[str],
    remote_cidrs: list[str],
    machine_spokes: pulumi.Output[list[Spoke]],
    gateway_key: random.RandomBytes,
    activation_ids: dict[str, pulumi.Output[str]],
) -> tuple[pulumi.Output[str], pulumi.Output[str]]:
    """The WireGuard hub instance, its machines, address, firewall and the VPC's routes: its
    public IP, and the ARN of its private key's parameter."""
    child = pulumi.ResourceOptions(parent=owner)
    group = aws.ec2.SecurityGroup(
        f"{name}-gateway",
        description="WireGuard gateway to EKS hybrid nodes",
        vpc_id=cluster.vpc.vpc_id,
        ingress=[
            # The only port open beyond the VPC: WireGuard answers no unauthenticated packet.
            {
                "protocol": "udp",
                "from_port": WIREGUARD_PORT,
                "to_port": WIREGUARD_PORT,
                "cidr_blocks": wireguard_sources(config),
                "description": "WireGuard from the machines",
            },
            # What the VPC sends the machines: the control plane to the kubelets (10250), the
            # control plane and VPC pods to the machines' pods; the gateway's forwarding rules
            # narrow it to those (infra/hybrid/gateway_boot.py). Replies to the machines' own
            # traffic need no rule: security groups are stateful.
            {
                "protocol": "tcp",
                "from_port": 0,
                "to_port": 65535,
                "cidr_blocks": [str(cluster.vpc.cidr)],
                "description": "VPC TCP forwarded to the hybrid nodes and their pods",
            },
            {
                "protocol": "icmp",
                "from_port": FRAGMENTATION_NEEDED[0],
                "to_port": FRAGMENTATION_NEEDED[1],
                "cidr_blocks": [str(cluster.vpc.cidr)],
                "description": "Path MTU discovery",
            },
        ],
        egress=[{"protocol": "-1", "from_port": 0, "to_port": 0, "cidr_blocks": ["0.0.0.0/0"]}],
        tags={**cluster.tags, "Name": f"{name}-gateway"},
        opts=child,
    )
    # The gateway itself lists CiliumNodes; with a private endpoint it does so in the VPC.
    aws.vpc.SecurityGroupIngressRule(
        f"{name}-cluster-https-gateway",
        security_group_id=cluster.vpc.cluster_security_group_id,
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
        tags=cluster.tags,
        opts=child,
    )
    # One parameter per machine, under one path: adding or removing a machine adds or
    # removes a parameter, which the gateway picks up without being replaced. It is public (a
    # key, an address, an activation ID): not a secret, so previews show what changes in it.
    peers_path = f"/{pulumi.get_project()}/{pulumi.get_stack()}/{name}-wireguard-peers"
    for i, machine in enumerate(config.machines):
        activation = activation_ids.get(machine.name)
        value = pulumi.Output.all(
            machine_spokes.apply(lambda all_spokes, i=i: public_key(all_spokes[i].private_key)),
            activation,
        ).apply(
            lambda args, machine=machine: machine_parameter(
                machine.name, args[0], str(machine.address), args[1]
            )
        )
        aws.ssm.Parameter(
            f"{name}-peer-{machine.name}",
            name=f"{peers_path}/{machine.name}",
            type="String",
            description=f"WireGuard peer and node of hybrid machine {machine.name} (public)",
            insecure_value=pulumi.Output.unsecret(value),
            tags=cluster.tags,
            opts=child,
        )
    role = aws.iam.Role(
        f"{name}-gateway",
        assume_role_policy=assume_role_policy("ec2.amazonaws.com"),
        tags=cluster.tags,
        opts=child,
    )
    # Exactly what the gateway calls: its key once at boot, the machines, their managed
    # instances (a List action: no resource-level permission) and the cluster's endpoint on
    # every sync. The key is a SecureString under the AWS managed key aws/ssm, whose key policy
    # lets SSM decrypt for callers in the account (no kms:Decrypt here); `aws eks get-token`
    # presigns sts:GetCallerIdentity, which needs no permission.
    peers_arn = f"arn:{partition()}:ssm:{region}:{account}:parameter{peers_path}"
    aws.iam.RolePolicy(
        f"{name}-gateway",
        role=role.name,
        policy=pulumi.Output.all(key_parameter.arn, cluster_arn).apply(
            lambda arns: policy_document(
                [
                    {"Effect": "Allow", "Action": "ssm:GetParameter", "Resource": arns[0]},
                    # Authorized against the requested path, not the parameters returned
                    # (Parameter Store, "How Parameter Store authorizes parameter retrieval").
                    {
                        "Effect": "Allow",
                        "Action": "ssm:GetParametersByPath",
                        "Resource": peers_arn,
                    },
                    {
                        "Effect": "Allow",
                        "Action": "ssm:DescribeInstanceInformation",
                        "Resource": "*",
                    },
                    {"Effect": "Allow", "Action": "eks:DescribeCluster", "Resource": arns[1]},
                ]
            )
        ),
        opts=child,
    )
    gateway_cluster_access(owner, name, role, cluster)
    profile = aws.iam.InstanceProfile(f"{name}-gateway", role=role.name, opts=child)

    networks = GatewayNetworks(
        cluster.vpc.cidr, tuple(config.remote_node_cidrs), tuple(config.remote_pod_cidrs)
    )
    interface = gateway_interface(
        KEY_PLACEHOLDER,
        config.gateway_address,
        config.remote_node_cidrs[0],
        WIREGUARD_PORT,
        networks.pods,
    )
    ami = aws.ssm.get_parameter_output(name=WIREGUARD_GATEWAY_AMI_PARAMETER).value
    instance = aws.ec2.Instance(
        f"{name}-gateway",
        ami=ami,
        instance_type=config.gateway_instance_type,
        subnet_id=cluster.vpc.public_subnets[0],
        vpc_security_group_ids=[group.id],
        iam_instance_profile=profile.name,
        # It forwards packets for addresses that are not its own.
        source_dest_check=False,
        # Reaches the package repositories at boot, before the Elastic IP is attached.
        associate_public_ip_address=True,
        # Nothing in it depends on the machines; a change of what it does depend on (the
        # networks, the boot script) needs a new instance, as user data runs once.
        user_data=pulumi.Output.all(key_parameter.name, cluster.name).apply(
            lambda args: user_data(
                region,
                args[0],
                interface,
                networks,
                SyncTarget(region, args[1], peers_path, networks.pods, POOL_LABEL, MACHINE_LABEL),
            )
        ),
        user_data_replace_on_change=True,
        metadata_options={"http_tokens": "required", "http_put_response_hop_limit": 1},
        root_block_device={
            "encrypted": True,
            "volume_type": "gp3",
            "volume_size": GATEWAY_ROOT_GIB,
        },
        tags={**cluster.tags, "Name": f"{name}-gateway"},
        # A newer AMI must not replace a working gateway (and its address) on every update.
        opts=pulumi.ResourceOptions(parent=owner, ignore_changes=["ami"]),
    )
    address = aws.ec2.Eip(
        f"{name}-gateway",
        domain="vpc",
        instance=instance.id,
        tags={**cluster.tags, "Name": f"{name}-gateway"},
        opts=child,
    )
    for i, table in enumerate(cluster.vpc.route_table_ids):
        for j, cidr in enumerate(remote_cidrs):
            aws.ec2.Route(
                f"{name}-route-{i}-{j}",
                route_table_id=table,
                destination_cidr_block=cidr,
                network_interface_id=instance.primary_network_interface_id,
                opts=child,
            )
    return address.public_ip, key_parameter.arn


def gateway_cluster_access(
    owner: pulumi.Resource, name: str, role: aws.iam.Role, cluster: ClusterContext
) -> None:
    """The gateway's role may list CiliumNodes (their pod CIDRs) and Nodes, and label Nodes."""
    aws.eks.AccessEntry(
        f"{name}-gateway",
        cluster_name=cluster.name,
        principal_arn=role.arn,
        type="STANDARD",
        kubernetes_groups=[GATEWAY_GROUP],
        tags=cluster.tags,
        opts=pulumi.ResourceOptions(parent=owner),
    )
    in_cluster = pulumi.ResourceOptions(parent=owner, provider=cluster.provider)
    k8s.rbac.v1.ClusterRole(
        f"{name}-gateway",
        metadata={"name": GATEWAY_GROUP},
        rules=[
            {"apiGroups": ["cilium.io"], "resources": ["ciliumnodes"], "verbs": ["list"]},
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "patch"]},
        ],
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
