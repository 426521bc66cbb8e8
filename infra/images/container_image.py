"""Images the platform builds from its own folders: an ECR repository each, and one image per
Dockerfile target, tagged by exactly what makes pulumi-docker-build rebuild it."""

import hashlib
import json
import re
from pathlib import Path

import pulumi
import pulumi_aws as aws
import pulumi_docker_build as docker_build

from infra.core.config import ImageConfig
from infra.core.context import ClusterContext
from infra.core.data_holders import DataGuard
from infra.core.paths import provider_path
from infra.images.facts import IMAGES

PLATFORMS = ["linux/amd64"]

# How many builds a repository keeps: a job or runtime held at an older revision needs its
# image to stay among them (deploy/day_two.py says so).
KEPT_BUILDS = 50
LIFECYCLE = {
    "rules": [
        {
            "rulePriority": 1,
            "description": "drop untagged layers after a week",
            "selection": {
                "tagStatus": "untagged",
                "countType": "sinceImagePushed",
                "countUnit": "days",
                "countNumber": 7,
            },
            "action": {"type": "expire"},
        },
        {
            "rulePriority": 2,
            "description": f"keep the newest {KEPT_BUILDS} builds",
            "selection": {
                "tagStatus": "any",
                "countType": "imageCountMoreThan",
                "countNumber": KEPT_BUILDS,
            },
            "action": {"type": "expire"},
        },
    ]
}


def _ignore_patterns(context: Path) -> list[re.Pattern]:
    """.dockerignore's glob patterns as regular expressions over context-relative paths."""
    patterns = []
    ignore = context / ".dockerignore"
    for line in (ignore.read_text() if ignore.is_file() else "").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("!"):
            raise ValueError(f"{context / '.dockerignore'}: `!` exceptions are not supported")
        regex = "".join(
            "(.*/)?"
            if part == "**/"
            else "[^/]*"
            if part == "*"
            else "[^/]"
            if part == "?"
            else re.escape(part)
            for part in re.split(r"(\*\*/|\*|\?)", line.strip("/"))
        )
        # A pattern that names a folder excludes everything below it.
        patterns.append(re.compile(f"{regex}(/.*)?"))
    return patterns


def context_files(context: Path) -> list[Path]:
    """The files Docker sends as the build context: all of `context` less .dockerignore."""
    ignored = _ignore_patterns(context)
    return sorted(
        path
        for path in context.rglob("*")
        if path.is_file()
        and not any(p.fullmatch(path.relative_to(context).as_posix()) for p in ignored)
    )


def source_tag(
    target: str,
    context: Path,
    dockerfile: Path | None,
    inline: str = "",
    build_args: tuple = (),
) -> str:
    """The tag of the image built for `target`: it changes whenever pulumi-docker-build would
    rebuild it.

    The provider rebuilds when the context's files (names, modes, contents), the Dockerfile (a
    file of the context, or `inline` text), the target, the build arguments or the platforms
    change, and pushes under the tags given. ECR tags here are immutable, so a rebuild must never
    push a new digest under an existing tag: the tag hashes the same things (a build argument
    known only after an apply, as a base image's digest, by what fixes it: its own tag).
    """
    digest = hashlib.sha256()
    files = [dockerfile, *context_files(context)] if dockerfile else context_files(context)
    for path in files:
        digest.update(path.relative_to(context).as_posix().encode() + b"\0")
        digest.update(f"{path.stat().st_mode:o}".encode() + b"\0")
        digest.update(path.read_bytes())
    built_from = [inline, list(build_args)] if inline or build_args else []
    digest.update(json.dumps([target, PLATFORMS, *built_from]).encode())
    return f"{target}-{digest.hexdigest()[:16]}"


