"""`devServers`: flavors, users and idle floors of the self-service development servers."""

from typing import Annotated

from pydantic import (
    Field,
)

from infra.core.config import (
    Cidr,
    IamPrincipalArn,
    ImageConfig,
    ImageRegistry,
    K8sName,
    Model,
    allowed_list,
    did_you_mean,
)


class DevServerFlavorConfig(Model):
    """A DevServer size: what each of its pods asks for on `nodePool`, one pod per node at most."""

    name: K8sName = Field(description="The flavor's name (devctl create --flavor).")
    node_pool: K8sName = Field(
        description="A pool of nodePools (not one Kueue places by topology), or `hybrid`: "
        "homes on the machines' disks."
    )
    gpus: int = Field(default=0, ge=0, le=64, description="GPUs per pod.")
    cpu: int = Field(
        ge=1,
        le=512,
        description="vCPUs per pod: must fit the pool's smallest type, leaving 10 % of its "
        "vCPUs (on hybrid: one machine at least).",
    )
    memory_gib: int = Field(
        ge=1, le=4096, description="Memory per pod, GiB, leaving 15 % of the node's memory."
    )
    machine: K8sName | None = Field(
        default=None,
        description="On `hybrid` only, and required there: the machine (hybrid.machines) its "
        "servers run on. Only the users it admits (its owner and allow) can start them.",
    )


class DevServerQuota(Model):
    """The user's ResourceQuota in dev-<user>."""

    servers: int = Field(default=2, ge=1, le=100, description="DevServers at once.")
    gpus: int = Field(default=8, ge=0, le=1024, description="GPUs requested at once.")
    home_gib: int = Field(
        default=500,
        ge=1,
        le=65536,
        description="GiB of gp3 home volumes of all the user's servers, running, stopped or "
        "kept after a delete or a shrink; the plan prices this cap. Homes on hybrid machines "
        "are not counted.",
    )
    cpu: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="vCPU requests (= limits) of all the user's pods. Unset: the most that "
        "`servers` one-pod servers of the stack's flavors can ask for within `gpus`, so only "
        "distributed servers' extra pods meet it.",
    )
    memory_gib: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="GiB of memory requests (= limits) of all the user's pods; unset, as `cpu`.",
    )


class DevServerUser(Model):
    """A developer: namespace dev-<name>, admitted through their team's queue."""

    name: K8sName = Field(description="The user's name: namespace dev-<name>.")
    email: Annotated[str, Field(pattern=r"^[^@\s]+@[^@\s]+\.[^@\s]+$")] = Field(
        description="Written on the namespace (an annotation); an example.com address is a "
        "placeholder pulumi up refuses."
    )
    team: K8sName = Field(description="A team of queues.teams, whose ClusterQueue admits them.")
    quota: DevServerQuota = Field(default=DevServerQuota(), description="Their quota.")
    iam_principal_arn: IamPrincipalArn = Field(
        description="The IAM role or user mapped to their Kubernetes groups (dev:<user>, "
        "dev:users) by an EKS access entry."
    )


class DevServerIdle(Model):
    """The platform's idle floors (a server may set its own in spec.lifecycle): a server with no
    SSH session is idle with its GPUs at or below gpuPercent, or, without a GPU figure (CPU
    flavors), with CPU use between two checks at or below cpuPercent of one core."""

    gpu_percent: int = Field(
        default=5, ge=0, le=100, description="GPU utilization at or below which a GPU is idle."
    )
    cpu_percent: int = Field(
        default=10,
        ge=0,
        le=10000,
        description="CPU use between two checks, % of one core, at or below which a server "
        "without a GPU figure is idle.",
    )
    counted_stop_hours: int = Field(
        default=8,
        ge=1,
        le=168,
        description="Hours of each idle stop `devctl savings` counts as saved (a working day); "
        "the rest of a longer stop is reported apart, as a server forgotten, not a saving.",
    )


