"""The Pulumi program: read the stack's typed config, wire the components together, export."""

from dataclasses import dataclass
from pathlib import Path

import pulumi
import pulumi_aws as aws

from devservers.api import OWNER_LABEL
from devservers.component import DevServers
from devservers.usage_report import POD_LABELS as JOB_POD_LABELS
from infra.billing.cost_allocation import CostAllocationTags
from infra.billing.usage_recorder import UsageRecorder
from infra.core.catalog import load_prices
from infra.core.context import ClusterContext
from infra.core.data_holders import DataGuard
from infra.core.pools import image_target
from infra.core.releases import VERSIONS_OUTPUT
from infra.core.releases import deployed as deployed_releases
from infra.core.tags import stack_tags
from infra.core.versions import KUBERNETES_VERSIONS
from infra.eks.cluster import Cluster
from infra.eks.node_monitoring_agent import NodeMonitoringAgent
from infra.gpu.efa_device_plugin import EfaDevicePlugin
from infra.gpu.metrics import GpuMetrics
from infra.gpu.nvidia_device_plugin import NvidiaDevicePlugin
from infra.gpu.registration_watch import GpuRegistrationWatch
from infra.hybrid.homes import HybridHomes
from infra.hybrid.nodes import HybridNodes, kueue_flavor, remote_nodes
from infra.karpenter.karpenter import Karpenter, feature_gates
from infra.karpenter.node_pools import NodePools
from infra.kueue.kueue import Kueue
from infra.kueue.queues import Queues
from infra.operators.training_operators import TrainingOperators
from infra.stack.config import StackConfig
from infra.stack.loading import config_from_pulumi
from infra.storage.block_storage import BlockStorage
from infra.storage.bucket import CHECKPOINT_PREFIX, TrainingBucket
from infra.storage.lustre import LustreFileSystem
from infra.storage.shared_file_system import SharedFileSystem
from infra.teams.access import TeamAccess, member_groups
from infra.teams.images import TeamImages
from infra.teams.jobs_identity import TeamJobsIdentity
from infra.teams.network import TenantNetwork
from infra.vpc.network import Network
from workloads.image import RUNTIME, TrainerImage, stack_targets, trainer_image_repository
from workloads.revisions import deployed_outputs
from workloads.stack_code import CodeImages
from workloads.tensorboard import TeamTensorBoard
from workloads.training_job import JOBS_OUTPUT, TrainingJob
from workloads.training_runtimes import RUNTIMES_OUTPUT, TrainingRuntimes

# Kustomize overlays (the job operators, the hybrid homes' provisioner), handed to the provider
# relative to this folder, the program's working directory under `pulumi up`.
OVERLAYS = Path(__file__).resolve().parent / "manifests"


@dataclass(frozen=True)
class Base:
    """The cluster and its nodes: what every later stage builds on."""

    tags: dict[str, str]
    data: DataGuard
    network: Network
    cluster: Cluster
    platform: ClusterContext
    karpenter: Karpenter
    addons: dict[str, str]
    node_monitoring: NodeMonitoringAgent
    ebs: BlockStorage
    node_pools: NodePools


@dataclass(frozen=True)
class Stores:
    bucket: TrainingBucket
    efs: SharedFileSystem | None
    fsx: LustreFileSystem | None


def build_platform(config: StackConfig) -> None:
    """The integrations in the order infra/integrations.py lists them, each stage taking what the
    ones before it made."""
    base = cluster_and_nodes(config)
    gpu_metrics = gpu_nodes(config, base)
    operators = TrainingOperators("training-operators", base.platform, OVERLAYS)
    kueue = Kueue("kueue", config.node_pools, base.platform, job_operators=operators.installs)
    stored = stores(config, base)
    hybrid = hybrid_nodes(config, base)
    queues = tenants(config, base, kueue, stored, hybrid, gpu_metrics)
    workloads(config, base, operators, kueue, stored.bucket, queues)
    if config.billing.record_usage:
        UsageRecorder(
            "usage-recorder",
            config.billing,
            {t.namespace_name: queues.namespaces[t.name] for t in config.queues.teams},
            JOB_POD_LABELS,
            base.platform,
            [kueue.release, *base.node_pools.node_pools.values()],
        )
    if config.billing.activate_cost_allocation_tags:
        CostAllocationTags("billing")
    exports(base, stored.bucket)


