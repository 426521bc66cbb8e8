"""Typed stack config: the `training-platform:` namespace of `Pulumi.<stack>.yaml`, validated once.

Every key is camelCase in YAML, as Pulumi config is written. A bad value stops the program with a
single ConfigError that names each offending key path and what is allowed there.

One module per section (network, cluster, pools with their fabric_check, hybrid, queues, storage,
jobs, dev_servers, policy), the whole namespace in stack, the checks between sections in
cross_references, and reading and error wording in loading; base holds what they share. The names
callers use are re-exported here.
"""

from infra.config.base import HYBRID_POOL, ConfigError, ImageConfig
from infra.config.cluster import (
    IAM_ROLE_NAME_MAX,
    NOT_INTERNET,
    ClusterConfig,
    KarpenterConfig,
    karpenter_role_names,
)
from infra.config.dev_servers import DevServersConfig
from infra.config.fabric_check import FABRIC_MAX_BYTES, FabricCheckPlan, fabric_sizes
from infra.config.hybrid import HybridConfig, HybridMachine, Pool, SsmActivation
from infra.config.jobs import (
    AUTONAME_SUFFIX,
    SELF_SERVICE_ACCOUNT,
    JobConfig,
    job_role_resource_name,
    team_jobs_role_resource_name,
)
from infra.config.loading import (
    config_from_pulumi,
    load_stack_file,
    load_stack_for_command,
    parse_stack_config,
    read_stack_file,
)
from infra.config.network import GATEWAY_ENDPOINTS, NetworkConfig
from infra.config.policy import (
    DOCUMENTATION_RANGES,
    MANDATORY_PRODUCTION_STACKS,
    placeholder_errors,
    public_ingress_resources,
)
from infra.config.pools import CapacityReservation, NodePoolConfig, image_target
from infra.config.queues import QueuesConfig, TeamConfig, queue_shortfall
from infra.config.runtimes import RuntimesConfig
from infra.config.stack import StackConfig
from infra.config.storage import CHECKPOINT_PREFIX, FSX_EXPORT_PREFIX, BucketConfig, FsxConfig

__all__ = [
    "AUTONAME_SUFFIX",
    "CHECKPOINT_PREFIX",
    "DOCUMENTATION_RANGES",
    "FABRIC_MAX_BYTES",
    "FSX_EXPORT_PREFIX",
    "GATEWAY_ENDPOINTS",
    "HYBRID_POOL",
    "IAM_ROLE_NAME_MAX",
    "MANDATORY_PRODUCTION_STACKS",
    "NOT_INTERNET",
    "SELF_SERVICE_ACCOUNT",
    "BucketConfig",
    "CapacityReservation",
    "ClusterConfig",
    "ConfigError",
    "DevServersConfig",
    "FabricCheckPlan",
    "FsxConfig",
    "HybridConfig",
    "HybridMachine",
    "ImageConfig",
    "JobConfig",
    "KarpenterConfig",
    "NetworkConfig",
    "NodePoolConfig",
    "Pool",
    "QueuesConfig",
    "RuntimesConfig",
    "SsmActivation",
    "StackConfig",
    "TeamConfig",
    "config_from_pulumi",
    "fabric_sizes",
    "image_target",
    "job_role_resource_name",
    "team_jobs_role_resource_name",
    "karpenter_role_names",
    "load_stack_file",
    "load_stack_for_command",
    "parse_stack_config",
    "placeholder_errors",
    "public_ingress_resources",
    "queue_shortfall",
    "read_stack_file",
]
