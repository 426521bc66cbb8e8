"""The usage recorder as both stacks deploy it: what it runs, where, with which rights, and what
turning it off does. It runs against the local API in devservers/tests/test_usage_report.py."""

import kubernetes_validate
import pytest

from deploy.day_two import consequences
from devservers.job_status import KINDS as JOB_KINDS
from infra.billing.facts import USAGE_RECORDS
from infra.core.config import ConfigError
from infra.core.nodes import POOL_LABEL, SYSTEM_NODE_LABEL
from infra.integrations import plan_steps
from infra.kueue.tests.kueue_rules import WORKLOAD_VERSION
from infra.stack.loading import parse_stack_config
from tests.plugin import ROOT, hadolint, plan_of, stack_values
from usagerecorder.records import RECORD_NAMESPACE

RBAC = "kubernetes:rbac.authorization.k8s.io/v1:"
NAME = "usage-recorder"


def roles(plan) -> dict[str, list[dict]]:
    """The recorder's rules by namespace ("" for its ClusterRole)."""
    found = {}
    for kind in ("ClusterRole", "Role"):
        for role in plan.of_type(RBAC + kind):
            meta = role.inputs["metadata"]
            if meta["name"] == NAME:
                found[meta.get("namespace", "")] = role.inputs["rules"]
    return found


def test_it_runs_every_five_minutes_on_the_system_nodes_as_no_one_in_particular(stack_plan):
    cronjob = stack_plan.one("kubernetes:batch/v1:CronJob", NAME).inputs
    assert cronjob["metadata"]["namespace"] == RECORD_NAMESPACE
    assert cronjob["spec"]["schedule"] == "*/5 * * * *"
    assert cronjob["spec"]["concurrencyPolicy"] == "Forbid"
    pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == NAME and pod["securityContext"]["runAsNonRoot"] is True
    assert pod["nodeSelector"] == SYSTEM_NODE_LABEL
    (container,) = pod["containers"]
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    args = [a.removeprefix("--").split("=", 1) for a in container["args"]]
    single = {k: v for k, v in args if k != "job-pods"}
    assert single["record-namespace"] == RECORD_NAMESPACE and single["keep-days"] == "35"
    assert single["pool-label"] == POOL_LABEL
    # It records where it may: the namespaces of its Roles.
    assert set(single["namespaces"].split(",")) == set(roles(stack_plan)) - {"", RECORD_NAMESPACE}
    # The labels each operator puts on a job's pods (devservers/job_status.py).
    assert sorted(v for k, v in args if k == "job-pods") == [
        f"{kind.kind}=" + ",".join(f"{k}={v}" for k, v in sorted(kind.pod_labels("{name}").items()))
        for kind in sorted(JOB_KINDS, key=lambda k: k.kind)
    ]
    namespace = stack_plan.one("kubernetes:core/v1:Namespace", NAME).inputs["metadata"]
    assert namespace["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert namespace["annotations"]["training-platform/data"] == USAGE_RECORDS


def test_its_image_is_its_package_alone_and_its_dockerfile_passes_hadolint(dev_plan):
    image = dev_plan.one("docker-build:index:Image", "usage-recorder-image-recorder").inputs
    assert image["context"] == {"location": "../usagerecorder"} and image["target"] == "recorder"
    cronjob = dev_plan.one("kubernetes:batch/v1:CronJob", NAME).inputs
    kubernetes_validate.validate(cronjob, "1.34", strict=True)
    pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert "/usage-recorder@sha256:" in pod["containers"][0]["image"]
    assert hadolint(ROOT / "usagerecorder" / "Dockerfile") == ""


def test_its_rights_are_nodes_cluster_wide_and_records_workloads_and_pods_per_team(dev_plan):
    found = roles(dev_plan)
    assert found.pop("") == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}]
    records = {"apiGroups": [""], "resources": ["configmaps"],
               "verbs": ["list", "create", "patch", "delete"]}  # fmt: skip
    assert found.pop(RECORD_NAMESPACE) == [records]
    # The dev stack's teams, and no DevServer namespace (the operator records those).
    assert set(found) == {"team-a", "research"}
    for rules in found.values():
        assert rules == [
            records,
            {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": ["list"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
        ]
    assert WORKLOAD_VERSION == "v1beta2"  # the version the recorder lists


def test_members_read_their_teams_records_and_write_no_configmap(dev_plan):
    (role,) = [
        r.inputs
        for r in dev_plan.of_type(RBAC + "Role")
        if (r.inputs["metadata"]["name"], r.inputs["metadata"]["namespace"])
        == ("team-member", "team-a")
    ]
    on_configmaps = [r for r in role["rules"] if "configmaps" in r["resources"]]
    assert on_configmaps == [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}
    ]


def test_turning_it_off_deletes_the_node_records_and_is_refused_until_acknowledged():
    base = plan_of("prod")
    off = plan_of("prod", billing={"recordUsage": False})
    assert not off.of_type("kubernetes:batch/v1:CronJob") or all(
        c.name != NAME for c in off.of_type("kubernetes:batch/v1:CronJob")
    )
    config = parse_stack_config(stack_values("prod", billing={"recordUsage": False}), "x")
    found = consequences(plan_steps(base, off), config, "prod", None, None)
    assert any(USAGE_RECORDS in r and r.startswith("data-loss") for r in found.refusals)
    assert any("usage recorder's node records" in line for line in found.losses)
    # Turned on (as on a stack from before it): the plan names the rights it grants.
    config = parse_stack_config(stack_values("prod"), "x")
    found = consequences(plan_steps(off, base), config, "prod", None, None)
    (note,) = [n for n in found.notes if n.startswith("billing: the usage recorder starts")]
    assert "team members may now read the ConfigMaps of their own namespace" in note
    assert not found.refusals


@pytest.mark.parametrize(
    ("team", "message"),
    [({"name": "x", "namespace": RECORD_NAMESPACE}, "usage-records")],
)
def test_no_team_may_take_the_recorders_namespace(team, message):
    values = stack_values("dev")
    teams = values["training-platform:queues"]["teams"]
    values["training-platform:queues"] = {
        **values["training-platform:queues"],
        "teams": [*teams, team],
    }
    with pytest.raises(ConfigError, match=message):
        parse_stack_config(values, "Pulumi.dev.yaml")
