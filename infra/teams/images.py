"""TeamImages: an ECR repository per team that asks for one (queues.teams[].imageRepository),
where its members push images of their own for `devctl submit --image`.

The repository is the stack's kind (container_image.EcrRepository: immutable tags, scan on
push, lifecycle, protected as a data holder). Its repository policy is what lets the team's
members in: same-account principals need only the resource policy for these actions
(ecr:GetAuthorizationToken, which takes no resource, stays with their own IAM policy; ECR
User Guide, "Private repository policies"). The nodes pull with their role's
AmazonEC2ContainerRegistryPullOnly (infra/core/iam.py).
"""

import json

import pulumi
import pulumi_aws as aws

from infra.core.context import ClusterContext
from infra.images.container_image import EcrRepository, repository_name
from infra.kueue.config import TeamConfig

# Push and pull of one repository (ECR User Guide, "Pushing an image": the actions
# `docker push` needs; "Pulling an image").
PUSH_PULL = [
    "ecr:BatchCheckLayerAvailability",
    "ecr:BatchGetImage",
    "ecr:GetDownloadUrlForLayer",
    "ecr:InitiateLayerUpload",
    "ecr:UploadLayerPart",
    "ecr:CompleteLayerUpload",
    "ecr:PutImage",
    "ecr:DescribeImages",
    "ecr:ListImages",
]


def team_repository(team: str) -> str:
    """A team's images: `teams/<team>` under the cluster's name (repository_name)."""
    return f"teams/{team}"


def members_policy(members: list[str]) -> str:
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Sid": "TeamMembersPushAndPull",
                    "Effect": "Allow",
                    "Principal": {"AWS": sorted(members)},
                    "Action": PUSH_PULL,
                }
            ],
        }
    )


class TeamImages(pulumi.ComponentResource):
    """urls[team]: the repository URL each team with imageRepository pushes to."""

    urls: dict[str, pulumi.Output[str]]

    def __init__(
        self,
        name: str,
        teams: list[TeamConfig],
        cluster: ClusterContext,
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("training-platform:infra:TeamImages", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.urls = {}
        for team in (t for t in teams if t.image_repository):
            repository = EcrRepository(
                f"{name}-{team.name}",
                repository_name(cluster.config_name, team_repository(team.name)),
                cluster.tags,
                child,
                cluster.data,
            ).repository
            if team.members:
                aws.ecr.RepositoryPolicy(
                    f"{name}-{team.name}",
                    repository=repository.name,
                    policy=members_policy(team.members),
                    opts=child,
                )
            self.urls[team.name] = repository.repository_url
        self.register_outputs({"urls": self.urls})
