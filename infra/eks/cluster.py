"""Cluster: the EKS control plane, its system node group, core add-ons and a Kubernetes provider."""

from dataclasses import dataclass

import pulumi
import pulumi_aws as aws
import pulumi_eks as eks
import pulumi_kubernetes as k8s

from infra.core.context import ClusterContext, VpcPlacement
from infra.core.data_holders import DataGuard
from infra.core.iam import node_role, partition
from infra.core.nodes import SYSTEM_NODE_LABEL, SYSTEM_TAINT_KEY
from infra.core.tags import POOL_TAG, SYSTEM_POOL
from infra.core.versions import KUBERNETES_VERSIONS
from infra.eks.config import ClusterConfig
from infra.eks.facts import CLUSTER
from infra.vpc.network import Network, discovery_tag

CONTROL_PLANE_LOG_TYPES = ["api", "audit", "authenticator", "controllerManager", "scheduler"]


@dataclass(frozen=True)
class RemoteNodes:
    """What nodes outside the VPC need of the cluster (infra/hybrid/nodes.py remote_nodes): the
    remote node and pod networks, set on the aws:eks Cluster inside pulumi-eks's component by a
    transform, and the Pod Identity agent's configuration values for nodes without IMDS."""

    transform: pulumi.ResourceTransform
    pod_identity_values: str


