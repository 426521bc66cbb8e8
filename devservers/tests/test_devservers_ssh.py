"""SSH into a distributed DevServer's pods through real OpenSSH (tests/openssh.py): each of two
"pods" runs the rendered entrypoint as the pod does (its ConfigMap's start.sh, torchrun.sh and
authorized_keys in a directory, executed as the non-root user with the environment the rendered
pod spec gives it, plus an image's PATH and LD_LIBRARY_PATH), which ends in sshd on its own
loopback address; the real ssh client logs in with the owner's key. Over those sessions the
pods' torchrun.sh runs one gloo group of 2 pods x 2 processes.

What the test adapts, and only that: what the cluster supplies (the pod index behind RANK,
pod 0's DNS name behind MASTER_ADDR: its address here; MASTER_PORT: a free port; HOME: a temp
dir; the host key Secret's volume: a temp dir with a key the operator's code made), and sshd's
port 2222, which two "pods" on one machine cannot share."""

import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from devservers.api import flavor_object
from devservers.controller import new_host_key
from devservers.render import (
    ENTRYPOINT,
    TORCHRUN,
    config_map,
    stateful_set,
)
from devservers.tests.devserver_pods import pod_env, run_entrypoint
from devservers.tests.test_devservers_render import server
from tests.openssh import SYSTEM_PATH, OpenSsh, free_port

PODS = ["127.0.0.2", "127.0.0.3"]
# Each process reports in its own file: four processes sharing two pipes may interleave lines.
SCRIPT = """
import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
with open(os.path.join(sys.argv[1], f"rank-{dist.get_rank()}"), "w") as out:
    out.write(f"rank {dist.get_rank()} of {dist.get_world_size()}: sum {total.item():.0f}")
dist.destroy_process_group()
"""
# A value sshd_config must quote: spaces, both quotes, backslashes, what a shell would expand.
AWKWARD = "a  \"double\" 'single' \\back\\\\slash\\ $HOME `id` # not\ta comment  "


@dataclass
class Pod:
    name: str
    scripts: Path  # its ConfigMap's files
    env: dict[str, str]  # its container's environment


@pytest.fixture(scope="module")
def pods():
    with OpenSsh() as site:
        key = Path(f"{site.client_key}.pub").read_text().strip()
        distributed = {"worldSize": len(PODS), "nprocPerNode": 2, "backend": "gloo"}
        distributed["ncclEnv"] = {"NCCL_SOCKET_IFNAME": "lo", "NCCL_DEBUG_SUBSYS": AWKWARD}
        dev = server(mode="distributed", distributed=distributed, ssh={"authorizedKeys": [key]})
        files = config_map(dev)["data"]
        cpu = flavor_object(
            "cpu-4",
            "cpu",
            {"training-platform/pool": "cpu"},
            [],
            0,
            4,
            8,
            home_storage_class="gp3",
            shared_file_system=True,
        )
        template = stateful_set(dev, cpu)["spec"]["template"]
        (container,) = template["spec"]["containers"]
        image_env = {
            "PATH": f"{site.image_bin()}:{SYSTEM_PATH}",
            "LD_LIBRARY_PATH": str(site.mkdir("opt/amazon/ofi-nccl/lib")),
            "CUDA_VISIBLE_DEVICES": "",
            "BANNER": "one line\nand another",  # no sshd_config line can hold it
        }
        master_port = str(free_port(PODS[0]))
        host_key = new_host_key()  # the server's Secret, as the operator makes it
        found = []
        for index, address in enumerate(PODS):
            name = f"{dev['metadata']['name']}-{index}"
            env = image_env | pod_env(container, index)
            env |= {"MASTER_ADDR": PODS[0], "MASTER_PORT": master_port}
            scripts, env = run_entrypoint(site, name, address, files, env, host_key)
            found.append(Pod(name, scripts, env))
        yield site, found


def test_the_scripts_are_valid_shell():
    for script in (ENTRYPOINT, TORCHRUN):
        assert subprocess.run(["sh", "-n"], input=script, text=True).returncode == 0


def session_env(site: OpenSsh, pod: Pod) -> dict[str, str]:
    result = site.ssh(pod.name, "env -0")
    assert result.returncode == 0, result.stderr
    return dict(item.split("=", 1) for item in result.stdout.split("\0") if item)


def test_ssh_sessions_get_the_pods_environment(pods):
    site, found = pods
    for index, pod in enumerate(found):
        env = session_env(site, pod)
        one_line = {name: value for name, value in pod.env.items() if name != "BANNER"}
        assert {name: env.get(name) for name in one_line} == one_line
        assert "BANNER" not in env and "BANNER spans lines" in site.hosts[pod.name].log.read_text()
        assert env["RANK"] == str(index) and env["NCCL_DEBUG_SUBSYS"] == AWKWARD
        which = site.ssh(pod.name, "command -v python torchrun")
        conda = pod.env["PATH"].split(":")[0]
        assert which.stdout.split() == [f"{conda}/python", f"{conda}/torchrun"], which.stderr
        # What sshd sets for the session itself stays sshd's.
        assert env["USER"] == site.account.name and "SSH_CONNECTION" in env


def test_the_torchrun_helper_runs_over_ssh_on_every_pod(pods):
    site, found = pods
    out = site.mkdir("torchrun-out")
    script = site.write(site.dir / "train.py", SCRIPT)
    runs = [
        subprocess.Popen(
            [*site.client(), pod.name, f"{pod.scripts}/torchrun.sh {script} {out}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for pod in found
    ]
    outputs = [run.communicate(timeout=240)[0] for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    lines = sorted(p.read_text() for p in out.glob("rank-*"))
    # 2 pods x 2 processes: global ranks 0-3, and every one sees 1+2+3+4.
    assert lines == [f"rank {r} of 4: sum 10" for r in range(4)]
