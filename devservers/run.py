"""`devctl run`: a local working directory synced to every pod of a server, then torchrun on every
pod at once, all through the API server's exec (no kubectl, no SSH).

- Sync: the directory (--workdir, else the script's own, never a guess that could take in a
  home directory and its keys), less mesh.workdir's DEFAULT_EXCLUDES and --exclude, as one tar
  archive packed as tp-mesh packs it (refused over --max-size, naming what is big), extracted
  into ~/devctl/<its name> on every pod. Files there that the archive lacks stay: they may be
  what an earlier run wrote.
- Run: the pod's torchrun.sh (render.TORCHRUN) from that directory on every pod, in a process
  group of its own (setsid) whose id it leaves in a file, with unbuffered Python output. Every
  line of every pod is printed as it comes, prefixed with the pod: `[box-0] ...`.
- Stop: SIGINT or SIGTERM to devctl (Ctrl-C), or the first pod whose torchrun fails, sends
  SIGTERM to that group on every pod still running (torchrun then stops its workers, which it
  runs in sessions of their own): a failed node's peers would otherwise wait in their
  collectives until NCCL or gloo times out. devctl exits with that first failing pod's code
  (from the exec's status), or 128 + the signal's number when interrupted.
"""

import argparse
import queue
import secrets
import shlex
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from devservers.devctl import CliError, Devctl
from devservers.render import CONTAINER, SCRIPTS
from mesh.spec import MeshError
from mesh.workdir import DEFAULT_EXCLUDES, pack

REMOTE_DIR = "devctl"  # under the pod's home: ~/devctl/<the working directory's name>
POLL_SECONDS = 0.5
LOST = 255  # a pod whose command's exit status never came (as ssh's own failures)
# For the stops to reach every pod: STOP waits up to 10 s for the group's id, then up to 5 s for
# the group to end.
STOP_SECONDS = 20
# $1: the directory's name, $2: the archive's size. head reads exactly the archive, so tar ends
# without the end of stdin, which the exec websocket can signal only from protocol v5.
SYNC = 'mkdir -p "$HOME/devctl/$1" && head -c "$2" | tar -xof - -C "$HOME/devctl/$1"'
# $1: the directory's name, $2: the run's id, then torchrun.sh and its arguments.
LAUNCH = """cd "$HOME/devctl/$1" || exit 1
pidfile="$HOME/.devctl/run-$2.pid"
shift 2
mkdir -p "$HOME/.devctl"
PYTHONUNBUFFERED=1 setsid sh -c 'echo $$ > "$0"; exec "$@"' "$pidfile" "$@" &
wait $!
code=$?
rm -f "$pidfile"
exit $code
"""
# $1: the run's id. The group's id may not be written yet when a stop comes early; without one
# after 10 s, there is nothing to stop. A stop returns once the group has ended (torchrun passes
# SIGTERM to its workers and waits for them), or after 5 s.
STOP = """pidfile="$HOME/.devctl/run-$1.pid"
i=0
while [ ! -s "$pidfile" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
[ -s "$pidfile" ] || exit 0
group="$(cat "$pidfile")"
kill -TERM "-$group"
i=0
while kill -0 "-$group" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
"""


def _finish(process) -> tuple[int, bytes]:
    """Wait for a RemoteProcess: (its exit code, all it wrote)."""
    output = b""
    while (chunk := process.read(POLL_SECONDS)) is not None:
        output += chunk[0] + chunk[1]
    return process.exit_code(), output


def sync(devctl: Devctl, pod: str, name: str, data: bytes) -> None:
    command = ["sh", "-c", SYNC, "sync", name, str(len(data))]
    with devctl.allowed("exec into pods"):
        process = devctl.cluster.start(devctl.namespace, pod, CONTAINER, command, stdin=True)
    process.write(data)
    code, output = _finish(process)
    if code:
        raise CliError(f"syncing to {pod} failed ({code}): {output.decode(errors='replace')}")


class Lines:
    """Every pod's stdout and stderr, printed a whole line at a time with the pod's name first,
    and devctl's own notes on stderr."""

    def __init__(self, out, err):
        self.streams, self.partial, self.lock = (out, err), {}, threading.Lock()

    def write(self, pod: str, *data: bytes) -> None:
        for index, chunk in enumerate(data):
            *lines, rest = (self.partial.pop((pod, index), b"") + chunk).split(b"\n")
            if rest:
                self.partial[(pod, index)] = rest
            self._print(index, [f"[{pod}] {line.decode(errors='replace')}" for line in lines])

    def flush(self, pod: str) -> None:
        for index in range(len(self.streams)):
            rest = self.partial.pop((pod, index), None)
            if rest:
                self._print(index, [f"[{pod}] {rest.decode(errors='replace')}"])

    def say(self, text: str) -> None:
        self._print(1, [f"devctl: {text}"])

    def _print(self, index: int, lines: list[str]) -> None:
        with self.lock:
            for line in lines:
                print(line, file=self.streams[index])
            self.streams[index].flush()


