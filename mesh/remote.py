"""SSH to mesh nodes: what each one has (GPUs, torch, CUDA), and torchrun on all of them at once."""

import json
import shlex
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import paramiko

from mesh.spec import Mesh, Node

CONNECT_TIMEOUT = 10.0
NVIDIA_SMI = "nvidia-smi --query-gpu=name,memory.total,memory.free --format=csv,noheader,nounits"
TORCH_PROBE = (
    "import json, torch; print(json.dumps({'torch': torch.__version__, "
    "'cuda': torch.version.cuda, 'cuda_available': torch.cuda.is_available()}))"
)
# The launch command's first output line: the remote torchrun's PID, so Ctrl-C can stop it.
PID_MARK = "TP_MESH_PID="
# How long stopped nodes get to shut their workers down before the launcher gives up on them.
STOP_GRACE_SECONDS = 30.0
# How long the launcher waits, once one node has finished the run, for nodes still running: a
# machine that dropped off the network (asleep, unplugged) never ends its torchrun, and its SSH
# session never closes.
FINISH_GRACE_SECONDS = 60.0
# torchrun's c10d rendezvous settings (torch/distributed/elastic/rendezvous/dynamic_rendezvous.py).
# When a node leaves, the survivors' workers fail and their agents re-rendezvous; the new round
# forms only after the leaver's heartbeat has expired (keep_alive_interval x
# keep_alive_max_attempt) and then after last_call_timeout, the wait for nodes beyond MIN.
# torch's defaults (5 s x 3, then 30 s) hold survivors about 45 s; these hold them about 16 s.
# A live node silent for 6 s (a flaky home link) is only struck from the rendezvous state: its
# workers keep training, and it joins the next round when one forms.
# last_call also lets a node that starts late (a slow disk importing torch) join the first
# round; one that misses it joins the next, at the cost of one restart of every worker.
RENDEZVOUS_CONF = {"keep_alive_interval": 2, "keep_alive_max_attempt": 3, "last_call_timeout": 10}


def connect(mesh: Mesh, node: Node) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    client.load_system_host_keys()
    if mesh.known_hosts:
        client.load_host_keys(str(Path(mesh.known_hosts).expanduser()))
    # A mesh of friends' machines: an unknown host key is refused, never trusted on first use.
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    key_file = str(Path(node.ssh.key_file).expanduser()) if node.ssh.key_file else None
    client.connect(
        node.ssh.host,
        port=node.ssh.port,
        username=node.ssh.user,
        key_filename=key_file,
        timeout=CONNECT_TIMEOUT,
        banner_timeout=CONNECT_TIMEOUT,
        auth_timeout=CONNECT_TIMEOUT,
    )
    return client


def run(client: paramiko.SSHClient, command: str, timeout: float = 60.0) -> tuple[int, str, str]:
    _, stdout, stderr = client.exec_command(command, timeout=timeout)
    out, err = stdout.read().decode(), stderr.read().decode()
    return stdout.channel.recv_exit_status(), out, err


def in_workdir(node: Node, command: str) -> str:
    """`command` run from the node's workdir; a leading ~ still expands on the remote side."""
    workdir = node.workdir
    if workdir == "~" or workdir.startswith("~/"):
        target = '"$HOME"' + (f"/{shlex.quote(workdir[2:])}" if workdir[2:] else "")
    else:
        target = shlex.quote(workdir)
    return f"cd {target} && {command}"


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_total_mib: int
    memory_free_mib: int


@dataclass
class NodeReport:
    node: str
    reachable: bool
    gpus: list[Gpu] = field(default_factory=list)
    torch: str | None = None
    cuda: str | None = None
    cuda_available: bool = False
    problems: list[str] = field(default_factory=list)  # what stops this node from training

    @property
    def ready(self) -> bool:
        return self.reachable and not self.problems

    @property
    def procs(self) -> int:
        """Trainer processes this node runs: one per GPU, one (gloo) on a CPU-only node."""
        return len(self.gpus) if self.gpus and self.cuda_available else 1

    def summary(self) -> str:
        if not self.reachable:
            return f"{self.node}: unreachable: {'; '.join(self.problems)}"
        if self.gpus:
            hardware = ", ".join(
                f"{g.name} {g.memory_free_mib}/{g.memory_total_mib} MiB free" for g in self.gpus
            )
        else:
            hardware = "CPU-only (no nvidia-smi GPUs)"
        software = f"torch {self.torch or '-'}, CUDA {self.cuda or '-'}"
        state = "ready" if self.ready else "NOT READY: " + "; ".join(self.problems)
        return f"{self.node}: {hardware}; {software}; {self.procs} process(es); {state}"


def parse_gpus(csv: str) -> list[Gpu]:
    gpus = []
    for line in csv.strip().splitlines():
        name, total, free = (part.strip() for part in line.rsplit(",", 2))
        gpus.append(Gpu(name, int(float(total)), int(float(free))))
    return gpus


