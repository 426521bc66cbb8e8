"""The real Cluster boundary (devservers.kube) against the local Kubernetes API: what a refusal,
an invalid object or a refused exec/port-forward upgrade becomes; exec and port-forward through
the API; settings and DCGM parsing (no dev_cluster)."""

import socket
import threading

import pytest
from kubernetes import config

from devservers.activity import gpu_utilization, parse_duration
from devservers.api import API_VERSION
from devservers.kube import KubeCluster, exit_code, settings_from_env
from devservers.tests.test_devservers_render import server
from tests.devservers_cluster import Cluster


def boundary(dev_cluster: Cluster, who: str) -> KubeCluster:
    return KubeCluster(config.new_client_from_config(str(dev_cluster.kubeconfigs[who])))


def test_a_403_is_a_permission_error_with_the_api_servers_message(dev_cluster):
    with pytest.raises(PermissionError, match='cannot list resource "devservers" .* "dev-bob"'):
        boundary(dev_cluster, "alice").list(API_VERSION, "DevServer", "dev-bob", {})


def test_an_invalid_object_is_refused_with_the_api_servers_message(dev_cluster):
    manifest = server(lifecycle={"idleTimeout": "2h"})
    manifest["metadata"] = {"name": "box", "namespace": "dev-alice"}
    manifest["spec"]["lifecycle"]["idleTimeout"] = "90s"
    with pytest.raises(OSError, match=r"refused: DevServer\S* \"box\" is invalid: .*idleTimeout"):
        boundary(dev_cluster, "alice").create(manifest)


def test_refused_exec_and_port_forward_upgrades_are_permission_errors(dev_cluster):
    """The client raises an AttributeError for these (see devservers.kube._failure)."""
    bob = boundary(dev_cluster, "bob")
    refusal = 'pods "box-0" is forbidden: User "arn:aws:iam::123456789012:user/bob" cannot get'
    with pytest.raises(PermissionError, match=refusal + ' resource "pods/exec"'):
        bob.exec("dev-alice", "box-0", "dev", ["id"])
    with pytest.raises(PermissionError, match=refusal + ' resource "pods/exec"'):
        bob.start("dev-alice", "box-0", "dev", ["id"])
    with pytest.raises(PermissionError, match=refusal + ' resource "pods/portforward"'):
        with bob.connection("dev-alice", "box-0", 2222):
            pass


def test_exec_and_port_forward_reach_the_pod(dev_cluster):
    pod = {"metadata": {"name": "box-0"}, "spec": {"containers": [{"name": "dev", "image": "i"}]}}
    dev_cluster.client().resources.get(api_version="v1", kind="Pod").create(
        body=pod, namespace="dev-alice"
    )
    dev_cluster.api.settle()
    echo = socket.create_server(("127.0.0.1", 0))

    def serve():
        connection, _ = echo.accept()
        with connection:
            connection.sendall(connection.recv(100).upper())

    threading.Thread(target=serve, daemon=True).start()
    dev_cluster.api.runtime.expose("dev-alice", "box-0", 2222, echo.getsockname()[1])
    alice = boundary(dev_cluster, "alice")
    assert alice.exec("dev-alice", "box-0", "dev", ["sh", "-c", "echo $$"]).strip() == "2"
    with alice.connection("dev-alice", "box-0", 2222) as s:
        s.sendall(b"hello")
        assert s.recv(100) == b"HELLO"
    echo.close()
    with pytest.raises(OSError, match="port-forward to box-0:2223: .*failed to connect"):
        with alice.connection("dev-alice", "box-0", 2223) as s:
            assert s.recv(100) == b""  # the pod's side refused: the connection ends at once
    assert dev_cluster.api.refusals == []


def test_a_started_command_streams_and_exits_with_its_code(dev_cluster):
    pod = {"metadata": {"name": "box-0"}, "spec": {"containers": [{"name": "dev", "image": "i"}]}}
    dev_cluster.client().resources.get(api_version="v1", kind="Pod").create(
        body=pod, namespace="dev-alice"
    )
    dev_cluster.api.settle()
    alice = boundary(dev_cluster, "alice")
    script = "head -c 6 | tr a-z A-Z; echo oops >&2; exit 3"
    process = alice.start("dev-alice", "box-0", "dev", ["sh", "-c", script], stdin=True)
    process.write(b"stdin!")
    out = err = b""
    while (chunk := process.read(0.5)) is not None:
        out, err = out + chunk[0], err + chunk[1]
    assert (out, err, process.exit_code()) == (b"STDIN!", b"oops\n", 3)
    done = alice.start("dev-alice", "box-0", "dev", ["true"])
    while done.read(0.5) is not None:
        pass
    assert done.exit_code() == 0


# client-go's rules for the Status an exec's error channel ends with
# (tools/remotecommand/v4.go, errorDecoderV4.decode), each case ours: not JSON is a protocol
# error; Success is exit 0; a Failure is its message, unless its reason is NonZeroExitCode,
# whose ExitCode cause must be there and hold an integer, the exit code; a Status of neither
# kind is an unknown error.
@pytest.mark.parametrize(
    ("status", "found"),
    [
        ('{"kind": "Status"}', "unknown error"),
        ('{"status": "Succ', "protocol error"),
        ('{"kind": "Status", "apiVersion": "v1", "status": "Success", "metadata": {}}', 0),
        ('{"status": "Failure", "message": "container not found (\\"dev\\")"}', "container not"),
        (
            '{"status": "Failure", "message": "command terminated with non-zero exit code", '
            '"reason": "NonZeroExitCode", "details": {"causes": [{"reason": "Signal"}]}}',
            "no ExitCode cause given",
        ),
        (
            '{"status": "Failure", "reason": "NonZeroExitCode", '
            '"details": {"causes": [{"reason": "ExitCode", "message": "two"}]}}',
            "invalid exit code value 'two'",
        ),
        (
            '{"status": "Failure", "message": "command terminated with non-zero exit code", '
            '"reason": "NonZeroExitCode", '
            '"details": {"causes": [{"reason": "ExitCode", "message": "137"}]}}',
            137,
        ),
    ],
)
def test_an_exec_status_is_read_as_client_go_reads_it(status, found):
    if isinstance(found, int):
        assert exit_code(status) == found
    else:
        with pytest.raises(OSError, match=found):
            exit_code(status)


