"""Day two: no edit of a running stack loses data or kills training without the plan saying so.

The class tests go through every data holder the program creates and every input that the
providers replace it for (infra/core/replacement.py, written down from terraform-provider-aws and
pulumi-kubernetes source), and through every stack-config key (tests/e2e/test_day_two_edits.py): a
loss is refused unless the stack file acknowledges it, and shown either way.
"""

import copy
import dataclasses
import json

import pytest

from deploy.day_two import consequences
from infra.core.change import DELETE, REPLACE
from infra.core.day_two import holder_of
from infra.core.offline import Plan
from infra.core.replacement import covers, rule_for
from infra.hybrid.tests.test_hybrid import HYBRID, PRIVATE_ENDPOINT_OFF
from infra.integrations import FACTS, plan_steps, replacing_paths
from infra.stack.data_loss import HOLDER_PATTERN, DataLossAcknowledgement
from infra.stack.loading import parse_stack_config
from tests.plugin import plan_of, stack_values

# Every type whose loss loses data (what cannot be rebuilt from the repository and stack file).
DATA_TYPES = {
    "aws:fsx/lustreFileSystem:LustreFileSystem",
    "aws:efs/fileSystem:FileSystem",
    "aws:s3/bucket:Bucket",
    "aws:kms/key:Key",
    "aws:ecr/repository:Repository",
    "eks:index:Cluster",
}
NAMESPACE = "kubernetes:core/v1:Namespace"
# Namespaces where users or teams keep work: the team's and DevServer user's ones.
TENANT_LABELS = ("training-platform/team", "dev.training-platform.io/owner")


def config_of(stack: str, **sections):
    return parse_stack_config(stack_values(stack, **sections), f"Pulumi.{stack}.yaml")


def hybrid_values() -> dict:
    values = stack_values("dev", cluster=PRIVATE_ENDPOINT_OFF)
    values["training-platform:hybrid"] = HYBRID
    return values


PLANS = {
    "dev": lambda: (config_of("dev"), plan_of("dev")),
    "prod": lambda: (config_of("prod"), plan_of("prod")),
    "hybrid": lambda: (
        parse_stack_config(hybrid_values(), "Pulumi.dev.yaml"),
        plan_of("dev", hybrid=HYBRID, cluster=PRIVATE_ENDPOINT_OFF),
    ),
}


@pytest.fixture(scope="module", params=sorted(PLANS))
def planned(request):
    return PLANS[request.param]()


def holders(plan: Plan):
    return [r for r in plan.resources if holder_of(r)]


def acknowledging(config, *holders_: str):
    """`config` with `holders_` added to acknowledgeDataLoss."""
    entries = [*config.acknowledge_data_loss]
    entries += [DataLossAcknowledgement(holder=h, reason="test") for h in holders_]
    return config.model_copy(update={"acknowledge_data_loss": entries})


def test_every_data_holder_is_tagged_and_protected(planned):
    config, plan = planned
    for resource in plan.resources:
        tenant = resource.type == NAMESPACE and any(
            label in (resource.inputs["metadata"].get("labels") or {}) for label in TENANT_LABELS
        )
        if resource.type in DATA_TYPES or tenant:
            holder = holder_of(resource)
            assert holder and HOLDER_PATTERN.fullmatch(holder), resource.urn
            assert resource.protect, resource.urn
        elif holder_of(resource) is None:
            assert not resource.protect, f"{resource.urn} is protected but holds no data"
    kinds = {holder_of(r).split("[")[0] for r in holders(plan)}
    assert {"cluster", "images", "storage.bucket", "queues.teams"} <= kinds


def _mutated(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, str):
        return value + "-edited"
    if isinstance(value, list):
        return [*value, "edited"]
    return "edited"


