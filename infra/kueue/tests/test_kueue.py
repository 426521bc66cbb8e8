"""Kueue as configured and as seen: the rendered Configuration against the pinned Kueue's rules
written down from its source (infra/kueue/tests/kueue_rules.py), waitForPodsReady derived from the
cold-start model, and a DevServer's Workload in the states Kueue writes, shown by `devctl list`."""

import copy
import io
import re
from datetime import UTC, datetime

import kopf
import pytest
import yaml
from kubernetes import config

from devservers import operator
from devservers.api import API_VERSION
from devservers.cli import main as devctl
from devservers.controller import JOB_UID_LABEL, kueue_state
from devservers.kube import KubeCluster, settings_from_env
from devservers.tests.test_devservers_render import server as server_manifest
from infra.core.tests.crd_schema import cel_violations, conformance_errors
from infra.core.versions import KUEUE_CHART
from infra.karpenter.cold_start import (
    MARGIN,
    SPOT_NOTICE_S,
    cold_start,
    duration,
    pods_ready_timeouts,
)
from infra.kueue.kueue import FRAMEWORKS
from infra.kueue.tests import kueue_rules as kueue
from infra.stack.loading import parse_stack_config
from tests.plugin import NO_DEV_SERVERS, plan_of, stack_values

RELEASE = "kubernetes:helm.sh/v3:Release"
NOW = datetime(2026, 11, 22, 9, 0, tzinfo=UTC)


def kueue_config(plan) -> dict:
    release = plan.one(RELEASE, "kueue").inputs["values"]
    return yaml.safe_load(release["managerConfig"]["controllerManagerConfigYaml"])


def test_rendered_configuration_decodes_into_kueue_types(stack_plan):
    config = kueue_config(stack_plan)
    assert kueue.configuration_errors(config) == []
    assert {"waitForPodsReady", "integrations", "managedJobsNamespaceSelector"} <= set(config)
    # A job or pod without the queue label is not Kueue's: the team policies refuse it instead
    # (docs/platform/security-and-tenancy.md), not Kueue's default queue.
    assert config["manageJobsWithoutQueueName"] is False


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda c: c["waitForPodsReady"].update(blockAdmision=False), "blockAdmision"),
        (lambda c: c.update(waitForPodReady={}), "waitForPodReady"),
        (lambda c: c["waitForPodsReady"].update(timeout=600), "600 is not of type 'string'"),
        (lambda c: c["waitForPodsReady"].update(timeout="10 minutes"), "does not match"),
        (
            lambda c: c["waitForPodsReady"]["requeuingStrategy"].update(timestamp="Evicted"),
            "'Evicted' is not one of ['Creation', 'Eviction']",
        ),
        (lambda c: c["integrations"]["frameworks"].append("kubeflow.org/pytorchjobs"), "not a"),
        (lambda c: c["metrics"].update(enableClusterQueueResources="yes"), "not of type"),
        (lambda c: c["resources"].update(excludeResourcePrefix=[]), "excludeResourcePrefix'"),
        (lambda c: c["leaderElection"].update(leaseDuration=15), "15 is not of type 'string'"),
        (
            lambda c: c["managedJobsNamespaceSelector"]["matchExpressions"][0].update(
                operator="Exist"
            ),
            "'Exist' is not one of",
        ),
    ],
)
def test_the_written_down_rules_catch_what_kueue_refuses(dev_plan, mutate, expected):
    config = copy.deepcopy(kueue_config(dev_plan))
    assert kueue.configuration_errors(config) == []
    mutate(config)
    assert any(expected in error for error in kueue.configuration_errors(config))


def test_one_starting_pod_never_stalls_admission_and_no_workload_is_deactivated(stack_plan):
    """blockAdmission stops all admission while any admitted workload (a cold DevServer too) is
    not ready; a backoffLimitCount deactivates a workload for good (workload_controller.go,
    triggerDeactivation). Neither may be set."""
    ready = kueue_config(stack_plan)["waitForPodsReady"]
    assert ready.get("blockAdmission", False) is False
    assert "backoffLimitCount" not in ready["requeuingStrategy"]
    strategy = ready["requeuingStrategy"]
    assert 0 < strategy["backoffBaseSeconds"] <= strategy["backoffMaxSeconds"] <= 3600


def seconds(text: str) -> int:
    return sum(int(n) * {"m": 60, "s": 1}[u] for n, u in re.findall(r"(\d+)([ms])", text))


def rendered_timeouts(plan) -> tuple[int, int]:
    ready = kueue_config(plan)["waitForPodsReady"]
    return seconds(ready["timeout"]), seconds(ready["recoveryTimeout"])


def test_timeouts_cover_the_slowest_cold_start_and_a_spot_replacement(stack_plan):
    config = parse_stack_config(stack_values(stack_plan.stack), stack_plan.stack)
    slowest = max(cold_start(p).total_s for p in config.node_pools)
    timeout, recovery = rendered_timeouts(stack_plan)
    assert slowest * MARGIN <= timeout < slowest * MARGIN + 60
    assert recovery >= (SPOT_NOTICE_S.value + slowest) * MARGIN


