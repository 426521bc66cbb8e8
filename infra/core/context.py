"""What the in-cluster components take from the cluster and its network, as one typed argument.

The Cluster component builds it; every component that runs in the cluster or beside it takes it
instead of a provider, a cluster name, tags, subnets and prerequisites one by one, so an input
every component needs is added here and in Cluster, not in each constructor.
"""

import ipaddress
from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from infra.core.data_holders import DataGuard


@dataclass(frozen=True)
class VpcPlacement:
    """Where the cluster's resources go in the stack's VPC (infra/vpc/network.py)."""

    cidr: ipaddress.IPv4Network
    vpc_id: pulumi.Input[str]
    private_subnets: list[pulumi.Input[str]]  # one per AZ
    # Created VPCs only (an adopted VPC's routing stays its owner's).
    public_subnets: list[pulumi.Input[str]]
    route_table_ids: list[pulumi.Output[str]]  # public first, then one per private subnet
    zones: list[str] | None  # the created VPC's AZs; None for an adopted VPC
    cluster_security_group_id: pulumi.Input[str]  # the group EKS gives the cluster and its nodes
    # Where the API server's calls to webhooks and aggregated APIs come from: its network
    # interfaces' subnets (infra/vpc/network.py), or the whole VPC where those are adopted ones.
    control_plane_sources: tuple[str, ...]


@dataclass(frozen=True)
class ClusterContext:
    # The EKS cluster's name as the cluster reports it: whatever takes it waits for the cluster.
    name: pulumi.Output[str]
    # The same name from stack config, known before the cluster exists: for names derived from
    # it (IAM roles, the trainer's ECR repository, discovery tags) that need not wait for it.
    config_name: str
    provider: k8s.Provider
    # What every in-cluster controller waits for on create and outlives on destroy (Cluster).
    controller_prerequisites: list[pulumi.Resource]
    tags: dict[str, str]
    vpc: VpcPlacement
    data: DataGuard  # which data holders are protected (all but those acknowledgeDataLoss names)

    def in_cluster(
        self, parent: pulumi.Resource, *after: pulumi.Resource
    ) -> pulumi.ResourceOptions:
        """Options for a Kubernetes object of `parent` that waits for `after` (and outlives it
        on destroy)."""
        return pulumi.ResourceOptions(parent=parent, provider=self.provider, depends_on=list(after))

    def holding(
        self, holder: str, parent: pulumi.Resource, *after: pulumi.Resource
    ) -> pulumi.ResourceOptions:
        """in_cluster() for a Kubernetes object that holds data (a namespace): protected."""
        return pulumi.ResourceOptions.merge(
            self.in_cluster(parent, *after), self.data.protect(holder)
        )