class Cluster(pulumi.ComponentResource):
    name: pulumi.Output[str]
    # The system nodes' role: what their kubelets and CSI node agents act as (EFS mounts).
    system_node_role_arn: pulumi.Output[str]
    kubeconfig: pulumi.Output[str]
    provider: k8s.Provider
    cluster_security_group_id: pulumi.Output[str]
    # What every in-cluster controller waits for on create and outlives on destroy: nodes to run
    # on (with their permissions and the VPC's egress), cluster DNS (the CSI controllers reach
    # AWS APIs by name) and the Pod Identity agent that hands it AWS credentials.
    controller_prerequisites: list[pulumi.Resource]
    context: ClusterContext  # all of the above, with tags and placement, for the components

    def __init__(
        self,
        name: str,
        config: ClusterConfig,
        network: Network,
        tags: dict[str, str],
        data: DataGuard,
        opts: pulumi.ResourceOptions | None = None,
        remote_nodes: RemoteNodes | None = None,
    ):
        super().__init__("training-platform:infra:Cluster", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        addons = KUBERNETES_VERSIONS[config.kubernetes_version].addons

        secrets_key = aws.kms.Key(
            f"{name}-secrets",
            description=f"Envelope encryption of Kubernetes secrets in EKS cluster {config.name}",
            enable_key_rotation=True,
            deletion_window_in_days=30,
            # Its loss makes every Kubernetes secret of the cluster unreadable.
            tags=data.tags(CLUSTER, tags),
            opts=pulumi.ResourceOptions.merge(child, data.protect(CLUSTER)),
        )
        aws.kms.Alias(
            f"{name}-secrets",
            name=f"alias/{config.name}-eks-secrets",
            target_key_id=secrets_key.key_id,
            opts=child,
        )

        # The group EKS writes the control plane's logs to (EKS user guide, "Send control plane
        # logs to CloudWatch Logs": /aws/eks/<cluster>/cluster). pulumi-eks creates none, and EKS
        # would create it itself with no retention; created first, EKS writes into this one.
        log_group = aws.cloudwatch.LogGroup(
            f"{name}-control-plane-logs",
            name=f"/aws/eks/{config.name}/cluster",
            retention_in_days=config.log_retention_days,
            tags=tags,
            opts=child,
        )
        cluster = eks.Cluster(
            name,
            name=config.name,
            version=config.kubernetes_version,
            vpc_id=network.vpc_id,
            # Its network interfaces: in subnets of their own where the VPC is the stack's
            # (pulumi-eks passes subnet_ids, or the private and public ones, to EKS).
            **(
                {"subnet_ids": network.control_plane_subnet_ids}
                if network.control_plane_subnet_ids is not None
                else {
                    "private_subnet_ids": network.private_subnet_ids,
                    "public_subnet_ids": network.public_subnet_ids,
                }
            ),
            node_associate_public_ip_address=False,
            authentication_mode=eks.AuthenticationMode.API,
            access_entries={
                f"admin-{i}": eks.AccessEntryArgs(
                    principal_arn=arn,
                    access_policies={
                        "cluster-admin": eks.AccessPolicyAssociationArgs(
                            policy_arn=f"arn:{partition()}:eks::aws:cluster-access-policy/"
                            "AmazonEKSClusterAdminPolicy",
                            access_scope=aws.eks.AccessPolicyAssociationAccessScopeArgs(
                                type="cluster"
                            ),
                        )
                    },
                )
                for i, arn in enumerate(config.admin_principal_arns)
            },
            # Nodes come from the managed system node group below and from Karpenter.
            skip_default_node_group=True,
            # Nodes use the security group EKS creates for the cluster; no extra pulumi-eks groups.
            skip_default_security_groups=True,
            # Workload identity is EKS Pod Identity, which needs no OIDC provider.
            create_oidc_provider=False,
            endpoint_public_access=config.endpoint.public_access,
            endpoint_private_access=config.endpoint.private_access,
            public_access_cidrs=[str(c) for c in config.endpoint.public_access_cidrs]
            if config.endpoint.public_access
            else None,
            enabled_cluster_log_types=CONTROL_PLANE_LOG_TYPES,
            encryption_config_key_arn=secrets_key.arn,
            deletion_protection=config.deletion_protection,
            upgrade_policy=aws.eks.ClusterUpgradePolicyArgs(support_type=config.upgrade_policy),
            # The VPC CNI enforces the stack's NetworkPolicies (every tenant and platform
            # namespace's ingress): without it they are inert.
            vpc_cni_options=eks.VpcCniOptionsArgs(
                addon_version=addons["vpc-cni"], enable_network_policy=True
            ),
            # pulumi-eks would create CoreDNS before any node exists (or, given only a version,
            # not at all); it is created below, once the system nodes are there.
            coredns_addon_options=eks.CoreDnsAddonOptionsArgs(enabled=False),
            kube_proxy_addon_options=eks.KubeProxyAddonOptionsArgs(version=addons["kube-proxy"]),
            tags=tags,
            cluster_tags=data.tags(CLUSTER, {}),
            # Protected, with its children (the engine hands `protect` to the component's
            # provider, whose children inherit it). Hybrid nodes: the cluster's remote node and
            # pod networks (see infra/hybrid/nodes.py).
            opts=pulumi.ResourceOptions.merge(
                pulumi.ResourceOptions(parent=self, depends_on=[log_group]),
                pulumi.ResourceOptions(
                    protect=data.protect(CLUSTER).protect,
                    transforms=[remote_nodes.transform] if remote_nodes else None,
                ),
            ),
        )
        cluster_name = cluster.eks_cluster.name
        cluster_sg_id = cluster.eks_cluster.vpc_config.cluster_security_group_id

        pod_identity_agent = aws.eks.Addon(
            f"{name}-eks-pod-identity-agent",
            cluster_name=cluster_name,
            addon_name="eks-pod-identity-agent",
            addon_version=addons["eks-pod-identity-agent"],
            resolve_conflicts_on_update="OVERWRITE",
            # Hybrid nodes have no IMDS: a second DaemonSet there reads nodeadm's credentials file.
            configuration_values=remote_nodes.pod_identity_values if remote_nodes else None,
            tags=tags,
            opts=child,
        )
        # Karpenter selects node security groups by this tag; EKS creates this group, so tag it.
        for key, value in discovery_tag(config.name).items():
            aws.ec2.Tag(
                f"{name}-cluster-sg-discovery",
                resource_id=cluster_sg_id,
                key=key,
                value=value,
                opts=child,
            )

        system_nodes = self._system_node_group(name, config, cluster_name, network, tags)
        coredns = aws.eks.Addon(
            f"{name}-coredns",
            cluster_name=cluster_name,
            addon_name="coredns",
            addon_version=addons["coredns"],
            # Adopts the self-managed CoreDNS that EKS bootstraps.
            resolve_conflicts_on_create="OVERWRITE",
            resolve_conflicts_on_update="OVERWRITE",
            tags=tags,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[system_nodes]),
        )

        self.name = cluster_name
        self.kubeconfig = pulumi.Output.secret(cluster.kubeconfig_json)
        self.cluster_security_group_id = cluster_sg_id
        self.controller_prerequisites = [system_nodes, coredns, pod_identity_agent]
        self.provider = k8s.Provider(f"{name}-k8s", kubeconfig=self.kubeconfig, opts=child)
        self.context = ClusterContext(
            name=self.name,
            config_name=config.name,
            provider=self.provider,
            controller_prerequisites=self.controller_prerequisites,
            tags=tags,
            data=data,
            vpc=VpcPlacement(
                cidr=network.cidr,
                vpc_id=network.vpc_id,
                private_subnets=network.private_subnets,
                public_subnets=network.public_subnets,
                route_table_ids=network.route_table_ids,
                zones=network.zones,
                cluster_security_group_id=cluster_sg_id,
                control_plane_sources=tuple(
                    str(c) for c in network.control_plane_cidrs or [network.cidr]
                ),
            ),
        )
        self.register_outputs(
            {
                "name": self.name,
                "kubeconfig": self.kubeconfig,
                "clusterSecurityGroupId": cluster_sg_id,
            }
        )

    def _system_node_group(
        self, name, config: ClusterConfig, cluster_name, network, tags
    ) -> aws.eks.NodeGroup:
        """On-demand CPU nodes for the controllers (Karpenter, Kueue, operators, CoreDNS)."""
        child = pulumi.ResourceOptions(parent=self)
        group = config.system_node_group
        role = node_role(f"{name}-system-node", tags, child)
        self.system_node_role_arn = role.arn
        launch_template = aws.ec2.LaunchTemplate(
            f"{name}-system-node",
            block_device_mappings=[
                aws.ec2.LaunchTemplateBlockDeviceMappingArgs(
                    device_name="/dev/xvda",
                    ebs=aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs(
                        volume_size=group.disk_size_gib,
                        volume_type="gp3",
                        encrypted="true",
                        delete_on_termination="true",
                    ),
                )
            ],
            # IMDSv2 only, one hop: pods cannot borrow the node's credentials.
            metadata_options=aws.ec2.LaunchTemplateMetadataOptionsArgs(
                http_endpoint="enabled", http_tokens="required", http_put_response_hop_limit=1
            ),
            # A managed node group's own tags stay on the node group: its instances and their
            # root volumes, which bill, are tagged from here, as Karpenter tags a pool's.
            tag_specifications=[
                aws.ec2.LaunchTemplateTagSpecificationArgs(
                    resource_type=billed, tags={**tags, POOL_TAG: SYSTEM_POOL}
                )
                for billed in ("instance", "volume")
            ],
            tags=tags,
            opts=child,
        )
        return aws.eks.NodeGroup(
            f"{name}-system",
            cluster_name=cluster_name,
            node_role_arn=role.arn,
            subnet_ids=network.private_subnet_ids,
            instance_types=[group.instance_type],
            ami_type="AL2023_x86_64_STANDARD",
            capacity_type="ON_DEMAND",
            # Upgraded with the control plane (EKS's managed rolling update, after the cluster's
            # own upgrade: the group depends on it). Without a version the group stays on the
            # one it was created with, and EKS refuses the control plane's next minor upgrade.
            version=config.kubernetes_version,
            scaling_config=aws.eks.NodeGroupScalingConfigArgs(
                min_size=group.min_size, desired_size=group.desired_size, max_size=group.max_size
            ),
            update_config=aws.eks.NodeGroupUpdateConfigArgs(max_unavailable=1),
            launch_template=aws.eks.NodeGroupLaunchTemplateArgs(
                id=launch_template.id, version=launch_template.latest_version.apply(str)
            ),
            labels=SYSTEM_NODE_LABEL,
            taints=[{"key": SYSTEM_TAINT_KEY, "value": "true", "effect": "NO_SCHEDULE"}],
            tags=tags,
            # EKS creates and deletes the group's instances and ENIs with its role's policies
            # (aws_eks_node_group docs), and its nodes join and pull images through the egress.
            opts=pulumi.ResourceOptions(parent=self, depends_on=[*role.ready, *network.egress]),
        )