def cluster_and_nodes(config: StackConfig) -> Base:
    """The VPC, the cluster and its system nodes, Karpenter and its NodePools, EBS."""
    stack = pulumi.get_stack()
    tags = stack_tags(stack, config.cluster.name)
    network = Network("network", config.network, cluster_name=config.cluster.name, tags=tags)
    # Every data holder is protected but those the stack file acknowledges losing.
    data = DataGuard(config.released)
    cluster = Cluster(
        "cluster",
        config.cluster,
        network=network,
        tags=tags,
        data=data,
        remote_nodes=remote_nodes(config.hybrid) if config.hybrid else None,
    )
    platform = cluster.context
    karpenter = Karpenter(
        "karpenter",
        platform,
        gates=feature_gates(config.node_pools, config.karpenter.node_repair),
    )
    addons = KUBERNETES_VERSIONS[config.cluster.kubernetes_version].addons
    # Node conditions for Karpenter's NodeRepair, and the GPU nodes' DCGM host engine.
    node_monitoring = NodeMonitoringAgent(
        "node-monitoring-agent", platform, addons["eks-node-monitoring-agent"]
    )
    ebs = BlockStorage("ebs", platform, addons["aws-ebs-csi-driver"])
    node_pools = NodePools(
        "nodepools",
        config.node_pools,
        platform,
        instance_profile=karpenter.instance_profile_name,
        ami_alias=config.karpenter.ami_alias,
        karpenter_release=karpenter.release,
        volume_driver=ebs.addon,
    )
    return Base(
        tags, data, network, cluster, platform, karpenter, addons, node_monitoring, ebs, node_pools
    )


def gpu_nodes(config: StackConfig, base: Base) -> GpuMetrics | None:
    """Device plugins, GPU metrics and the registration watch, where GPUs are."""
    gpu_metrics = None
    hybrid_gpus = config.hybrid is not None and any(m.gpus for m in config.hybrid.machines)
    gpu_pools = [pool for pool in config.node_pools if pool.gpu]
    if hybrid_gpus or gpu_pools:
        NvidiaDevicePlugin("nvidia-device-plugin", base.platform)
        gpu_metrics = GpuMetrics(
            "gpu-metrics",
            base.platform,
            config.monitoring.prometheus_stack,
            base.node_monitoring.addon if gpu_pools else None,
            hybrid_gpus,
        )
    if gpu_pools:
        GpuRegistrationWatch(
            "gpu-registration-watch",
            config.karpenter,
            gpu_pools,
            base.platform,
            [base.node_pools.node_pools[pool.name] for pool in gpu_pools],
        )
    if any(pool.efa for pool in config.node_pools):
        EfaDevicePlugin("efa-device-plugin", base.platform)
    return gpu_metrics


def stores(config: StackConfig, base: Base) -> Stores:
    """The training bucket, and EFS and FSx where the stack has them."""
    storage = config.storage
    bucket = TrainingBucket(
        "training-bucket",
        storage.bucket,
        f"alias/{config.cluster.name}-training-bucket",
        tags=base.tags,
        data=base.data,
    )
    efs = fsx = None
    if storage.efs.enabled:
        # The nodes that mount EFS: Karpenter's (jobs, DevServers) and the system nodes (the
        # teams' TensorBoards read their checkpoints there).
        efs = SharedFileSystem(
            "efs",
            base.platform,
            base.addons["aws-efs-csi-driver"],
            mount_roles=[base.karpenter.node_role_arn, base.cluster.system_node_role_arn],
        )
    if storage.fsx.enabled:
        fsx = LustreFileSystem(
            "fsx",
            storage.fsx,
            base.platform,
            base.addons["aws-fsx-csi-driver"],
            bucket.name,
        )
    return Stores(bucket, efs, fsx)


