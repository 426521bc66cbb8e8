"""The whole `training-platform:` namespace: every section, and the pools jobs and flavors name."""

from typing import Annotated

from pydantic import (
    AfterValidator,
    Field,
    model_validator,
)

from infra.billing.config import BillingConfig
from infra.core.config import HYBRID_POOL, ImageConfig, Model, known_region
from infra.core.pools import Pool
from infra.eks.config import ClusterConfig, KarpenterConfig
from infra.hybrid.config import HybridConfig
from infra.jobs.config import JobConfig
from infra.jobs.runtimes import RuntimesConfig
from infra.karpenter.config import NodePoolConfig
from infra.kueue.config import QueuesConfig
from infra.stack.data_loss import DataLossAcknowledgement, holders_once
from infra.stack.dev_servers import DevServerFlavorConfig, DevServersConfig
from infra.stack.policy import PolicyConfig
from infra.storage.config import StorageConfig
from infra.vpc.config import NetworkConfig


class MonitoringConfig(Model):
    """Metrics: the DCGM exporter runs wherever GPUs do; Prometheus only when asked."""

    prometheus_stack: bool = Field(
        default=False, description="Install kube-prometheus-stack with the DCGM dashboard."
    )


class StackConfig(Model):
    """The whole `training-platform:` namespace. Later concerns add their sections here."""

    region: Annotated[str, AfterValidator(known_region)] = Field(
        description="One of infra/core/regions.py with prices in "
        "infra/core/catalog/prices/<region>.yaml."
    )
    network: NetworkConfig = Field(default=NetworkConfig(), description=NetworkConfig.__doc__)
    cluster: ClusterConfig = Field(default=ClusterConfig(), description=ClusterConfig.__doc__)
    karpenter: KarpenterConfig = Field(
        default=KarpenterConfig(), description=KarpenterConfig.__doc__
    )
    node_pools: list[NodePoolConfig] = Field(
        default_factory=list,
        max_length=64,
        description="Karpenter NodePools, names unique; at most 64 (Kueue's flavors in a "
        "ClusterQueue resource group, one flavor per pool).",
    )
    queues: QueuesConfig = Field(default=QueuesConfig(), description=QueuesConfig.__doc__)
    monitoring: MonitoringConfig = Field(
        default=MonitoringConfig(), description=MonitoringConfig.__doc__
    )
    storage: StorageConfig = Field(default=StorageConfig(), description=StorageConfig.__doc__)
    policy: PolicyConfig = Field(default=PolicyConfig(), description=PolicyConfig.__doc__)
    image: ImageConfig = Field(
        default=ImageConfig(),
        description="The trainer image every job runs, by digest; empty: built from "
        "trainer/Dockerfile (a `runtime` and an `efa` target) and pushed to ECR. A prebuilt "
        "image serves EFA pools too, so it must ship libfabric and aws-ofi-nccl.",
    )
    jobs: list[JobConfig] = Field(
        default_factory=list,
        description="Training jobs: they start, and bill, on pulumi up, and stay until removed "
        "from this list.",
    )
    runtimes: RuntimesConfig = Field(default=RuntimesConfig(), description=RuntimesConfig.__doc__)
    dev_servers: DevServersConfig = Field(
        default=DevServersConfig(), description=DevServersConfig.__doc__
    )
    billing: BillingConfig = Field(default=BillingConfig(), description=BillingConfig.__doc__)
    hybrid: HybridConfig | None = Field(
        default=None, description="GPUs outside AWS as EKS hybrid nodes; none by default."
    )
    acknowledge_data_loss: Annotated[
        list[DataLossAcknowledgement], AfterValidator(holders_once)
    ] = Field(
        default_factory=list,
        description="The data holders whose replacement or deletion this stack file accepts "
        "(docs: day two); every other one is protected, and the plan refuses its loss.",
    )

    @property
    def released(self) -> frozenset[str]:
        """The data holders whose loss this stack file accepts (infra/core/data_holders.py)."""
        return frozenset(a.holder for a in self.acknowledge_data_loss)

    def pool_named(self, name: str, nodes: int = 1) -> Pool | None:
        """The pool `name`: a NodePool, or every hybrid machine sized for `nodes` pods
        (HybridPool); None when there is no such pool."""
        if name == HYBRID_POOL and self.hybrid is not None:
            return self.hybrid.pool(nodes)
        return next((p for p in self.node_pools if p.name == name), None)

    def job_pool(self, job: "JobConfig") -> Pool | None:
        """Where a job's pods go: its NodePool, or the hybrid machines that admit its team."""
        if job.node_pool == HYBRID_POOL and self.hybrid is not None:
            return self.hybrid.pool(job.max_nodes, self.hybrid.admitting(job.queue))
        return self.pool_named(job.node_pool, job.max_nodes)

    def flavor_pool(self, flavor: "DevServerFlavorConfig") -> Pool | None:
        """Where a DevServer flavor's pods go: its NodePool, or its hybrid machine."""
        if flavor.node_pool == HYBRID_POOL and self.hybrid is not None:
            machines = tuple(m for m in self.hybrid.machines if m.name == flavor.machine)
            return self.hybrid.pool(1, machines) if machines else None
        return self.pool_named(flavor.node_pool)

    @model_validator(mode="after")
    def _unique_pool_names(self) -> "StackConfig":
        names = [p.name for p in self.node_pools]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"nodePools names {', '.join(repeated)} repeat; allowed: unique names")
        return self
