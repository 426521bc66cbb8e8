"""The whole `training-platform:` namespace: every section, and the pools jobs and flavors name."""

from typing import Annotated

from pydantic import (
    AfterValidator,
    Field,
    model_validator,
)

from infra.config.base import HYBRID_POOL, ImageConfig, Model, known_region
from infra.config.cluster import ClusterConfig, KarpenterConfig
from infra.config.data_loss import DataLossAcknowledgement, holders_once
from infra.config.dev_servers import DevServersConfig
from infra.config.hybrid import HybridConfig, Pool
from infra.config.jobs import JobConfig
from infra.config.network import NetworkConfig
from infra.config.policy import PolicyConfig
from infra.config.pools import NodePoolConfig
from infra.config.queues import QueuesConfig
from infra.config.storage import StorageConfig


class MonitoringConfig(Model):
    # kube-prometheus-stack with the DCGM dashboard; the DCGM exporter runs whenever GPUs do.
    prometheus_stack: bool = False


class StackConfig(Model):
    """The whole `training-platform:` namespace. Later concerns add their sections here."""

    region: Annotated[str, AfterValidator(known_region)]
    network: NetworkConfig = NetworkConfig()
    cluster: ClusterConfig = ClusterConfig()
    karpenter: KarpenterConfig = KarpenterConfig()
    # Kueue: at most 64 flavors in a ClusterQueue resource group, one flavor per pool.
    node_pools: list[NodePoolConfig] = Field(default_factory=list, max_length=64)
    queues: QueuesConfig = QueuesConfig()
    monitoring: MonitoringConfig = MonitoringConfig()
    storage: StorageConfig = StorageConfig()
    policy: PolicyConfig = PolicyConfig()
    image: ImageConfig = ImageConfig()
    jobs: list[JobConfig] = Field(default_factory=list)
    dev_servers: DevServersConfig = DevServersConfig()
    hybrid: HybridConfig | None = None  # GPUs outside AWS as EKS hybrid nodes
    acknowledge_data_loss: Annotated[
        list[DataLossAcknowledgement], AfterValidator(holders_once)
    ] = Field(default_factory=list)

    @property
    def released(self) -> frozenset[str]:
        """The data holders whose loss this stack file accepts (infra/data_holders.py)."""
        return frozenset(a.holder for a in self.acknowledge_data_loss)

    def pool_named(self, name: str, nodes: int = 1) -> Pool | None:
        """The pool a job or DevServer flavor names: a NodePool, or the hybrid machines sized
        for `nodes` pods (HybridPool); None when there is no such pool."""
        if name == HYBRID_POOL and self.hybrid is not None:
            return self.hybrid.pool(nodes)
        return next((p for p in self.node_pools if p.name == name), None)

    def job_pool(self, job: "JobConfig") -> Pool | None:
        return self.pool_named(job.node_pool, job.max_nodes)

    @model_validator(mode="after")
    def _unique_pool_names(self) -> "StackConfig":
        names = [p.name for p in self.node_pools]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"nodePools names {', '.join(repeated)} repeat; allowed: unique names")
        return self
