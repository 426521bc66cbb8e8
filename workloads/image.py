"""TrainerImage: the trainer image in ECR, built from trainer/Dockerfile, or a prebuilt digest."""

import hashlib
import json
from pathlib import Path

import pulumi
import pulumi_aws as aws
import pulumi_docker_build as docker_build

from infra.config import ImageConfig

# Relative to the project root, where `pulumi up` runs the program.
BUILD_CONTEXT = Path(".")
DOCKERFILE = Path("trainer/Dockerfile")
TRAINER_SOURCES = Path(__file__).resolve().parent.parent / "trainer"

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
            "description": "keep the newest 50 trainer builds",
            "selection": {"tagStatus": "any", "countType": "imageCountMoreThan", "countNumber": 50},
            "action": {"type": "expire"},
        },
    ]
}


def source_tag() -> str:
    """A tag that changes exactly when the trainer's files do (ECR tags here are immutable)."""
    digest = hashlib.sha256()
    for path in sorted(
        p for p in TRAINER_SOURCES.rglob("*") if p.is_file() and "__pycache__" not in p.parts
    ):
        digest.update(str(path.relative_to(TRAINER_SOURCES)).encode())
        digest.update(path.read_bytes())
    return f"src-{digest.hexdigest()[:16]}"


class TrainerImage(pulumi.ComponentResource):
    ref: pulumi.Output[str]  # repository@sha256:digest, what jobs run

    def __init__(
        self,
        name: str,
        config: ImageConfig,
        cluster_name: str,
        tags: dict[str, str],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("training-platform:workloads:TrainerImage", name, None, opts)
        if config.uri:
            self.ref = pulumi.Output.from_input(config.uri)
            self.register_outputs({"ref": self.ref})
            return
        child = pulumi.ResourceOptions(parent=self)
        repository = aws.ecr.Repository(
            name,
            name=f"{cluster_name}/trainer",
            image_tag_mutability="IMMUTABLE",
            image_scanning_configuration={"scan_on_push": True},
            encryption_configurations=[{"encryption_type": "AES256"}],
            tags=tags,
            opts=child,
        )
        aws.ecr.LifecyclePolicy(
            name, repository=repository.name, policy=json.dumps(LIFECYCLE), opts=child
        )
        token = aws.ecr.get_authorization_token_output(registry_id=repository.registry_id)
        image = docker_build.Image(
            name,
            context={"location": str(BUILD_CONTEXT)},
            dockerfile={"location": str(DOCKERFILE)},
            platforms=["linux/amd64"],
            push=True,
            tags=[pulumi.Output.concat(repository.repository_url, ":", source_tag())],
            registries=[
                {
                    "address": repository.repository_url,
                    "username": token.user_name,
                    # A registry credential: kept out of state and plan output in plaintext.
                    "password": pulumi.Output.secret(token.password),
                }
            ],
            opts=child,
        )
        self.ref = pulumi.Output.concat(repository.repository_url, "@", image.digest)
        self.register_outputs({"ref": self.ref})