def test_settings_come_from_the_operators_environment(monkeypatch):
    monkeypatch.setenv("DEVSERVERS_SSH_CIDRS", "203.0.113.0/24,198.51.100.0/24")
    monkeypatch.setenv("DEVSERVERS_IDLE_GPU_PERCENT", "15")
    monkeypatch.setenv("DEVSERVERS_IDLE_CPU_PERCENT", "25")
    settings = settings_from_env()
    assert settings.ssh_cidrs == ("203.0.113.0/24", "198.51.100.0/24")
    assert (settings.idle_gpu_percent, settings.idle_cpu_percent) == (15.0, 25.0)
    monkeypatch.setenv("DEVSERVERS_SSH_CIDRS", "")
    assert settings_from_env().ssh_cidrs == ()


# What the DCGM exporter serves besides GPU utilization, in the format of its tag 4.5.3-4.8.2
# (internal/pkg/rendermetrics/render_metrics.go, gpuMetricsFormat: gpu, UUID, pci_bus_id, device,
# modelName, Hostname, then the pod attributes container, namespace, pod in key order, empty for
# GPUs no pod holds); the lines and figures are ours.
OTHER_METRICS = """\
# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).
# TYPE DCGM_FI_DEV_POWER_USAGE gauge
DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-0f0e0d0c-1111-4a2b-8c3d-aabbccddeeff",pci_bus_id="00000000:00:1B.0",device="nvidia0",modelName="NVIDIA A10G",Hostname="ip-10-20-1-5",container="dev",namespace="dev-alice",pod="box-0"} 61.5
DCGM_FI_DEV_POWER_USAGE{gpu="3",UUID="GPU-3d3c3b3a-1111-4a2b-8c3d-aabbccddeeff",pci_bus_id="00000000:00:1E.0",device="nvidia3",modelName="NVIDIA A10G",Hostname="ip-10-20-1-5",container="",namespace="",pod=""} 24.0
# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-0f0e0d0c-1111-4a2b-8c3d-aabbccddeeff",pci_bus_id="00000000:00:1B.0",device="nvidia0",modelName="NVIDIA A10G",Hostname="ip-10-20-1-5",container="dev",namespace="dev-alice",pod="box-0"} 18240
DCGM_FI_DEV_FB_USED{gpu="3",UUID="GPU-3d3c3b3a-1111-4a2b-8c3d-aabbccddeeff",pci_bus_id="00000000:00:1E.0",device="nvidia3",modelName="NVIDIA A10G",Hostname="ip-10-20-1-5",container="",namespace="",pod=""} 0
"""  # noqa: E501
GPU_UTIL = """\
# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-0f0e0d0c-1111-4a2b-8c3d-aabbccddeeff",pci_bus_id="00000000:00:1B.0",device="nvidia0",modelName="NVIDIA A10G",Hostname="ip-10-20-1-5",container="dev",namespace="dev-alice",pod="box-0"} 3
DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-1c1e2d3f-0000-4e5a-9b8c-7d6e5f4a3b2c",pci_bus_id="00000000:00:1C.0",device="nvidia1",modelName="NVIDIA A10G",Hostname="ip-10-20-1-5",container="dev",namespace="dev-alice",pod="box-0"} 71
DCGM_FI_DEV_GPU_UTIL{gpu="2",UUID="GPU-2a3b4c5d-0000-4e5a-9b8c-7d6e5f4a3b2c",pci_bus_id="00000000:00:1D.0",device="nvidia2",modelName="NVIDIA A10G",Hostname="ip-10-20-1-5",container="dev",namespace="dev-bob",pod="box-0"} 99
DCGM_FI_DEV_GPU_UTIL{gpu="3",UUID="GPU-3b4c5d6e-0000-4e5a-9b8c-7d6e5f4a3b2c",pci_bus_id="00000000:00:1E.0",device="nvidia3",modelName="NVIDIA A10G",Hostname="ip-10-20-1-5",container="",namespace="",pod=""} 100
"""  # noqa: E501


def test_dcgm_utilization_is_the_busiest_gpu_of_the_servers_pods():
    metrics = OTHER_METRICS + GPU_UTIL
    assert gpu_utilization(metrics, "dev-alice", {"box-0"}) == 71.0
    assert gpu_utilization(metrics, "dev-bob", {"box-0"}) == 99.0
    assert gpu_utilization(metrics, "dev-alice", {"other-0"}) is None
    assert gpu_utilization(OTHER_METRICS, "dev-alice", {"box-0"}) is None  # no utilization line


def test_idle_timeouts_parse_like_the_crd_pattern():
    assert parse_duration("2h") == 7200
    assert parse_duration("1h30m") == 5400
    assert parse_duration("45m") == 2700
