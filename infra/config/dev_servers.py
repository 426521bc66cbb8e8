"""`devServers`: flavors, users and idle floors of the self-service development servers."""

from typing import Annotated

from pydantic import (
    Field,
)

from infra.config.base import (
    Cidr,
    IamPrincipalArn,
    ImageConfig,
    K8sName,
    Model,
    allowed_list,
    did_you_mean,
)


class DevServerFlavorConfig(Model):
    """A DevServer size: what each of its pods asks for on `nodePool`, one pod per node at most."""

    name: K8sName
    node_pool: K8sName
    gpus: int = Field(default=0, ge=0, le=64)
    cpu: int = Field(ge=1, le=512)
    memory_gib: int = Field(ge=1, le=4096)


class DevServerQuota(Model):
    servers: int = Field(default=2, ge=1, le=100)
    gpus: int = Field(default=8, ge=0, le=1024)
    # gp3 home volumes of all the user's servers, running, stopped or kept after a delete or a
    # shrink: a ResourceQuota caps them, and the plan prices the cap.
    home_gib: int = Field(default=500, ge=1, le=65536)


class DevServerUser(Model):
    """A developer: namespace dev-<name>, admitted through their team's queue."""

    name: K8sName
    email: Annotated[str, Field(pattern=r"^[^@\s]+@[^@\s]+\.[^@\s]+$")]
    team: K8sName  # a team from queues.teams
    quota: DevServerQuota = DevServerQuota()
    iam_principal_arn: IamPrincipalArn


class DevServerIdle(Model):
    """The platform's idle floors (a server may set its own in spec.lifecycle): a server with no
    SSH session is idle with its GPUs at or below gpuPercent, or, without a GPU figure (CPU
    flavors), with CPU use between two checks at or below cpuPercent of one core."""

    gpu_percent: int = Field(default=5, ge=0, le=100)
    cpu_percent: int = Field(default=10, ge=0, le=10000)


class DevServersConfig(Model):
    """Self-service development servers: the operator, its flavors and its users."""

    enabled: bool = False
    flavors: list[DevServerFlavorConfig] = Field(default_factory=list)
    users: list[DevServerUser] = Field(default_factory=list)
    idle: DevServerIdle = DevServerIdle()
    # Source ranges a DevServer's SSH LoadBalancer accepts; empty: SSH only by port-forward.
    ssh_load_balancer_cidrs: list[Cidr] = Field(default_factory=list)
    # A prebuilt operator image by digest; empty: build devservers/Dockerfile and push it to ECR.
    operator_image: ImageConfig = ImageConfig()

    def flavor(self, name: str) -> DevServerFlavorConfig:
        """The flavor `name`, else a ValueError naming a close one and the allowed ones."""
        return _named(self.flavors, name, f"unknown flavor {name!r}")

    def user(self, name: str) -> DevServerUser:
        """The user `name`, else a ValueError naming a close one and the allowed ones."""
        return _named(self.users, name, f"{name!r} is not a DevServers user")


def _named(items: list, name: str, unknown: str):
    names = [item.name for item in items]
    if name not in names:
        raise ValueError(
            f"{unknown}; {did_you_mean(name, names)}" + allowed_list(names, "none declared")
        )
    return items[names.index(name)]