def check_node(mesh: Mesh, node: Node) -> NodeReport:
    try:
        client = connect(mesh, node)
    except (OSError, paramiko.SSHException) as e:
        reason = getattr(e, "strerror", None) or str(e)
        return NodeReport(node.name, reachable=False, problems=[f"{type(e).__name__}: {reason}"])
    report = NodeReport(node.name, reachable=True)
    with client:
        status, out, err = run(client, NVIDIA_SMI)
        if status == 0:
            report.gpus = parse_gpus(out)
        elif status != 127:  # 127: no nvidia-smi at all, a CPU-only machine
            report.problems.append(f"nvidia-smi failed ({status}): {err.strip()[:200]}")
        probe = f"{shlex.quote(node.python)} -c {shlex.quote(TORCH_PROBE)}"
        status, out, err = run(client, in_workdir(node, probe))
        if status == 0:
            facts = json.loads(out.strip().splitlines()[-1])
            report.torch, report.cuda = facts["torch"], facts["cuda"]
            report.cuda_available = facts["cuda_available"]
            if report.gpus and not report.cuda_available:
                # It would train on CPU and hold every other node back to its pace.
                report.problems.append(
                    f"nvidia-smi shows {len(report.gpus)} GPU(s) but torch {report.torch} "
                    "sees no CUDA device (a CPU-only torch build, or a driver older than "
                    "its CUDA)"
                )
        else:
            report.problems.append(
                f"{node.python} cannot import torch in {node.workdir}: "
                f"{(err.strip().splitlines() or ['exit ' + str(status)])[-1][:200]}"
            )
    return report


def check_all(mesh: Mesh) -> list[NodeReport]:
    reports: dict[str, NodeReport] = {}
    threads = [
        threading.Thread(target=lambda n=n: reports.__setitem__(n.name, check_node(mesh, n)))
        for n in mesh.nodes
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [reports[n.name] for n in mesh.nodes]


def torchrun_command(
    mesh: Mesh,
    node: Node,
    nnodes: str,
    procs: int,
    run_id: str,
    max_restarts: int,
    script: list[str],
) -> str:
    """One node's torchrun: same rendezvous, script and arguments on every node.

    The coordinator hosts the c10d store (is_host says so explicitly rather than by matching
    host names), and every node publishes its WireGuard address so peers reach it over the mesh.
    """
    env = {"GLOO_SOCKET_IFNAME": node.interface, "NCCL_SOCKET_IFNAME": node.interface}
    rendezvous_conf = {"is_host": int(node.name == mesh.coordinator), **RENDEZVOUS_CONF}
    torchrun = [
        node.python,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        nnodes,
        "--nproc-per-node",
        str(procs),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        mesh.rendezvous_endpoint(),
        "--rdzv-id",
        run_id,
        "--rdzv-conf",
        ",".join(f"{k}={v}" for k, v in rendezvous_conf.items()),
        "--local-addr",
        str(mesh.addresses()[node.name]),
        "--max-restarts",
        str(max_restarts),
        *script,
    ]
    exports = [f"{k}={shlex.quote(v)}" for k, v in env.items()]
    return in_workdir(
        node, f"echo {PID_MARK}$$ && exec env {' '.join(exports)} {shlex.join(torchrun)}"
    )


class Launch:
    """torchrun on every node over SSH, logs streamed with a `[node]` prefix, stop() ends all."""

    def __init__(self, mesh: Mesh, commands: dict[str, str], out=None):
        self.mesh, self.commands, self.out = mesh, commands, out
        self.exit_codes: dict[str, int] = {}
        self._clients: dict[str, paramiko.SSHClient] = {}
        self._pids: dict[str, str] = {}
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._finished_at: float | None = None

    def start(self) -> None:
        for name in self.commands:
            self._clients[name] = connect(self.mesh, self.mesh.node(name))
        for name, command in self.commands.items():
            thread = threading.Thread(target=self._stream, args=(name, command), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _print(self, name: str, line: str) -> None:
        with self._lock:
            print(f"[{name}] {line}", file=self.out or sys.stdout, flush=True)

    def _stream(self, name: str, command: str) -> None:
        channel = self._clients[name].get_transport().open_session()
        channel.set_combine_stderr(True)
        channel.exec_command(command)
        for raw in channel.makefile("r"):
            line = raw.rstrip("\n")
            if line.startswith(PID_MARK) and name not in self._pids:
                self._pids[name] = line[len(PID_MARK) :]
            else:
                self._print(name, line)
        code = channel.recv_exit_status()
        self.exit_codes[name] = code
        if code == 0 and self._finished_at is None:
            self._finished_at = time.monotonic()
        self._print(name, f"torchrun exited with {code}")

    def wait(self, timeout: float | None = None) -> bool:
        """True once every node's torchrun has exited. Joins in short slices so Ctrl-C lands."""
        for thread in self._threads:
            thread.join(timeout)
            if thread.is_alive():
                return False
        return True

    def silent(self) -> list[str]:
        """Nodes still running FINISH_GRACE_SECONDS after another one finished the run."""
        if self._finished_at is None or time.monotonic() - self._finished_at < FINISH_GRACE_SECONDS:
            return []
        return [name for name in self.commands if name not in self.exit_codes]

    def stop(self) -> None:
        """SIGTERM each node's torchrun: its agent stops the workers and exits."""
        for name, pid in self._pids.items():
            if name not in self.exit_codes:
                self._print(name, "stopping")
                run(self._clients[name], f"kill -TERM {int(pid)}", timeout=CONNECT_TIMEOUT)
        self.wait(STOP_GRACE_SECONDS)

    def close(self) -> None:
        for client in self._clients.values():
            client.close()


def new_run_id() -> str:
    return f"tp-mesh-{uuid.uuid4().hex[:8]}"