def _edit(inputs: dict, path: str) -> dict:
    edited = copy.deepcopy(inputs)
    node = edited
    parts = path.split(".")
    for part in parts[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[parts[-1]] = _mutated(node.get(parts[-1]))
    return edited


def _rule_paths(resource_type: str) -> list[str]:
    rule = rule_for(resource_type, FACTS)
    return list(rule.force_new) if rule else []


def _replacing(plan: Plan, urn: str, path: str) -> Plan:
    resources = [
        dataclasses.replace(r, inputs=_edit(r.inputs, path)) if r.urn == urn else r
        for r in plan.resources
    ]
    return Plan(plan.stack, resources, plan.outputs, plan.region)


def test_every_input_that_replaces_a_data_holder_is_refused_unless_acknowledged(planned):
    config, plan = planned
    checked = 0
    for holder in holders(plan):
        key = holder_of(holder)
        for path in _rule_paths(holder.type):
            steps = plan_steps(plan, _replacing(plan, holder.urn, path))
            (step,) = [s for s in steps if s.urn == holder.urn]
            assert step.op == REPLACE and any(covers(path, p) for p in step.reasons), (path, step)
            effects = consequences(steps, config, plan.stack)
            assert any(f"({key}) would be replaced" in r for r in effects.refusals), (path, key)
            assert any(f"{holder.name} is replaced" in line for line in effects.losses)
            accepted = consequences(steps, acknowledging(config, key), plan.stack)
            assert not [r for r in accepted.refusals if f"({key})" in r], (path, key)
            checked += 1
    assert checked >= 10


def test_a_smaller_file_system_and_dropped_encryption_are_replacements():
    """The two CustomizeDiff rules: FSx for Lustre capacity decrease, EKS encryption removed."""
    assert replacing_paths(
        "aws:fsx/lustreFileSystem:LustreFileSystem",
        {"storageCapacity": 4800},
        {"storageCapacity": 2400},
    ) == ["storageCapacity"]
    assert not replacing_paths(
        "aws:fsx/lustreFileSystem:LustreFileSystem",
        {"storageCapacity": 2400},
        {"storageCapacity": 4800},
    )
    assert replacing_paths(
        "eks:index:Cluster", {"encryptionConfigKeyArn": "arn:k"}, {"encryptionConfigKeyArn": None}
    ) == ["encryptionConfigKeyArn"]


@pytest.mark.parametrize(
    ("old", "new", "replacing"),
    [
        # A newer Lustre upgrades in place, an older one is a new file system.
        ({"fileSystemTypeVersion": "2.12"}, {"fileSystemTypeVersion": "2.15"}, []),
        (
            {"fileSystemTypeVersion": "2.15"},
            {"fileSystemTypeVersion": "2.12"},
            ["fileSystemTypeVersion"],
        ),
        # Fewer metadata IOPS: a new file system (more: in place).
        (
            {"metadataConfiguration": {"iops": 3000}},
            {"metadataConfiguration": {"iops": 1500}},
            ["metadataConfiguration.iops"],
        ),
        ({"metadataConfiguration": {"iops": 1500}}, {"metadataConfiguration": {"iops": 3000}}, []),
    ],
)
def test_lustre_replaces_on_the_way_down_only(old, new, replacing):
    assert replacing_paths("aws:fsx/lustreFileSystem:LustreFileSystem", old, new) == replacing


def test_deleting_a_data_holder_takes_an_acknowledged_update_first(planned):
    config, plan = planned
    for holder in holders(plan):
        key = holder_of(holder)
        without = Plan(plan.stack, [r for r in plan.resources if r.urn != holder.urn], plan.outputs)
        steps = plan_steps(plan, without)
        assert [s.op for s in steps if s.urn == holder.urn] == [DELETE]
        refused = consequences(steps, config, plan.stack).refusals
        assert any(f"({key}) would be deleted" in r for r in refused)
        # Acknowledged now, but protected where it is deployed: the engine would refuse.
        two_steps = consequences(steps, acknowledging(config, key), plan.stack).refusals
        assert any("protected where it is deployed" in r and key in r for r in two_steps)
        # After the update that lifted protect, the deletion goes through.
        released = Plan(
            plan.stack,
            [
                dataclasses.replace(r, protect=False) if r.urn == holder.urn else r
                for r in plan.resources
            ],
            plan.outputs,
        )
        steps = plan_steps(released, without)
        assert not [
            r
            for r in consequences(steps, acknowledging(config, key), plan.stack).refusals
            if f"({key})" in r
        ]


def test_an_acknowledged_holder_loses_protect_and_only_it():
    values = stack_values("prod")
    values["training-platform:acknowledgeDataLoss"] = [
        {"holder": "storage.fsx", "reason": "shrink to 2400 GiB; checkpoints are in S3"}
    ]
    config = parse_stack_config(values, "Pulumi.prod.yaml")
    from deploy.program import build_platform
    from infra.core.offline import run_offline

    plan = run_offline(lambda: build_platform(config), "prod", values)
    protected = {holder_of(r): r.protect for r in holders(plan)}
    assert protected["storage.fsx"] is False
    assert all(p for h, p in protected.items() if h != "storage.fsx")


def test_plan_entries_round_trip(tmp_path):
    """What the plan command compares with is what it wrote."""
    from deploy.plan import read_plan, write_plan

    plan = plan_of("dev")
    write_plan(plan, tmp_path)
    again = read_plan(tmp_path, "dev")
    assert [r.as_plan_entry() for r in again.resources] == json.loads(
        json.dumps([r.as_plan_entry() for r in plan.resources])
    )
    assert again.region == plan.region and not plan_steps(plan, again)


def test_a_plan_written_before_its_later_fields_is_compared_with(tmp_path):
    """`make plan AGAINST_REF=<an older release>` reads the plan that release's code wrote: the
    fields added since (custom, protect, outputs) take what such a resource had."""
    from deploy.plan import PLAN_FILE, read_plan, write_plan

    plan = plan_of("dev")
    write_plan(plan, tmp_path)
    entries = json.loads((tmp_path / PLAN_FILE).read_text())
    for entry in entries:
        for later in ("custom", "protect", "deleteBeforeReplace", "outputs"):
            entry.pop(later)
    (tmp_path / PLAN_FILE).write_text(json.dumps(entries))
    again = read_plan(tmp_path, "dev")
    assert [r.custom for r in again.resources] == [r.custom for r in plan.resources]


def test_a_claim_bound_to_another_volume_is_named():
    """Its name stays, its files do not: what moving the EFS claims to access points did to
    stacks deployed before (their claims' new volumes are new directories)."""
    old = plan_of("prod")
    new = copy.deepcopy(old)
    (claim,) = [
        r
        for r in new.of_type("kubernetes:core/v1:PersistentVolumeClaim")
        if r.inputs["metadata"] == {"name": "efs-shared", "namespace": "team-a"}
    ]
    claim.inputs["spec"]["volumeName"] = "efs-elsewhere"
    effects = consequences(
        plan_steps(old, new), parse_stack_config(stack_values("prod"), "p"), "prod"
    )
    assert effects.notes == [
        "claim team-a/efs-shared is bound to another volume (spec.volumeName): its pods see that "
        "volume's files from their next start (the old volume's stay on it): copy across what "
        "they must keep seeing"
    ]


def lifecycle_step(old_rules: list[dict], new_rules: list[dict]):
    from infra.core.change import UPDATE, Step
    from infra.core.offline import RecordedResource

    def resource(rules):
        return RecordedResource("urn:lc", LIFECYCLE, "bucket", "", "", [], {"rules": rules}, True)

    return Step(UPDATE, "urn::lc", LIFECYCLE, resource(old_rules), resource(new_rules), ["rules"])


LIFECYCLE = "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration"
RULE = {"id": "expire-old-checkpoints", "status": "Enabled", "filter": {"prefix": "checkpoints/"}}


@pytest.mark.parametrize(
    ("new_rules", "deletes"),
    [
        # Longer: nothing sooner.
        ([{**RULE, "expiration": {"days": 90}}], []),
        # Shorter, under another id: the same objects, sooner.
        (
            [{**RULE, "id": "renamed", "expiration": {"days": 10}}],
            ["objects under checkpoints/ older than 10 days (30 -> 10 days)"],
        ),
        # A wider prefix reaches objects no rule expired.
        (
            [{**RULE, "filter": {"prefix": ""}, "expiration": {"days": 30}}],
            ["objects under the whole bucket older than 30 days (30 days, where nothing expired)"],
        ),
        # A new rule on another prefix.
        (
            [
                {**RULE, "expiration": {"days": 30}},
                {
                    "id": "d",
                    "status": "Enabled",
                    "filter": {"prefix": "datasets/"},
                    "expiration": {"days": 365},
                },
            ],
            ["objects under datasets/ older than 365 days (365 days, where nothing expired)"],
        ),
        # A disabled rule deletes nothing.
        ([{**RULE, "status": "Disabled", "expiration": {"days": 1}}], []),
    ],
)
def test_a_lifecycle_that_expires_sooner_or_more_deletes_data(new_rules, deletes):
    from infra.storage.day_two import deleting_updates

    step = lifecycle_step([{**RULE, "expiration": {"days": 30}}], new_rules)
    found = [line.split("delete the ", 1)[1] for _, line in deleting_updates([step])]
    assert found == deletes