def hybrid_nodes(config: StackConfig, base: Base) -> HybridNodes | None:
    if config.hybrid is None:
        return None
    hybrid = HybridNodes(
        "hybrid", config.hybrid, base.platform, config.cluster.kubernetes_version, OWNER_LABEL
    )
    pulumi.export("hybridGatewayIp", hybrid.gateway_public_ip)
    pulumi.export("hybridPeerConfigs", hybrid.peer_configs)
    pulumi.export("hybridBootstrap", hybrid.bootstraps)
    return hybrid


def tenants(
    config: StackConfig,
    base: Base,
    kueue: Kueue,
    stored: Stores,
    hybrid: HybridNodes | None,
    gpu_metrics: GpuMetrics | None,
) -> Queues:
    """The teams' namespaces, queues, access, identities and images; the DevServers; the fences
    and shared claims of every tenant namespace."""
    platform = base.platform
    # Pods in team and DevServer namespaces (and the jobs there) carry Kueue's finalizers, mount
    # volumes of these drivers, and are deleted by the kubelets of the pools' nodes or of the
    # machines: destroy deletes the namespaces while Kueue, the drivers and the nodes still run
    # (a NodePool deleted first would drain nodes whose do-not-disrupt pods hold the drain).
    # The AWS identity of each team's self-service jobs, which their pods use until they stop.
    team_identities = {
        team.name: TeamJobsIdentity(f"team-jobs-{team.name}", team, stored.bucket, platform)
        for team in config.queues.teams
    }
    namespace_prerequisites = [
        kueue.release,
        base.ebs.addon,
        *(stored.efs.driver if stored.efs else []),
        *(stored.fsx.driver if stored.fsx else []),
        *base.node_pools.node_pools.values(),
        *([hybrid] if hybrid else []),
        *(r for identity in team_identities.values() for r in identity.ready),
    ]
    queues = Queues(
        "queues",
        config.node_pools,
        config.queues,
        kueue.release,
        namespace_prerequisites,
        platform,
        extra_flavors=(kueue_flavor(config.hybrid),) if config.hybrid else (),
    )
    teams = config.queues.teams
    dev_users = config.dev_servers.users if config.dev_servers.enabled else []
    TeamAccess(
        "team-access",
        teams,
        queues.namespaces,
        platform,
        entries_elsewhere={user.iam_principal_arn for user in dev_users},
    )
    if any(team.image_repository for team in teams):
        team_images = TeamImages("team-images", teams, platform)
        pulumi.export("teamImageRepositories", team_images.urls)
    dev_namespaces = {}
    if config.dev_servers.enabled:
        dev_namespaces = dev_servers(
            config, base, kueue, queues, stored, gpu_metrics, namespace_prerequisites
        )
    for team, identity in team_identities.items():
        identity.account_in(queues.namespaces[team])
    # Every team namespace and every user's DevServer namespace refuses connections its own
    # policies do not admit, and gets the shared claim.
    TenantNetwork("tenant-network", platform, queues.namespaces, dev_namespaces)
    if stored.efs:
        stored.efs.claim_in({**queues.namespaces, **dev_namespaces})
    if stored.fsx:
        stored.fsx.claim_in(queues.namespaces)
    return queues


def dev_servers(
    config: StackConfig,
    base: Base,
    kueue: Kueue,
    queues: Queues,
    stored: Stores,
    gpu_metrics: GpuMetrics | None,
    namespace_prerequisites: list,
) -> dict:
    flavor_pools = {f.name: config.flavor_pool(f) for f in config.dev_servers.flavors}
    home_prerequisites = []
    if any(pool.hybrid for pool in flavor_pools.values()):
        # Homes on the machines' disks: their provisioner outlives the user namespaces whose
        # claims it removes (the machines already do: namespace_prerequisites).
        homes = HybridHomes("hybrid-homes", base.platform, OVERLAYS)
        home_prerequisites = [homes]
    return DevServers(
        "dev-servers",
        config.dev_servers,
        flavor_pools,
        config.queues.teams,
        base.platform,
        [kueue.release, queues],
        [*namespace_prerequisites, *home_prerequisites],
        gpu_metrics,
        efs=stored.efs is not None,
        member_groups=member_groups(config.queues.teams),
        trainer_repository=trainer_image_repository(config, aws.get_caller_identity().account_id),
        prices=load_prices(config.region),
    ).namespaces


