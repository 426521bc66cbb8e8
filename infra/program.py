"""The Pulumi program: read the stack's typed config, wire the components together, export."""

import pulumi

from infra.components.cluster import Cluster
from infra.components.network import Network
from infra.config import StackConfig, config_from_pulumi


def build_platform(config: StackConfig) -> None:
    stack = pulumi.get_stack()
    tags = {"training-platform:stack": stack, "training-platform:cluster": config.cluster.name}

    network = Network("network", config.network, cluster_name=config.cluster.name, tags=tags)
    cluster = Cluster("cluster", config.cluster, network=network, tags=tags)

    pulumi.export("vpcId", network.vpc_id)
    pulumi.export("privateSubnetIds", network.private_subnet_ids)
    pulumi.export("clusterName", cluster.name)
    pulumi.export("kubeconfig", cluster.kubeconfig)


def main() -> None:
    build_platform(config_from_pulumi())
