"""The real Cluster boundary's own logic: RBAC refusals, settings, DCGM parsing (no cluster)."""

import pytest
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic.exceptions import ForbiddenError, UnprocessibleEntityError

from devservers.activity import gpu_utilization, parse_duration
from devservers.kube import _Denied, settings_from_env


def test_a_403_becomes_permission_error_with_the_servers_message():
    class Resource:
        def get(self, **_):
            error = ApiException(status=403, reason="Forbidden")
            error.body, error.headers = '{"message": "User alice cannot list"}', {}
            raise ForbiddenError(error)

    with pytest.raises(PermissionError, match="User alice cannot list"):
        _Denied(Resource()).get(namespace="dev-bob")


def test_other_refusals_carry_the_api_servers_message():
    class Resource:
        def create(self, **_):
            error = ApiException(status=422, reason="Unprocessable Entity")
            error.body = (
                '{"message": "distributed settings are allowed only with mode: distributed"}'
            )
            error.headers = {}
            raise UnprocessibleEntityError(error)

    with pytest.raises(OSError, match="refused: .*only with mode: distributed"):
        _Denied(Resource()).create(body={})


def test_settings_come_from_the_operators_environment(monkeypatch):
    monkeypatch.setenv("DEVSERVERS_SSH_CIDRS", "203.0.113.0/24,198.51.100.0/24")
    monkeypatch.setenv("DEVSERVERS_HOME_STORAGE_CLASS", "gp3-fast")
    settings = settings_from_env()
    assert settings.ssh_cidrs == ("203.0.113.0/24", "198.51.100.0/24")
    assert settings.home_storage_class == "gp3-fast"
    monkeypatch.setenv("DEVSERVERS_SSH_CIDRS", "")
    assert settings_from_env().ssh_cidrs == ()


METRICS = """# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-1",namespace="dev-alice",pod="box-0",container="dev"} 3
DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-2",namespace="dev-alice",pod="box-0",container="dev"} 71
DCGM_FI_DEV_GPU_UTIL{gpu="2",UUID="GPU-3",namespace="dev-bob",pod="box-0",container="dev"} 99
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-1",namespace="dev-alice",pod="box-0"} 1024
"""


def test_dcgm_utilization_is_the_busiest_gpu_of_the_servers_pods():
    assert gpu_utilization(METRICS, "dev-alice", {"box-0"}) == 71.0
    assert gpu_utilization(METRICS, "dev-alice", {"other-0"}) is None


def test_idle_timeouts_parse_like_the_crd_pattern():
    assert parse_duration("2h") == 7200
    assert parse_duration("1h30m") == 5400
    assert parse_duration("45m") == 2700
