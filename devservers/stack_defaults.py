"""What `devctl create --dry-run` takes from a stack file, with no cluster to ask: the stack's
users (whose namespace the server goes in), its flavors, and the image its servers run.

The stack file is Pulumi.<stack>.yaml of the project devctl is installed from (`pip install -e .`
from the checkout): `--stack` names it, else the first by name (Pulumi.dev.yaml here). devctl's
other commands ask the cluster instead; this module is imported for dry runs only (the operator's
image holds the devservers package alone).
"""

from dataclasses import dataclass

from devservers.api import user_namespace
from infra.core.config import ConfigError
from infra.core.paths import PROJECT_DIR
from infra.stack.config import StackConfig
from infra.stack.loading import load_stack_file
from workloads.image import stack_targets, trainer_image_repository, trainer_tag


class StackDefaultsError(ValueError):
    """A message for the user (devctl prints it as its one-line error)."""


def stack_names() -> list[str]:
    return sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in PROJECT_DIR.glob("Pulumi.*.yaml"))


@dataclass(frozen=True)
class StackDefaults:
    stack: str
    config: StackConfig

    @classmethod
    def load(cls, stack: str | None) -> "StackDefaults":
        names = stack_names()
        if stack is None and not names:
            raise StackDefaultsError(f"no Pulumi.<stack>.yaml in {PROJECT_DIR}")
        stack = stack or names[0]
        try:
            return cls(stack, load_stack_file(stack))
        except ConfigError as e:
            raise StackDefaultsError(" ".join(str(e).split())) from None

    @property
    def file(self) -> str:
        return f"Pulumi.{self.stack}.yaml"

    def namespace(self, user: str | None, source: str) -> str:
        """dev-<user> for a user of the stack's devServers.users; `source` says where `user`
        came from (--user, $USER) in the error."""
        section = self.config.dev_servers
        if not user:
            names = ", ".join(u.name for u in section.users) or "none"
            raise StackDefaultsError(
                f"whose server? pass --user (users in {self.file}: {names}) or --namespace"
            )
        try:
            return user_namespace(section.user(user).name)
        except ValueError as e:
            raise StackDefaultsError(f"{source} {e} ({self.file})") from None

    def check_flavor(self, flavor: str) -> None:
        try:
            self.config.dev_servers.flavor(flavor)
        except ValueError as e:
            raise StackDefaultsError(f"{e} ({self.file})") from None

    def image(self) -> tuple[str, str]:
        """The trainer image the stack's jobs run, and where it comes from: the prebuilt
        image.uri, else the one `pulumi up` builds (its `runtime` target when built: shell,
        sshd, torch), named by the content tag it is pushed under, immutable in ECR: the same
        sources give the same tag. The registry's account is the one part a stack file lacks."""
        if self.config.image.uri:
            return self.config.image.uri, f"image.uri of {self.file}"
        targets = stack_targets(self.config)
        if not targets:
            raise StackDefaultsError(
                f"which image? {self.file} builds no trainer image (no jobs, no image.uri): "
                "pass --image or set DEVCTL_IMAGE"
            )
        target = "runtime" if "runtime" in targets else targets[0]
        repository = trainer_image_repository(self.config, "<account>")
        return (
            f"{repository}:{trainer_tag(target)}",
            f"the {target} trainer image pulumi up builds for {self.file}: put your AWS account "
            "in place of <account>, or pass --image",
        )