class DevServersConfig(Model):
    """Self-service development servers: the operator, its flavors and its users."""

    enabled: bool = Field(
        default=False, description="Install the DevServer CRDs, the operator and the users."
    )
    flavors: list[DevServerFlavorConfig] = Field(
        default_factory=list, description="Server sizes, each on a pool."
    )
    users: list[DevServerUser] = Field(default_factory=list, description="The developers.")
    idle: DevServerIdle = Field(
        default=DevServerIdle(),
        description="The platform's idle floors (a server may set its own).",
    )
    ssh_load_balancer_cidrs: list[Cidr] = Field(
        default_factory=list,
        # Each range is two inbound rules of the balancer's security group, TCP 22 and ICMP for
        # path MTU discovery (the AWS cloud provider, kubernetes/kubernetes#63572), and a group
        # holds 60 by default (VPC quotas, "Inbound or outbound rules per security group"):
        # beyond 30 the balancer fails with RulesPerSecurityGroupLimitExceeded
        # (kubernetes/kubernetes#68684) after `pulumi up`, when a user asks for one.
        max_length=30,
        description="Source ranges a DevServer's SSH LoadBalancer admits, at most 30 (two rules "
        "each in its security group of 60 by default); empty: SSH only through the API "
        "server's port-forward (devctl ssh).",
    )
    operator_image: ImageConfig = Field(
        default=ImageConfig(),
        description="The operator's image by digest; empty: built from devservers/Dockerfile and "
        "pushed to ECR by pulumi up.",
    )
    allowed_image_registries: list[ImageRegistry] = Field(
        default_factory=list,
        max_length=50,
        description="Where servers' images may come from, beside the stack's own trainer "
        "repository (always allowed): registries (`ghcr.io`) or repositories and the paths below "
        "them (`123456789012.dkr.ecr.us-west-2.amazonaws.com/team-images`), matched component "
        "by component (devservers/images.py), never as substrings.",
    )
    require_image_digest: bool = Field(
        default=False,
        description="Refuse images named by tag alone. Off by default: the trainer repository's "
        "tags are immutable (ECR IMMUTABLE), so its tags already name one image each.",
    )

    def cpu_and_memory_quota(self, user: DevServerUser) -> tuple[int, int]:
        """(vCPU, GiB) of `user`'s ResourceQuota: as set, else the most that `servers` one-pod
        servers can request within the user's GPU quota, each of any flavor."""
        quota = user.quota
        if quota.cpu is not None and quota.memory_gib is not None:
            return quota.cpu, quota.memory_gib
        cpu = _most(self.flavors, quota.servers, quota.gpus, lambda f: f.cpu)
        memory = _most(self.flavors, quota.servers, quota.gpus, lambda f: f.memory_gib)
        return quota.cpu or max(cpu, 1), quota.memory_gib or max(memory, 1)

    def flavor(self, name: str) -> DevServerFlavorConfig:
        """The flavor `name`, else a ValueError naming a close one and the allowed ones."""
        return _named(self.flavors, name, f"unknown flavor {name!r}")

    def user(self, name: str) -> DevServerUser:
        """The user `name`, else a ValueError naming a close one and the allowed ones."""
        return _named(self.users, name, f"{name!r} is not a DevServers user")


def _most(flavors: list[DevServerFlavorConfig], servers: int, gpus: int, amount) -> int:
    """The largest sum of `amount(flavor)` over at most `servers` flavors (repeats allowed)
    whose GPUs add up to at most `gpus`: a knapsack over (servers, GPUs)."""
    gpus = min(gpus, servers * max((f.gpus for f in flavors), default=0))
    best = [[0] * (gpus + 1) for _ in range(servers + 1)]
    for n in range(1, servers + 1):
        for g in range(gpus + 1):
            best[n][g] = max(
                [best[n - 1][g]]
                + [best[n - 1][g - f.gpus] + amount(f) for f in flavors if f.gpus <= g]
            )
    return best[servers][gpus]


def _named(items: list, name: str, unknown: str):
    names = [item.name for item in items]
    if name not in names:
        raise ValueError(
            f"{unknown}; {did_you_mean(name, names)}" + allowed_list(names, "none declared")
        )
    return items[names.index(name)]
