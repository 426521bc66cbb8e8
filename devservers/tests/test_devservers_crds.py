"""The DevServer CRDs: valid CustomResourceDefinitions whose schemas and CEL rules do their job."""

import kubernetes_validate
import pytest

from devservers.api import API_VERSION, crds, flavor_object
from infra.core.tests.crd_schema import cel_violations, conformance_errors, with_defaults

KUBERNETES = "1.34"
GPU_TOLERATION = {
    "key": "nvidia.com/gpu",
    "operator": "Equal",
    "value": "true",
    "effect": "NoSchedule",
}


def gpu_flavor() -> dict:
    return flavor_object(
        "gpu-1",
        "gpu-small",
        {"training-platform/pool": "gpu-small"},
        [GPU_TOLERATION],
        1,
        8,
        40,
        home_storage_class="gp3",
        shared_file_system=True,
    )


def server(**spec) -> dict:
    return {
        "apiVersion": API_VERSION,
        "kind": "DevServer",
        "metadata": {"name": "box", "namespace": "dev-alice"},
        "spec": {"owner": "alice", "flavor": "gpu-1", "image": "repo/dev:1", **spec},
    }


@pytest.mark.parametrize("crd", crds(), ids=lambda c: c["metadata"]["name"])
def test_crds_are_valid_kubernetes_objects_with_printer_columns(crd):
    kubernetes_validate.validate(crd, KUBERNETES, strict=True)
    version = crd["spec"]["versions"][0]
    assert version["served"] and version["storage"]
    assert len(version["additionalPrinterColumns"]) >= 4


def test_the_devserver_crd_has_a_status_subresource_and_phase_columns():
    crd = next(c for c in crds() if c["spec"]["names"]["kind"] == "DevServer")
    version = crd["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Phase"] == ".status.phase" and columns["SSH"] == ".status.sshEndpoint"


def test_a_well_formed_server_and_flavor_conform():
    assert conformance_errors(server()) == []
    assert cel_violations(server()) == []
    flavor = gpu_flavor()
    assert conformance_errors(flavor) == []
    assert cel_violations(flavor) == []


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"mode": "interactive"}, "'interactive' is not one of"),
        ({"persistentHomeSize": "100GB"}, "does not match"),
        ({"ssh": {"authorizedKeys": ["not a key"]}}, "does not match"),
        ({"lifecycle": {"idleTimout": "1h"}}, "idleTimout"),
        ({"mode": "distributed", "distributed": {"worldSize": 1}}, "less than the minimum"),
        ({"lifecycle": {"keepUntil": "in two hours"}}, "is not a 'date-time'"),
        ({"lifecycle": {"idleGpuPercent": 101}}, "greater than the maximum of 100"),
        ({"lifecycle": {"idleCpuPercent": -1}}, "less than the minimum of 0"),
        ({"lifecycle": {"keepAliveProcesses": ["sixteen-chars-xx"]}}, "is too long"),
        ({"lifecycle": {"keepAliveProcesses": [""]}}, "should be non-empty"),
    ],
)
def test_schema_rejects_bad_fields(spec, expected):
    errors = conformance_errors(server(**spec))
    assert any(expected in e for e in errors), errors


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"distributed": {"worldSize": 2}}, "only with mode: distributed"),
        ({"mode": "distributed"}, "needs distributed.worldSize"),
        ({"ssh": {"enabled": False, "serviceType": "LoadBalancer"}}, "needs ssh.enabled"),
        (
            {"mode": "distributed", "distributed": {"worldSize": 2, "ncclEnv": {"FOO": "1"}}},
            "must start with NCCL_",
        ),
        (
            {"lifecycle": {"keepAliveProcesses": ["*", "python"]}},
            "'*' (any process) stands alone in keepAliveProcesses",
        ),
    ],
)
def test_cel_rules_reject_inconsistent_specs(spec, expected):
    assert conformance_errors(server(**spec)) == []
    assert any(expected in v for v in cel_violations(server(**spec)))


def test_transition_rules_keep_owner_and_home_size():
    old = server(persistentHomeSize="100Gi")
    assert cel_violations(server(persistentHomeSize="100Gi", stopped=True), old) == []
    changed = cel_violations(server(owner="bob", persistentHomeSize="200Gi"), old)
    assert any("owner is immutable" in v for v in changed)
    assert any("persistentHomeSize is immutable" in v for v in changed)


def test_a_flavor_names_its_home_storage_class_and_defaults_to_mounting_shared():
    flavor = gpu_flavor()
    del flavor["spec"]["homeStorageClass"]
    assert any("'homeStorageClass' is a required property" in e for e in conformance_errors(flavor))
    flavor["spec"]["homeStorageClass"] = "Not A Class"
    assert any("does not match" in e for e in conformance_errors(flavor))
    # A flavor stored before the field existed reads as one whose nodes mount /shared.
    flavor = gpu_flavor()
    del flavor["spec"]["sharedFileSystem"]
    assert with_defaults(flavor)["spec"]["sharedFileSystem"] is True


def test_flavor_memory_limit_must_equal_its_request():
    flavor = gpu_flavor()
    flavor["spec"]["resources"]["limits"]["memory"] = "80Gi"
    assert any("memory limit must equal" in v for v in cel_violations(flavor))


def test_idle_settings_and_the_stop_warning_conform():
    lifecycle = {
        "idleTimeout": "45m",
        "idleGpuPercent": 10,
        "idleCpuPercent": 150,
        "keepAliveProcesses": ["python", "jupyter-lab"],
        "keepUntil": "2026-11-22T11:00:00+01:00",  # any RFC 3339 time, as a user may write it
    }
    kept = server(lifecycle=lifecycle)
    kept["status"] = {
        "idleStopAt": "2026-11-22T11:00:00Z",
        "conditions": [
            {
                "type": "IdleStopSoon",
                "status": "True",
                "reason": "IdleTimeout",
                "message": "idle ...: stops at 2026-11-22T11:00:00Z (in 10m)",
                "lastTransitionTime": "2026-11-22T10:50:00Z",
            }
        ],
    }
    assert conformance_errors(kept) == [] and cel_violations(kept) == []
    anything = server(lifecycle={"keepAliveProcesses": ["*"]})
    assert conformance_errors(anything) == [] and cel_violations(anything) == []
