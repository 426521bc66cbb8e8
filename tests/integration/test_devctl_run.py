"""`devctl run` across the 2 pods of a distributed DevServer on the local Kubernetes API: the real
operator makes the server, devctl runs as alice (the dev stack's RBAC) and execs through the
API; each pod is a process tree with the container's filesystem (the scripts ConfigMap at
/etc/devserver, its home claim at /home/dev), hostname, environment (RANK, MASTER_ADDR, ...) and
non-root user (tests.kube_api.kubelet), so the rendered torchrun.sh runs there as in a pod and
the 2 nodes x 1 process meet over gloo through MASTER_ADDR as rendered (pod 0's DNS name: the
kubelet's /etc/hosts) and MASTER_PORT. The local pods share this machine's network, where the
rendered 29500 may be taken (another suite's run of this test): each run's pods get a free port
instead, as each server's pods have their own network on a cluster.
"""

import io
import os
import signal
import subprocess
import sys

import pytest
from kubernetes import config

from devservers import run as devctl_run
from devservers.devctl import Devctl
from devservers.kube import KubeCluster
from devservers.render import HOME
from tests.devservers_cluster import Cluster, free_port, wait_for

PODS = ["box-0", "box-1"]
SCRIPT = """
import os
import signal
import sys
import time

node = int(os.environ["GROUP_RANK"])
if sys.argv[1] == "meet":
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    total = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(total)
    with open("data/config.txt") as f:
        config = f.read().strip()
    print(f"rank {dist.get_rank()} of {dist.get_world_size()}: sum {total.item():.0f}, {config}")
    dist.destroy_process_group()
elif sys.argv[1] == "fail":
    if node == 1:
        os.kill(os.getppid(), signal.SIGKILL)  # node 1's torchrun dies, as the OOM killer does it
        sys.exit(1)
    import torch.distributed as dist

    dist.init_process_group("gloo")  # waits for the rank of node 1, which never comes
else:
    print(f"node {node} waiting", flush=True)
    time.sleep(300)
"""


def in_pod(cluster: Cluster, pod: str, *command: str) -> str:
    found = cluster.api.read("pods", "dev-alice", pod)
    run = cluster.api.runtime.run_in(found, list(command), stdout=subprocess.PIPE)
    return run.communicate(timeout=30)[0].decode()


def processes(cluster: Cluster, pod: str) -> list[str]:
    return cluster.api.runtime.processes(cluster.api.read("pods", "dev-alice", pod))


def own_rendezvous_port(port: int):
    """Admission that moves the pods' MASTER_PORT to `port`."""

    def admit(kind, obj) -> None:
        if kind.plural == "pods":
            for container in obj["spec"]["containers"]:
                for variable in container.get("env", []):
                    if variable["name"] == "MASTER_PORT":
                        variable["value"] = str(port)

    return admit


def test_run_syncs_the_workdir_streams_every_node_and_stops_them_all(
    dev_cluster, tmp_path, monkeypatch
):
    dev_cluster.api.admission.append(own_rendezvous_port(free_port()))
    dev_cluster.start_operator()
    dev_cluster.create_server("--distributed", "--replicas", "2", "--backend", "gloo")
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / ".git").mkdir()
    (project / "train.py").write_text(SCRIPT)
    (project / "data" / "config.txt").write_text("lr=0.1\n")
    (project / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    script = str(project / "train.py")

    # The working directory reaches every pod's home (less .git); both nodes meet and stream.
    meet = dev_cluster.devctl("alice", "run", "box", script, "meet")
    assert meet.returncode == 0, meet.stdout + meet.stderr
    lines = meet.stdout.splitlines()
    for rank, pod in enumerate(PODS):
        assert f"[{pod}] rank {rank} of 2: sum 3, lr=0.1" in lines
        workdir = f"{HOME}/devctl/project"
        assert in_pod(dev_cluster, pod, "cat", f"{workdir}/data/config.txt") == "lr=0.1\n"
        assert in_pod(dev_cluster, pod, "ls", "-A", workdir).split() == ["data", "train.py"]
    assert "devctl: synced 2 files" in meet.stderr

    # Node 1's torchrun dies: devctl stops node 0's, which waits for it, and exits with 137.
    fail = dev_cluster.devctl("alice", "run", "box", script, "fail")
    assert fail.returncode == 128 + signal.SIGKILL, fail.stdout + fail.stderr
    assert "devctl: torchrun on box-1 exited 137: stopping it on box-0" in fail.stderr

    # Ctrl-C: SIGINT to devctl ends torchrun and its worker on every pod.
    env = {**dev_cluster.devctl_env("alice"), "PYTHONUNBUFFERED": "1"}
    run = subprocess.Popen(
        [sys.executable, "-m", "devservers.cli", "run", "box", script, "wait"],
        cwd=dev_cluster.dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    waiting = set()
    try:
        while len(waiting) < 2:
            line = run.stdout.readline()
            assert line, run.stderr.read()
            waiting |= {pod for pod in PODS if line == f"[{pod}] node {pod[-1]} waiting\n"}
        # torchrun (its main thread names itself pt_elastic) and its worker
        assert {"pt_elastic", "python"} <= set(processes(dev_cluster, "box-1"))
        run.send_signal(signal.SIGINT)
        assert run.wait(timeout=60) == 128 + signal.SIGINT
    finally:
        run.kill()
        _, err = run.communicate()
    # Run from the directory above the project, the script's directory was synced, no more.
    assert "devctl: synced 2 files" in err and "devctl: stopping torchrun on box-0, box-1" in err
    for pod in PODS:  # the operator's activity probe (sh, cat) may be looking meanwhile
        assert [n for n in processes(dev_cluster, pod) if n not in ("sh", "cat")] == ["sleep"]
    assert dev_cluster.api.refusals == []

    # While the runs are being started, a Ctrl-C, or an API error once box-1's exec began:
    # every pod's run is stopped before devctl returns. Red when the stops ran in daemon
    # threads devctl did not wait for, when box-1 counted as started only once its call
    # returned, or when a Ctrl-C raised in the middle of the starts.
    cluster = KubeCluster(config.new_client_from_config(str(dev_cluster.kubeconfigs["alice"])))
    start = cluster.start
    sleeper = [sys.executable, "-c", "import time; time.sleep(300)"]
    launch = ["sh", "-c", devctl_run.LAUNCH, "launch", "project", "starts", *sleeper]

    def running(pod: str) -> bool:
        return "python" in processes(dev_cluster, pod)

    for interruption in ("ctrl-c", "api error"):

        def box_1_interrupted(
            namespace, pod, container, command, *args, interruption=interruption, **kwargs
        ):
            process = start(namespace, pod, container, command, *args, **kwargs)
            # Box-1's run, not the stop devctl then sends it through the same call.
            if pod == "box-1" and command == launch:
                wait_for(lambda: running("box-0") and running("box-1"), "both runs")
                if interruption == "api error":
                    raise OSError("the API server closed the connection")
                os.kill(os.getpid(), signal.SIGINT)
            return process

        monkeypatch.setattr(cluster, "start", box_1_interrupted)
        devctl = Devctl(cluster, "dev-alice", io.StringIO())
        if interruption == "api error":
            with pytest.raises(OSError):
                devctl_run.launch(devctl, PODS, launch, "starts")
        else:
            assert devctl_run.launch(devctl, PODS, launch, "starts") == 128 + signal.SIGINT
        assert not running("box-0") and not running("box-1"), interruption