class EcrRepository:
    """An ECR repository the stack pushes its builds to (scan on push, immutable tags that
    change exactly when the build would, lifecycle policy), and the credential to push."""

    def __init__(
        self,
        name: str,
        repository_name: pulumi.Input[str],
        tags: dict[str, str],
        opts: pulumi.ResourceOptions,
        data: DataGuard,
    ):
        self.opts = opts
        self.repository = aws.ecr.Repository(
            name,
            name=repository_name,
            image_tag_mutability="IMMUTABLE",
            # The images running jobs and servers pull, those pinned by older job revisions
            # included (workloads/training_job.py): a data holder, protected, never emptied by a
            # deletion (AWS refuses to delete a repository that still holds images).
            force_delete=False,
            image_scanning_configuration={"scan_on_push": True},
            encryption_configurations=[{"encryption_type": "AES256"}],
            tags=data.tags(IMAGES, tags),
            opts=pulumi.ResourceOptions.merge(opts, data.protect(IMAGES)),
        )
        aws.ecr.LifecyclePolicy(
            name, repository=self.repository.name, policy=json.dumps(LIFECYCLE), opts=opts
        )
        token = aws.ecr.get_authorization_token_output(registry_id=self.repository.registry_id)
        # One registry per account and region: this credential also pulls a base image from
        # the stack's other repositories.
        self.registries = [
            {
                "address": self.repository.repository_url,
                "username": token.user_name,
                # A registry credential: kept out of state and plan output in plaintext.
                "password": pulumi.Output.secret(token.password),
            }
        ]

    def push(
        self,
        name: str,
        context: Path,
        tag: str,
        target: str | None = None,
        inline: str = "",
        build_args: dict[str, pulumi.Input[str]] | None = None,
    ) -> pulumi.Output[str]:
        """Build `context` (its Dockerfile, or the `inline` one) and push it under `tag`:
        repository@sha256:digest."""
        dockerfile = (
            {"inline": inline} if inline else {"location": provider_path(context / "Dockerfile")}
        )
        image = docker_build.Image(
            name,
            context={"location": provider_path(context)},
            dockerfile=dockerfile,
            **({"target": target} if target else {}),
            **({"build_args": build_args} if build_args else {}),
            platforms=PLATFORMS,
            push=True,
            tags=[pulumi.Output.concat(self.repository.repository_url, ":", tag)],
            registries=self.registries,
            opts=self.opts,
        )
        return pulumi.Output.concat(self.repository.repository_url, "@", image.digest)


def ecr_images(
    name: str,
    repository_name: pulumi.Input[str],
    context: Path,
    targets: list[str],
    tags: dict[str, str],
    opts: pulumi.ResourceOptions,
    data: DataGuard,
) -> dict[str, pulumi.Output[str]]:
    """Build `context`/Dockerfile for each target and push it to a new EcrRepository.
    Returns {target: repository@sha256:digest}. The trainer, the DevServers operator and the GPU
    registration watcher use it."""
    repository = EcrRepository(name, repository_name, tags, opts, data)
    dockerfile = context / "Dockerfile"
    return {
        target: repository.push(
            f"{name}-{target}", context, source_tag(target, context, dockerfile), target
        )
        for target in targets
    }


def repository_name(cluster_name: str, image: str) -> str:
    """An image's ECR repository: `<cluster>/<image>`, from the cluster's configured name, so
    the repository (and a build into it) need not wait for the cluster."""
    return f"{cluster_name}/{image}"


def images(
    prebuilt: ImageConfig,
    name: str,
    cluster: ClusterContext,
    image: str,
    context: Path,
    targets: list[str],
    parent: pulumi.Resource,
) -> dict[str, pulumi.Output[str]]:
    """{target: image}: the prebuilt image by digest for every target when stack config names
    one (nothing is built: a stack of prebuilt images needs no Docker), else ecr_images into
    repository_name(cluster, image)."""
    if prebuilt.uri:
        return {target: pulumi.Output.from_input(prebuilt.uri) for target in targets}
    repository = repository_name(cluster.config_name, image)
    opts = pulumi.ResourceOptions(parent=parent)
    return ecr_images(name, repository, context, targets, cluster.tags, opts, cluster.data)