def workloads(
    config: StackConfig,
    base: Base,
    operators: TrainingOperators,
    kueue: Kueue,
    bucket: TrainingBucket,
    queues: Queues,
) -> None:
    """The trainer image, the teams' TensorBoards, the pools' runtimes, the stack's jobs."""
    targets = stack_targets(config)
    if not targets:
        return
    platform, namespaces = base.platform, queues.namespaces
    enabled_storage = set(config.storage.shared_file_systems)
    job_pools = {job.name: config.job_pool(job) for job in config.jobs}
    image = TrainerImage("trainer-image", config.image, targets, platform)
    pulumi.export("trainerImages", image.refs)
    for team in config.queues.teams:
        if team.tensorboard:
            TeamTensorBoard(
                f"tensorboard-{team.name}",
                team,
                namespaces[team.name],
                image.refs[RUNTIME],
                bucket,
                platform,
                enabled_storage,
            )
    deployed = deployed_outputs(JOBS_OUTPUT, RUNTIMES_OUTPUT)
    runtimes = TrainingRuntimes(
        "training-runtimes",
        config.node_pools,
        config.runtimes,
        image.refs,
        bucket,
        enabled_storage,
        platform,
        operators.trainer,
        deployed[RUNTIMES_OUTPUT],
    )
    # Read back by the next update, as the jobs' (below).
    pulumi.export(
        RUNTIMES_OUTPUT,
        {
            name: {
                "revision": config.runtimes.revision,
                "manifest": manifest,
                "heldBack": runtimes.held_back[name],
            }
            for name, manifest in runtimes.manifests.items()
        },
    )
    code_images = {}
    code_jobs = [(job, image_target(job_pools[job.name])) for job in config.jobs if job.code]
    if code_jobs:
        code_images = CodeImages("job-code", code_jobs, image.refs, platform).refs
        pulumi.export("codeImages", code_images)
    jobs = {}
    for job in config.jobs:
        pool = job_pools[job.name]
        runtime = [runtimes.runtimes[pool.name]] if job.kind == "TrainJob" else []
        jobs[job.name] = TrainingJob(
            f"job-{job.name}",
            job,
            pool,
            namespaces[job.queue],
            code_images.get(job.name) or job.image or image.refs[image_target(pool)],
            bucket,
            platform,
            # The EFS and FSx CSI node agents do not run on hybrid machines.
            set() if pool.hybrid else enabled_storage,
            [
                *operators.installs,
                kueue.release,
                queues.local_queues[job.queue],
                *runtime,
            ],
            deployed[JOBS_OUTPUT],
        )
    # Read back by the next update (deployed_jobs): what each job runs, at which revision.
    pulumi.export(
        JOBS_OUTPUT,
        {
            job.name: {
                "revision": job.revision,
                "manifest": jobs[job.name].manifest,
                "heldBack": jobs[job.name].held_back,
            }
            for job in config.jobs
        },
    )


def exports(base: Base, bucket: TrainingBucket) -> None:
    # The releases this update deploys: the plan of the next one names what moving each does.
    pulumi.export(VERSIONS_OUTPUT, deployed_releases())
    pulumi.export("bucketName", bucket.name)
    pulumi.export("checkpointPrefixPolicy", bucket.prefix_policy(CHECKPOINT_PREFIX))
    pulumi.export("vpcId", base.network.vpc_id)
    pulumi.export("privateSubnetIds", base.network.private_subnet_ids)
    pulumi.export("clusterName", base.cluster.name)
    pulumi.export("kubeconfig", base.cluster.kubeconfig)


def main() -> None:
    build_platform(config_from_pulumi())
