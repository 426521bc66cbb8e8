"""SSH to mesh nodes: what each one has (GPUs, torch, CUDA) and whether it reaches the coordinator
over the mesh; the workdir and setup on each; and torchrun on all of them at once."""

import json
import shlex
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
# The check's reachability probe: the coordinator listens on its mesh address at the rendezvous
# port (until the check closes its stdin), and each node connects there from its own mesh
# address, as torchrun's agent will. The node closes first, so no TIME_WAIT holds the port
# against torchrun's store.
LISTENER = """
import select, socket, sys
address, port = sys.argv[1], int(sys.argv[2])
family = socket.AF_INET6 if ":" in address else socket.AF_INET
server = socket.create_server((address, port), family=family)
print("listening", flush=True)
while select.select([server, sys.stdin], [], [], 120)[0] == [server]:
    connection, peer = server.accept()
    connection.settimeout(5)
    connection.sendall(("tp-mesh " + peer[0] + "\\n").encode())
    try:
        connection.recv(1)
    except OSError:
        pass
    connection.close()
"""
PROBE = """
import socket, sys
target, port, source = sys.argv[1], int(sys.argv[2]), sys.argv[3]
with socket.create_connection((target, port), 5, source_address=(source, 0)) as connection:
    print(connection.makefile().readline().strip())
"""


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


def ending(what: str, code: int) -> str:
    """How a command ended, from paramiko's exit status: -1 when the server sent none. OpenSSH's
    sshd sends exit-signal instead of exit-status for a command a signal ended (session.c
    session_exit_message), which paramiko does not read (channel.py _handle_request), and
    nothing when the connection dropped (the machine lost power)."""
    if code == -1:
        return f"{what} ended without an exit status (a signal, or the SSH connection dropped)"
    return f"{what} exited with {code}"


def unreachable(error: Exception) -> str:
    return f"{type(error).__name__}: {getattr(error, 'strerror', None) or error}"


def run(client: paramiko.SSHClient, command: str, timeout: float = 60.0) -> tuple[int, str, str]:
    _, stdout, stderr = client.exec_command(command, timeout=timeout)
    out, err = stdout.read().decode(), stderr.read().decode()
    return stdout.channel.recv_exit_status(), out, err


def remote_workdir(node: Node) -> str:
    """The node's workdir as a shell word; a leading ~ still expands on the remote side."""
    workdir = node.workdir
    if workdir == "~" or workdir.startswith("~/"):
        return '"$HOME"' + (f"/{shlex.quote(workdir[2:])}" if workdir[2:] else "")
    return shlex.quote(workdir)


def in_workdir(node: Node, command: str) -> str:
    """`command` run from the node's workdir."""
    return f"cd {remote_workdir(node)} && {command}"


def python_command(node: Node, program: str, *args: str) -> str:
    """The node's Python running `program` (source text) from its workdir."""
    argv = [node.python, "-c", program, *args]
    return in_workdir(node, shlex.join(argv))


def last_line(text: str, default: str) -> str:
    return (text.strip().splitlines() or [default])[-1][:200]


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


def check_node(mesh: Mesh, node: Node, listener_problem: str | None) -> NodeReport:
    """What the node has, and whether it reaches the coordinator's rendezvous port over the mesh
    (probed only while the coordinator listens: listener_problem None)."""
    try:
        client = connect(mesh, node)
    except (OSError, paramiko.SSHException) as e:
        return NodeReport(node.name, reachable=False, problems=[unreachable(e)])
    report = NodeReport(node.name, reachable=True)
    with client:
        status, out, err = run(client, NVIDIA_SMI)
        if status == 0:
            report.gpus = parse_gpus(out)
        elif status != 127:  # 127: no nvidia-smi at all, a CPU-only machine
            report.problems.append(f"nvidia-smi failed ({status}): {err.strip()[:200]}")
        status, out, err = run(client, python_command(node, TORCH_PROBE))
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
                f"{last_line(err, f'exit {status}')}"
            )
        if listener_problem is not None and node.name == mesh.coordinator:
            report.problems.append(listener_problem)
        elif listener_problem is None:
            problem = probe_rendezvous(mesh, node, client)
            report.problems += [problem] if problem else []
    return report


def network_hint(mesh: Mesh) -> str:
    if mesh.on_tailnet:
        return (
            "is `tailscale up` done on both machines (tailscaled with a TUN interface, not "
            "userspace-networking), and do the tailnet's ACLs allow TCP between them?"
        )
    return "is WireGuard up on both machines (`wg-quick up`, `wg show`)?"


def probe_rendezvous(mesh: Mesh, node: Node, client: paramiko.SSHClient) -> str | None:
    """A TCP connection from the node's mesh address to the coordinator's rendezvous port."""
    addresses = mesh.addresses()
    target, port = str(addresses[mesh.coordinator]), str(mesh.rendezvous_port)
    source = str(addresses[node.name])
    status, out, err = run(client, python_command(node, PROBE, target, port, source))
    if status == 0 and out.startswith("tp-mesh "):
        return None
    return (
        f"cannot reach the coordinator's rendezvous port {mesh.rendezvous_endpoint()} from "
        f"{source}: {last_line(err or out, f'exit {status}')}; {network_hint(mesh)}"
    )


