"""torchrun for a pod's PID 1: SIGTERM and SIGINT go to the workers, never to torchrun.

    python -m trainer.launch --nproc-per-node 2 -m trainer --steps 200   # torchrun's arguments

torchrun answers a SIGTERM by signalling its workers and then exiting 1 with a traceback, however
cleanly they stopped. Started through this module, torchrun (in a session of its own, so a
terminal's Ctrl-C does not reach it either) never sees the signal: its workers do, save a
checkpoint and exit 0, torchrun sees a successful group and exits 0, and so does the pod.

Bad input (a missing data file, an unwritable checkpoint dir, a checkpoint of another model) ends
the run with the trainer's one line and exit 2, at once: torchrun would otherwise restart the
workers into the same error until `--max-restarts` ran out, then exit 1 with a traceback.
"""

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# A worker that stops on bad input writes its message to the file this names and waits, so the
# launcher can stop torchrun before it restarts the group into an error no restart can fix, and
# print the message itself.
INPUT_ERROR_FILE = "TRAINER_INPUT_ERROR_FILE"


def children(pid: int) -> list[int]:
    """Processes whose parent is `pid` (torchrun's workers), from /proc."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if parent == pid:
            found.append(int(stat.parent.name))
    return found


def signal_each(pids, signum: int) -> None:
    """Send `signum` to each process that still exists."""
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass  # it exited meanwhile


def parser() -> argparse.ArgumentParser:
    """Only for --help: every argument goes to torchrun as given."""
    return argparse.ArgumentParser(
        prog="python -m trainer.launch",
        usage="%(prog)s [torchrun's options] -m trainer|SCRIPT|-m MODULE [its options]",
        description="torchrun, with SIGTERM and SIGINT going to the workers (they save a "
        "checkpoint and exit 0, and so does the launcher) and bad input ending the run at once "
        "with the trainer's one line and exit 2, not restarted until --max-restarts runs out.",
        epilog="Its arguments go to torchrun as given: `.venv/bin/torchrun --help` lists "
        "torchrun's, `.venv/bin/python -m trainer --help` the trainer's.",
    )


# torchrun's options that take no value (torch/distributed/run.py); every other option takes one,
# as `--x=value` or `--x value`.
FLAGS = {"-h", "--help", "--standalone", "--no-python", "--no_python", "--run-path", "--run_path"}


def _entry_index(launch: list[str]) -> int:
    """Where the program torchrun runs starts in its arguments: `-m` or the script (the first
    argument that is neither an option nor an option's value); len(launch) when there is none."""
    i = 0
    while i < len(launch) and launch[i] != "-m" and launch[i].startswith("-"):
        i += 1 if (launch[i] in FLAGS or "=" in launch[i]) else 2
    return min(i, len(launch))


def entry_point(launch: list[str]) -> tuple[str, str] | None:
    """("script", path) or ("module", name) that torchrun would run, from its arguments."""
    i = _entry_index(launch)
    if i == len(launch):
        return None
    if launch[i] == "-m":
        return ("module", launch[i + 1]) if i + 1 < len(launch) else None
    return "script", launch[i]


def asks_for_help(args: list[str]) -> bool:
    """-h or --help among the launcher's own arguments, before the script or module torchrun
    runs (after it, they are the program's)."""
    return bool({"-h", "--help"} & set(args[: _entry_index(args)]))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if asks_for_help(args):
        parser().print_help()
        return 0
    with tempfile.TemporaryDirectory(prefix="trainer-launch-") as tmp:
        input_error = Path(tmp) / "input-error"
        torchrun = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", *args],
            start_new_session=True,
            env={**os.environ, INPUT_ERROR_FILE: str(input_error)},
        )

        def forward(signum, frame):
            # Between worker groups (a restart under way) there is nobody to tell but torchrun.
            signal_each(children(torchrun.pid) or [torchrun.pid], signum)

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, forward)
        while (status := torchrun.poll()) is None:
            if input_error.exists():
                # The workers wait for this; torchrun goes first, so it cannot start another
                # group.
                signal_each([torchrun.pid, *children(torchrun.pid)], signal.SIGKILL)
                torchrun.wait()
                print(input_error.read_text(), file=sys.stderr, flush=True)
                return 2
            time.sleep(0.1)
        return status


if __name__ == "__main__":
    sys.exit(main())