def test_a_slower_instance_type_moves_the_timeouts(dev_plan):
    """dev's slowest pool is gpu-large on p4d.24xlarge; on g5.48xlarge (no 8-GPU P-type boot) the
    cold start and both timeouts shrink, the plan's Kueue config with them."""
    pools = stack_values("dev")["training-platform:nodePools"]
    faster = [
        {**p, "instanceTypes": ["g5.48xlarge"]} if p["name"] == "gpu-large" else p for p in pools
    ]
    plan = plan_of("dev", nodePools=faster, devServers=NO_DEV_SERVERS)
    faster_config = parse_stack_config(
        stack_values("dev", nodePools=faster, devServers=NO_DEV_SERVERS), "dev"
    )
    expected = pods_ready_timeouts(faster_config.node_pools)
    assert rendered_timeouts(plan) == (expected.timeout_s, expected.recovery_timeout_s)
    assert rendered_timeouts(plan) < rendered_timeouts(dev_plan)
    assert kueue_config(plan)["waitForPodsReady"]["timeout"] == duration(expected.timeout_s)


# --- a Workload as Kueue writes it, and what devctl shows -------------------------------------


def condition(kind: str, status: str, reason: str, message: str = "") -> dict:
    """A metav1.Condition as Kueue sets it (type, status, reason, message, transition time)."""
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message or reason,
        "lastTransitionTime": "2026-11-22T09:10:00Z",
    }


def workload(*conditions: dict, active: bool = True, requeue_at: str | None = None) -> dict:
    """A Workload of a DevServer's StatefulSet (workload_types.go: spec.active, spec.queueName,
    spec.podSets; status.conditions, status.requeueState.count and requeueAt)."""
    status: dict = {"conditions": list(conditions)}
    if requeue_at:
        status["requeueState"] = {"count": 1, "requeueAt": requeue_at}
    return {
        "apiVersion": f"{kueue.GROUP}/{kueue.WORKLOAD_VERSION}",
        "kind": "Workload",
        "metadata": {"name": "statefulset-box-3f2a1", "namespace": "dev-alice"},
        "spec": {
            "active": active,
            "queueName": "dev",
            "podSets": [{"name": "main", "count": 1, "template": {"spec": {"containers": []}}}],
        },
        "status": status,
    }


# The states, with the conditions Kueue 0.19.2 sets in them: eviction on PodsReady timeout
# (workload_controller.go reconcileNotReadyTimeout -> evict.Evict: Evicted=True reason
# PodsReadyTimeout; UpdateRequeueState: requeueState.requeueAt; jobframework/reconciler.go:
# Requeued=False with the eviction's reason, QuotaReserved=False), deactivation after a
# backoffLimitCount (workload_controller.go: a DeactivationTarget with reason
# RequeuingLimitExceeded, then Evicted=True reason Deactivated with that cause), admission with
# pods starting.
EVICTED_FOR_TIMEOUT = workload(
    condition(kueue.QUOTA_RESERVED, "False", kueue.PENDING),
    condition(kueue.EVICTED, "True", kueue.PODS_READY_TIMEOUT, "Exceeded the PodsReady timeout"),
    condition(kueue.REQUEUED, "False", kueue.PODS_READY_TIMEOUT),
    requeue_at="2026-11-22T09:12:00Z",
)
DEACTIVATED_REASON = kueue.reason_with_cause(kueue.DEACTIVATED, kueue.REQUEUING_LIMIT_EXCEEDED)
STATES = [
    (workload(condition(kueue.QUOTA_RESERVED, "False", kueue.PENDING)), "Queued"),
    (
        workload(
            condition(kueue.QUOTA_RESERVED, "True", kueue.QUOTA_RESERVED),
            condition(kueue.ADMITTED, "True", kueue.ADMITTED),
            condition(kueue.PODS_READY, "False", kueue.WAIT_FOR_START),
        ),
        "Admitted, pods not ready (WaitForStart)",
    ),
    (EVICTED_FOR_TIMEOUT, "Evicted (PodsReadyTimeout), requeued at 2026-11-22T09:12:00Z"),
    (
        workload(condition(kueue.EVICTED, "True", DEACTIVATED_REASON), active=False),
        "Deactivated (DeactivatedDueToRequeuingLimitExceeded)",
    ),
]


@pytest.mark.parametrize(("manifest", "shown"), STATES)
def test_kueue_state_reads_workloads_as_kueue_writes_them(manifest, shown):
    assert kueue_state(manifest) == shown


def test_kubectl_get_workloads_shows_no_eviction_reason():
    """Why devctl shows it: the Workload's printer columns at v0.19.2 have none."""
    columns = kueue.WORKLOAD_PRINTER_COLUMNS
    assert [c["name"] for c in columns] == ["Queue", "Reserved in", "Admitted", "Finished", "Age"]
    assert not any("Evicted" in c["jsonPath"] or "requeueState" in c["jsonPath"] for c in columns)


