"""Every field the upstream CRDs keep as created (their CEL rules that read `oldSelf`) is known to
the plan, for every kind the program renders: an update of it is refused by the plan with the
way through (Kind.immutable, infra/core/day_two.py immutable_fields), or the object is replaced
instead (Kind.replace). Read from the CRDs in tests/crds at the pinned versions."""

import re

import pytest

from infra.core.change import Change, Step
from infra.core.day_two import immutable_fields
from infra.core.offline import RecordedResource
from infra.core.tests.crd_schema import crd_versions
from infra.integrations import FACTS
from infra.kueue.queues import TOPOLOGY_LEVELS

pytestmark = pytest.mark.unit


def old_self_rules(schema: dict, path: tuple[str, ...] = ()):
    """(path, rule) of every CEL rule of the schema that compares with the stored object."""
    for validation in schema.get("x-kubernetes-validations") or []:
        if "oldSelf" in validation["rule"]:
            yield ".".join(path), validation["rule"]
    for key, sub in (schema.get("properties") or {}).items():
        yield from old_self_rules(sub, (*path, key))
    if isinstance(schema.get("items"), dict):
        yield from old_self_rules(schema["items"], (*path, "[]"))


def upstream_rules() -> dict[str, list[tuple[str, str]]]:
    """Type token -> its CRD's rules, for every version."""
    return {
        f"kubernetes:{api_version}:{kind}": list(
            old_self_rules(version["schema"]["openAPIV3Schema"])
        )
        for (api_version, kind), version in crd_versions().items()
        if "schema" in version
    }


def fields_of(path: str, rule: str) -> set[str]:
    """The fields a rule at `path` keeps: itself (`self == oldSelf`), or those it names."""
    named = set(re.findall(r"oldSelf\.([A-Za-z]+)", rule))
    return {f"{path}.{name}" for name in named} if named else {path}


# Rules whose updates the program never makes, and why.
NEVER_CHANGED = {
    # Levels may change while kubernetes.io/hostname stays the lowest, and the platform's always
    # end with it (asserted below).
    ("kubernetes:kueue.x-k8s.io/v1beta2:Topology", "spec.levels"),
}


def test_every_immutable_field_of_a_rendered_kind_is_refused_or_replaced():
    assert TOPOLOGY_LEVELS[-1] == "kubernetes.io/hostname"
    rules = upstream_rules()
    rendered = [t for t in FACTS.kinds if t in rules]
    assert "kubernetes:kueue.x-k8s.io/v1beta2:LocalQueue" in rendered
    unknown = []
    for token in rendered:
        kind = FACTS.kind(token)
        replaced = kind.replace.force_new if kind.replace else ()
        immutable = kind.immutable
        known = set(immutable.paths + immutable.presence) if immutable else set()
        for path, rule in rules[token]:
            for field in fields_of(path, rule):
                if (token, field) in NEVER_CHANGED:
                    continue
                if field in known or any(field.startswith(p) for p in replaced):
                    continue
                unknown.append((token, field, rule))
    assert not unknown, unknown


def step(token: str, old: dict, new: dict) -> Step:
    def resource(inputs):
        return RecordedResource("urn:x::q", token, "q", "", "", [], inputs, True)

    return Step("update", "urn:x::q", token, resource(old), resource(new))


def refusals(token: str, old: dict, new: dict) -> list[str]:
    change = Change([step(token, old, new)], "dev", frozenset(), {}, ())
    immutable_fields(change, FACTS)
    return change.found.refusals


def test_a_local_queue_moved_to_another_cluster_queue_is_refused_with_the_way_through():
    token = "kubernetes:kueue.x-k8s.io/v1beta2:LocalQueue"
    old = {"metadata": {"name": "team-a"}, "spec": {"clusterQueue": "platform"}}
    (refusal,) = refusals(token, old, {**old, "spec": {"clusterQueue": "team-a"}})
    assert refusal.startswith("immutable: LocalQueue q: spec.clusterQueue cannot change")
    assert "remove the queue in one `pulumi up`" in refusal
    assert refusals(token, old, {**old, "metadata": {"name": "team-a", "labels": {"x": "y"}}}) == []


def test_a_pool_switched_between_static_and_dynamic_is_refused():
    token = "kubernetes:karpenter.sh/v1:NodePool"
    dynamic = {"spec": {"limits": {"nodes": "4", "cpu": "64"}}}
    static = {"spec": {"replicas": 4, "limits": {"nodes": "4"}}}
    assert "spec.replicas" in refusals(token, dynamic, static)[0]
    assert refusals(token, static, {"spec": {"replicas": 6, "limits": {"nodes": "6"}}}) == []


def test_a_runtime_item_rule_is_matched_on_any_item():
    token = "kubernetes:trainer.kubeflow.org/v1alpha1:ClusterTrainingRuntime"
    jobs = [{"name": "node"}, {"name": "launcher", "dependsOn": [{"name": "node"}]}]
    old = {"spec": {"template": {"spec": {"replicatedJobs": jobs}}}}
    changed = [jobs[0], {**jobs[1], "dependsOn": []}]
    new = {"spec": {"template": {"spec": {"replicatedJobs": changed}}}}
    (refusal,) = refusals(token, old, new)
    assert "spec.template.spec.replicatedJobs.[].dependsOn" in refusal
