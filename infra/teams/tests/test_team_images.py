"""A team's own image repository (queues.teams[].imageRepository) for `devctl submit --image`:
the stack's kind of ECR repository, which the team's members push to and pull from by its
repository policy (IAM's evaluation, infra/core/tests/iam_rules.py), and nobody else without an IAM
policy of their own; the plan names it; switching it off keeps the images until released."""

import json

import pytest

from deploy.day_two import consequences
from deploy.plan import summary
from deploy.program import build_platform
from infra.core.offline import run_offline
from infra.core.tests.iam_rules import Principal, Request, allowed
from infra.integrations import plan_cost, plan_steps
from infra.stack.loading import parse_stack_config
from tests.plugin import stack_values

ACCOUNT = "123456789012"
REPOSITORY = "aws:ecr/repository:Repository"
POLICY = "aws:ecr/repositoryPolicy:RepositoryPolicy"


def teams(**team_a) -> list[dict]:
    return [
        {**t, **team_a} if t["name"] == "team-a" else t
        for t in stack_values("dev")["training-platform:queues"]["teams"]
    ]


def planned(deployed: dict | None = None, **team_a):
    values = stack_values("dev", queues={"teams": teams(**team_a)})
    config = parse_stack_config(values, "Pulumi.dev.yaml")
    return config, run_offline(lambda: build_platform(config), "dev", values, None, deployed)


@pytest.fixture(scope="module")
def with_images():
    return planned(imageRepository=True)


def test_a_team_gets_the_stacks_kind_of_repository_and_the_plan_names_it(with_images):
    config, plan = with_images
    (repository,) = [
        r for r in plan.of_type(REPOSITORY) if r.inputs["name"] == "tp-dev/teams/team-a"
    ]
    assert repository.inputs["imageTagMutability"] == "IMMUTABLE"
    assert repository.inputs["imageScanningConfiguration"] == {"scanOnPush": True}
    assert repository.inputs["forceDelete"] is False and repository.protect
    assert not [r for r in plan.of_type(REPOSITORY) if "research" in r.inputs["name"]]
    url = plan.outputs["teamImageRepositories"]["team-a"]
    assert url.endswith("/tp-dev/teams/team-a")
    assert f"  team-a members push their images to {url} (devctl submit --image)" in summary(
        config, plan
    )


def test_the_plan_prices_or_explains_every_type_it_adds(with_images):
    _, plan = with_images
    cost = plan_cost("us-west-2", plan)
    assert cost.unpriced_types == []


def test_its_members_push_and_pull_and_another_teams_members_do_not(with_images):
    config, plan = with_images
    (policy,) = plan.of_type(POLICY)
    document = json.loads(policy.inputs["policy"])
    repository = f"arn:aws:ecr:us-west-2:{ACCOUNT}:repository/tp-dev/teams/team-a"
    team_a = {t.name: t for t in config.queues.teams}["team-a"]
    research = {t.name: t for t in config.queues.teams}["research"]

    def may(principal: str, action: str) -> bool:
        request = Request(action, repository, Principal(principal))
        return allowed(request, document, ACCOUNT)

    for member in team_a.members:
        assert may(member, "ecr:PutImage") and may(member, "ecr:CompleteLayerUpload")
        assert may(member, "ecr:BatchGetImage")
        assert not may(member, "ecr:DeleteRepository")  # pushing, not administering
        assert not may(member, "ecr:SetRepositoryPolicy")
    for outsider in research.members:
        assert not may(outsider, "ecr:PutImage") and not may(outsider, "ecr:BatchGetImage")


def test_switched_off_its_images_stay_until_released_on_purpose(with_images):
    _, before = with_images
    config, after = planned(before.outputs, imageRepository=False)
    effects = consequences(plan_steps(before, after), config, "dev")
    (refusal,) = [r for r in effects.refusals if "team-images-team-a" in r]
    assert "(images) would be deleted" in refusal and "acknowledgeDataLoss" in refusal