def test_devctl_list_shows_the_servers_kueue_state(dev_cluster, monkeypatch):
    """The operator finds the Workload of the server's StatefulSet by Kueue's job-uid label and
    records its state; devctl lists it (on the local Kubernetes API, serving Workloads with the
    CRD written down in infra/kueue/tests/kueue_rules.py)."""
    operator_boundary = KubeCluster(
        config.new_client_from_config(str(dev_cluster.kubeconfigs["operator"]))
    )
    admin = dev_cluster.client()
    manifest = server_manifest()
    manifest["metadata"] = {"name": "box", "namespace": "dev-alice"}
    admin.resources.get(api_version=API_VERSION, kind="DevServer").create(body=manifest)
    # The settings of the plan's operator Deployment (its allowed images among them).
    settings = settings_from_env(dev_cluster.operator_env)
    memo = operator.with_state(kopf.Memo(), operator_boundary, settings)
    monkeypatch.setattr(operator, "now", lambda: NOW)
    operator._refresh(memo, "box", "dev-alice")
    dev_cluster.api.settle()
    stateful_set = dev_cluster.api.read("statefulsets", "dev-alice", "box", group="apps")
    evicted = copy.deepcopy(EVICTED_FOR_TIMEOUT)
    evicted["metadata"]["labels"] = {JOB_UID_LABEL: stateful_set["metadata"]["uid"]}
    workloads = admin.resources.get(api_version=evicted["apiVersion"], kind="Workload")
    created = workloads.create(body=evicted, namespace="dev-alice")
    workloads.status.patch(  # Kueue writes conditions to the status subresource
        name=created.metadata.name, namespace="dev-alice", body={"status": evicted["status"]},
        content_type="application/merge-patch+json",
    )  # fmt: skip
    operator._refresh(memo, "box", "dev-alice")
    monkeypatch.setenv("KUBECONFIG", str(dev_cluster.kubeconfigs["alice"]))
    out = io.StringIO()
    assert devctl(["list"], out=out) == 0
    header, row = out.getvalue().splitlines()
    assert "KUEUE" in header.split()
    assert "Evicted (PodsReadyTimeout), requeued at 2026-11-22T09:12:00Z" in row
    assert dev_cluster.api.refusals == []


# --- the Topology API, written down -------------------------------------------------------------


@pytest.mark.parametrize(
    ("levels", "expected"),
    [
        ([], "should be non-empty"),
        ([{"nodeLabel": f"layer-{i}"} for i in range(17)], "is too long"),
        ([{"nodeLabel": "rack/"}], "does not match"),
        ([{"label": "rack"}], "'nodeLabel' is a required property"),
    ],
)
def test_the_written_down_topology_refuses_what_kueues_crd_refuses(levels, expected):
    topology = {
        "apiVersion": f"{kueue.GROUP}/v1beta2",
        "kind": "Topology",
        "metadata": {"name": "network"},
        "spec": {"levels": [{"nodeLabel": "topology.k8s.aws/network-node-layer-1"}]},
    }
    assert conformance_errors(topology) == []
    topology["spec"]["levels"] = levels
    assert any(expected in e for e in conformance_errors(topology))


def test_topology_levels_change_only_with_the_hostname_lowest_before_and_after():
    """The 0.20 line's rule (#13910); at v0.19.2 the levels never changed."""
    hosts = [
        {"nodeLabel": "topology.k8s.aws/network-node-layer-1"},
        {"nodeLabel": kueue.HOSTNAME_LABEL},
    ]
    old = {"apiVersion": f"{kueue.GROUP}/v1beta2", "kind": "Topology",
           "metadata": {"name": "network"}, "spec": {"levels": hosts}}  # fmt: skip
    grown = copy.deepcopy(old)
    grown["spec"]["levels"].insert(0, {"nodeLabel": "topology.k8s.aws/network-node-layer-0"})
    assert cel_violations(grown, old=old) == []
    racks = copy.deepcopy(old)
    racks["spec"]["levels"] = racks["spec"]["levels"][:1]
    assert any("levels are mutable only when" in v for v in cel_violations(racks, old=old))


# --- the pinned release ----------------------------------------------------------------------


def test_the_rules_were_read_for_the_pinned_kueue():
    """A Kueue bump fails here until kueue_rules.py is read again for the new release (and
    READ_FOR moved): the rules, not the pin, are what the tests check the platform against."""
    assert kueue.READ_FOR == KUEUE_CHART.version


def test_the_pinned_kueue_still_registers_the_pytorchjob_integration():
    """Elastic jobs are PyTorchJobs, admitted through Kueue's kubeflow.org/pytorchjob integration,
    deprecated and proposed for removal (kubernetes-sigs/kueue#12620). The day a Kueue release
    drops it, this fails: keep that release out until elastic jobs have moved
    (docs/users/jobs.md, Elastic jobs after the training operator)."""
    assert "kubeflow.org/pytorchjob" in kueue.FRAMEWORKS
    assert set(FRAMEWORKS) <= kueue.FRAMEWORKS