def _stop(devctl: Devctl, pods: list[str], run_id: str, lines: Lines) -> list[threading.Thread]:
    """SIGTERM to the run's process group on each of `pods`, in the background: the threads
    doing it, which must be joined before devctl exits (daemon threads die with it, and a
    torchrun they had not reached yet would go on running)."""

    def stop(pod: str) -> None:
        command = ["sh", "-c", STOP, "stop", run_id]
        try:
            process = devctl.cluster.start(devctl.namespace, pod, CONTAINER, command)
            code, output = _finish(process)
        except OSError as e:
            code, output = LOST, str(e).encode()
        if code:
            lines.say(f"could not stop torchrun on {pod} ({code}): {output.decode().strip()}")

    threads = [threading.Thread(target=stop, args=(pod,), daemon=True) for pod in pods]
    for thread in threads:
        thread.start()
    return threads


def _joined(threads: list[threading.Thread]) -> None:
    deadline = time.monotonic() + STOP_SECONDS
    for thread in threads:
        thread.join(max(deadline - time.monotonic(), 0))


def launch(devctl: Devctl, pods: list[str], command: list[str], run_id: str) -> int:
    """`command` on every pod at once, streamed. Returns the code of the first pod to fail (the
    others stopped), else 128 + the number of a SIGINT or SIGTERM that stopped them all, else 0.
    A second signal returns at once, without waiting for the pods."""
    lines = Lines(devctl.out, sys.stderr)
    events: queue.Queue = queue.Queue()  # (pod, exit code), or (None, a signal's number)
    # From here a Ctrl-C is an event the loop below answers, not an exception that could land
    # between an exec's start and devctl knowing of it.
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, lambda number, _: events.put((None, number))) for s in signals}
    try:
        return _follow(devctl, pods, command, run_id, lines, events)
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def _follow(
    devctl: Devctl,
    pods: list[str],
    command: list[str],
    run_id: str,
    lines: Lines,
    events: queue.Queue,
) -> int:
    asked, started = [], {}
    try:
        with devctl.allowed("exec into pods"):
            for pod in pods:
                # Counted before the call: the exec may begin even when the call fails (STOP on
                # a pod where nothing began does nothing).
                asked.append(pod)
                started[pod] = devctl.cluster.start(devctl.namespace, pod, CONTAINER, command)
    except BaseException:  # an API error halfway: stop what may have started
        _joined(_stop(devctl, asked, run_id, lines))
        raise

    def follow(pod: str, process) -> None:
        try:
            while (chunk := process.read(POLL_SECONDS)) is not None:
                lines.write(pod, *chunk)
            code = process.exit_code()
        except OSError as e:
            lines.say(f"{pod}: {e}")
            code = LOST
        lines.flush(pod)
        events.put((pod, code))

    for pod, process in started.items():
        threading.Thread(target=follow, args=(pod, process), daemon=True).start()
    running, failure, interrupted, stopping = set(pods), None, None, []
    while running:
        try:
            pod, value = events.get(timeout=POLL_SECONDS)
        except queue.Empty:
            continue
        if pod is None:
            if interrupted is not None:
                lines.say("interrupted again: not waiting for the pods")
                return 128 + interrupted
            interrupted = value
            lines.say(f"stopping torchrun on {', '.join(sorted(running))}")
            stopping += _stop(devctl, sorted(running), run_id, lines)
            continue
        running.discard(pod)
        # What fails once the run is being stopped is the stop's doing, not a cause.
        if value and failure is None and interrupted is None:
            failure = value
            others = ", ".join(sorted(running)) or "no other pod"
            lines.say(f"torchrun on {pod} exited {value}: stopping it on {others}")
            stopping += _stop(devctl, sorted(running), run_id, lines)
    _joined(stopping)
    if failure is not None:
        return failure
    return 0 if interrupted is None else 128 + interrupted


def run(devctl: Devctl, args: argparse.Namespace) -> int:
    script = args.script
    if not script.is_file():
        raise CliError(f"no script {script}")
    directory = (args.workdir or script.parent).resolve()
    if not directory.is_dir():
        raise CliError(f"no directory {args.workdir}")
    if not script.resolve().is_relative_to(directory):
        raise CliError(f"{script} is not inside the working directory {directory}: see --workdir")
    try:
        tree = pack(directory, (*DEFAULT_EXCLUDES, *args.exclude), args.max_size, "--max-size")
    except MeshError as e:
        raise CliError(str(e)) from None
    pods = devctl.pods(devctl.server(args.name))
    name, where = directory.name, f"~/{REMOTE_DIR}/{directory.name}"
    torchrun = [
        f"{SCRIPTS}/torchrun.sh",
        script.resolve().relative_to(directory).as_posix(),
        *args.script_args,
        *args.passthrough,
    ]
    summary = f"{tree.summary()} from {directory} to {where} on {', '.join(pods)}"
    if args.dry_run:
        for relative in tree.entries:
            print(relative, file=devctl.out)
        print(f"would sync {summary}", file=devctl.out)
        for pod in pods:
            print(f"{pod}: cd {where} && {shlex.join(torchrun)}", file=devctl.out)
        return 0
    with ThreadPoolExecutor(len(pods)) as pool:
        list(pool.map(lambda pod: sync(devctl, pod, name, tree.data), pods))
    print(f"devctl: synced {summary}", file=sys.stderr)
    run_id = secrets.token_hex(6)
    return launch(devctl, pods, ["sh", "-c", LAUNCH, "launch", name, run_id, *torchrun], run_id)