@contextmanager
def rendezvous_listener(mesh: Mesh) -> Iterator[str | None]:
    """The coordinator listening at its rendezvous address for the probes; yields None while it
    does, else why not."""
    node = mesh.node(mesh.coordinator)
    endpoint = mesh.rendezvous_endpoint()
    try:
        client = connect(mesh, node)
    except (OSError, paramiko.SSHException):
        yield "unreachable"  # its own check says why
        return
    with client:
        channel = client.get_transport().open_session()
        channel.settimeout(CONNECT_TIMEOUT * 3)
        channel.set_combine_stderr(True)
        address = str(mesh.addresses()[node.name])
        channel.exec_command(python_command(node, LISTENER, address, str(mesh.rendezvous_port)))
        output = channel.makefile("r")
        try:
            first = output.readline()
            problem = None if first.strip() == "listening" else first + output.read().decode()
        except TimeoutError:
            problem = "no answer"
        if problem is not None:
            problem = (
                f"cannot listen on its rendezvous address {endpoint}: "
                f"{last_line(problem, 'exit ' + str(channel.recv_exit_status()))} "
                f"(a run still going there? otherwise: {network_hint(mesh)})"
            )
        try:
            yield problem
        finally:
            channel.shutdown_write()  # the listener's stdin ends: it exits and frees the port
            deadline = time.monotonic() + CONNECT_TIMEOUT
            while not channel.exit_status_ready() and time.monotonic() < deadline:
                time.sleep(0.05)


def on_each(nodes: list[Node], task: Callable[[Node], object]) -> dict[str, object]:
    """task(node) for every node at once, in threads; node name -> its result."""
    results: dict[str, object] = {}
    threads = [
        threading.Thread(target=lambda n=n: results.__setitem__(n.name, task(n))) for n in nodes
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {n.name: results[n.name] for n in nodes}


def check_all(mesh: Mesh) -> list[NodeReport]:
    with rendezvous_listener(mesh) as listener_problem:
        reports = on_each(mesh.nodes, lambda n: check_node(mesh, n, listener_problem))
    return list(reports.values())


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
    host names), and every node publishes its mesh address (WireGuard or tailnet) so peers reach
    it over the mesh.
    """
    interface = mesh.interface(node)
    env = {"GLOO_SOCKET_IFNAME": interface, "NCCL_SOCKET_IFNAME": interface}
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


def prepare_workdirs(mesh: Mesh, archive: bytes | None) -> dict[str, str | None]:
    """Every node's workdir made, and the archive (a tar) unpacked into it, over SSH on all nodes
    at once: node name -> None once done, else what went wrong. Nodes SSH does not reach are left
    out: the check before the launch names them."""

    def prepare(node: Node) -> str | None | Exception:
        try:
            client = connect(mesh, node)
        except (OSError, paramiko.SSHException) as e:
            return e
        workdir = remote_workdir(node)
        command = f"mkdir -p {workdir}"
        if archive is not None:
            # The files become the SSH user's, whoever owned them here.
            command += f" && tar -x -f - --no-same-owner -C {workdir}"
        with client:
            channel = client.get_transport().open_session()
            channel.set_combine_stderr(True)
            channel.exec_command(command)
            channel.sendall(archive or b"")
            channel.shutdown_write()
            output = channel.makefile("rb").read().decode(errors="replace")
            code = channel.recv_exit_status()
        return None if code == 0 else f"failed ({code}): {last_line(output, 'no output')}"

    results = on_each(mesh.nodes, prepare)
    return {name: r for name, r in results.items() if not isinstance(r, Exception)}


def setup_command(node: Node, setup: str) -> str:
    """The setup command run by sh from the node's workdir, for Launch(..., what="setup")."""
    return in_workdir(node, f"echo {PID_MARK}$$ && exec /bin/sh -c {shlex.quote(setup)}")


class Launch:
    """A command on every node over SSH (torchrun, or the setup before it), its output streamed
    with a `[node]` prefix; stop() ends it on all of them.

    Each command prints PID_MARK and its PID first. stop() sends that process SIGTERM (torchrun's
    agent then stops its workers), or with group=True its whole process group: a setup's shell
    and what it started (pip), as SSH servers start each command as a session leader.
    """

    def __init__(
        self,
        mesh: Mesh,
        commands: dict[str, str],
        out=None,
        what: str = "torchrun",
        group: bool = False,
    ):
        self.mesh, self.commands, self.out = mesh, commands, out
        self.what, self.group = what, group
        self.exit_codes: dict[str, int] = {}
        self._clients: dict[str, paramiko.SSHClient] = {}
        self._pids: dict[str, str] = {}
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._finished_at: float | None = None
        self._closed = False

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
        if self._closed:  # given up on (silent): closing its connection ended the read
            return
        self.exit_codes[name] = code
        if code == 0 and self._finished_at is None:
            self._finished_at = time.monotonic()
        self._print(name, ending(self.what, code))

    def wait(self, timeout: float | None = None) -> bool:
        """True once every node's command has exited. Joins in short slices so Ctrl-C lands."""
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
        """SIGTERM each node's command (its process group with group=True)."""
        for name, pid in self._pids.items():
            if name not in self.exit_codes:
                self._print(name, "stopping")
                # POSIX's form: dash's kill reads `-TERM -- -PID` as a bad number.
                target = f"-{int(pid)}" if self.group else str(int(pid))
                run(self._clients[name], f"kill -s TERM -- {target}", timeout=CONNECT_TIMEOUT)
        self.wait(STOP_GRACE_SECONDS)

    def close(self) -> None:
        self._closed = True
        for client in self._clients.values():
            client.close()


def new_run_id() -> str:
    return f"tp-mesh-{uuid.uuid4().hex[:8]}"
