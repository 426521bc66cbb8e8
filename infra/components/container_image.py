"""Images the platform builds from its own folders: an ECR repository each, and one image per
Dockerfile target, tagged by exactly what makes pulumi-docker-build rebuild it."""

import hashlib
import json
import re
from pathlib import Path

import pulumi
import pulumi_aws as aws
import pulumi_docker_build as docker_build

from infra.components.context import ClusterContext
from infra.config import ImageConfig
from infra.data_holders import IMAGES, DataGuard
from infra.paths import provider_path

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
    for line in (context / ".dockerignore").read_text().splitlines():
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


def source_tag(target: str, context: Path, dockerfile: Path) -> str:
    """The tag of the image built for `target`: it changes whenever pulumi-docker-build would
    rebuild it.

    The provider rebuilds when the context's files (names, modes, contents), the Dockerfile, the
    target or the platforms change, and pushes under the tags given. ECR tags here are immutable,
    so a rebuild must never push a new digest under an existing tag: the tag hashes the same things.
    """
    digest = hashlib.sha256()
    for path in [dockerfile, *context_files(context)]:
        digest.update(path.relative_to(context).as_posix().encode() + b"\0")
        digest.update(f"{path.stat().st_mode:o}".encode() + b"\0")
        digest.update(path.read_bytes())
    digest.update(json.dumps([target, PLATFORMS]).encode())
    return f"{target}-{digest.hexdigest()[:16]}"


def ecr_images(
    name: str,
    repository_name: pulumi.Input[str],
    context: Path,
    targets: list[str],
    tags: dict[str, str],
    opts: pulumi.ResourceOptions,
    data: DataGuard,
) -> dict[str, pulumi.Output[str]]:
    """Build `context`/Dockerfile for each target and push it to a new ECR repository (scan on
    push, immutable tags that change exactly when the build would, lifecycle policy).
    Returns {target: repository@sha256:digest}. The trainer, the DevServers operator and the GPU
    registration watcher use it."""
    repository = aws.ecr.Repository(
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
        name, repository=repository.name, policy=json.dumps(LIFECYCLE), opts=opts
    )
    token = aws.ecr.get_authorization_token_output(registry_id=repository.registry_id)
    dockerfile = context / "Dockerfile"
    refs = {}
    for target in targets:
        image = docker_build.Image(
            f"{name}-{target}",
            context={"location": provider_path(context)},
            dockerfile={"location": provider_path(dockerfile)},
            target=target,
            platforms=PLATFORMS,
            push=True,
            tags=[
                pulumi.Output.concat(
                    repository.repository_url, ":", source_tag(target, context, dockerfile)
                )
            ],
            registries=[
                {
                    "address": repository.repository_url,
                    "username": token.user_name,
                    # A registry credential: kept out of state and plan output in plaintext.
                    "password": pulumi.Output.secret(token.password),
                }
            ],
            opts=opts,
        )
        refs[target] = pulumi.Output.concat(repository.repository_url, "@", image.digest)
    return refs


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
