"""A job's local twin: the job's trainer arguments, or its own code, under torchrun on this CPU.

    python -m workloads.local smoke-cpu [--stack dev] [--nproc 2] [--steps 20] [--model small]
    python -m workloads.local cnn-example [--stack dev]     (a job's `code`: trainer.user_code)

Same trainer, same arguments as the PyTorchJob/MPIJob the stack declares; only the checkpoint
location (build/local-jobs/<job>), the step count, the worker count (CPU processes, gloo) and, when
asked, the model preset differ, so a job's configuration fails here before it costs GPU hours.
Ctrl-C or SIGTERM stops the workers the way a Spot interruption does: each finishes its step and
a checkpoint is written; `--resume` carries on from it.
"""

import argparse
import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from infra.core.paths import PROJECT_DIR
from infra.stack.loading import load_stack_for_command
from trainer.options import parse_options
from trainer.user_code import LOCAL_ENV as WORKER_ENV

LOCAL_JOBS = Path("build/local-jobs")
# Presets a 2-core CPU trains a few steps of in about a minute; larger ones take minutes a step.
CPU_MODELS = ("tiny", "small")


def with_option(args: list[str], option: str, value: str) -> list[str]:
    """Trainer arguments with `option` set to `value`, in place if the job sets it already."""
    if option in args:
        i = args.index(option)
        return [*args[: i + 1], value, *args[i + 2 :]]
    return [*args, option, value]


def local_command(job_args: list[str], nproc: int, steps: int, checkpoint: Path) -> list[str]:
    """torchrun over the trainer with the job's arguments, a local checkpoint dir and step count."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "trainer",
        *with_option(job_args, "--steps", str(steps)),
        "--checkpoint-dir",
        str(checkpoint),
    ]


def shown(command: list[str]) -> str:
    """The command as one line a user can paste: env, interpreter path relative to here."""
    python = os.path.relpath(command[0]) if command[0].startswith(os.getcwd()) else command[0]
    env = " ".join(f"{k}={v}" for k, v in WORKER_ENV.items())
    return f"{env} {shlex.join([python, *command[1:]])}"


def workers(pid: int) -> list[int]:
    """The worker processes torchrun started (Linux: /proc lists a process's children)."""
    children = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(c) for c in children.read_text().split()] if children.exists() else []


def run(command: list[str]) -> int:
    """Run torchrun; on SIGINT/SIGTERM stop its workers as a Spot interruption would.

    torchrun runs in its own session, so a terminal's Ctrl-C reaches only this process, which
    sends the workers SIGTERM: each finishes its step, saves a checkpoint and exits 0, and
    torchrun ends cleanly (signalled itself, it would print a traceback and exit 1).
    """
    process = subprocess.Popen(
        command,
        env={**os.environ, **WORKER_ENV},
        start_new_session=True,
        stdout=subprocess.PIPE,
        text=True,
    )

    def stop(signum, frame):
        print(f"\n{signal.Signals(signum).name}: stopping the workers at a checkpoint", flush=True)
        for pid in workers(process.pid):
            os.kill(pid, signal.SIGTERM)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    # On a terminal the trainer redraws a progress line on stderr ("\r[###...] step ..."); each
    # JSON event from stdout starts at column 0 of a cleared line, so it gets a line of its own.
    start = "\r\033[K" if sys.stderr.isatty() else ""
    try:
        for line in process.stdout:
            sys.stdout.write(start + line)
            sys.stdout.flush()
        return process.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m workloads.local", description=__doc__.splitlines()[0]
    )
    parser.add_argument("job", help="a job name from the stack's training-platform:jobs")
    parser.add_argument(
        "--stack",
        default="dev",
        help="stack name: reads Pulumi.<stack>.yaml (default: %(default)s)",
    )
    parser.add_argument(
        "--nproc", type=int, default=2, help="CPU worker processes (default: %(default)s)"
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=20,
        help="a short run; the job's own count is for GPUs (default: %(default)s)",
    )
    parser.add_argument(
        "--model",
        choices=CPU_MODELS,
        help="a smaller preset than the job's, for this CPU (default: the job's own --model)",
    )
    parser.add_argument(
        "--checkpoint-dir",
        type=Path,
        help="where the run checkpoints (default: build/local-jobs/<job>; a job's own code: "
        "its code, environments and folder under build/local-jobs)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="carry on from the previous local checkpoints (default: start afresh)",
    )
    return parser


def own_code(job, args: argparse.Namespace) -> int:
    """A job's `code` as `devctl submit --local` runs a folder: trainer.user_code over the
    folder's snapshot, its requirements in a cached environment (the pods get them built into
    their image), the job's folder in build/local-jobs/checkpoints/<job>."""
    from mesh.spec import MeshError
    from mesh.workdir import DEFAULT_EXCLUDES, DEFAULT_MAX_MB, pack
    from workloads.user_job import local_run

    store = args.checkpoint_dir or LOCAL_JOBS
    if not args.resume:
        shutil.rmtree(store / "checkpoints" / job.name, ignore_errors=True)
    folder = PROJECT_DIR / job.code.workdir
    try:
        archive = pack(folder, DEFAULT_EXCLUDES, DEFAULT_MAX_MB, "devctl submit --max-size")
    except MeshError as e:
        print(f"error: job {job.name}: {e}", file=sys.stderr)
        return 2
    command, variables, said = local_run(job.code, job.name, folder, archive, store, sys.executable)
    print(f"+ {job.name}: {said}; its own code, so --steps and --model do not apply", flush=True)
    sys.stdout.flush()
    os.execve(command[0], command, {**os.environ, **variables})


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    config = load_stack_for_command(args.stack)
    if config is None:
        return 2
    jobs = {j.name: j for j in config.jobs}
    if args.job not in jobs:
        print(
            f"error: no job {args.job!r} in Pulumi.{args.stack}.yaml; "
            f"allowed: {', '.join(jobs) or 'no jobs declared'}",
            file=sys.stderr,
        )
        return 2
    job = jobs[args.job]
    if job.code:
        return own_code(job, args)
    if job.command:
        print(
            f"error: job {args.job} runs its own command ({shlex.join(job.command)}) in "
            f"{job.image or 'the trainer image'}: run that image here (docker run), or give the "
            "job `code` (a folder of this repository) to rehearse it with make job-local",
            file=sys.stderr,
        )
        return 2
    job_args = list(job.args)
    model = args.model or parse_options(job_args).model
    if model not in CPU_MODELS:
        print(
            f"error: job {args.job} trains --model {model}, too big for a CPU run here; try its "
            f"configuration with a smaller preset:\n"
            f"  make job-local JOB={args.job} STACK={args.stack} STEPS={args.steps} MODEL=small\n"
            f"  .venv/bin/python -m workloads.local {args.job} --stack {args.stack} --model small",
            file=sys.stderr,
        )
        return 2
    checkpoint = args.checkpoint_dir or LOCAL_JOBS / args.job
    if not args.resume:
        shutil.rmtree(checkpoint, ignore_errors=True)
    job_args = with_option(job_args, "--model", model)
    command = local_command(job_args, args.nproc, args.steps, checkpoint)
    print("+ " + shown(command), flush=True)
    code = run(command)
    print(f"checkpoints: {checkpoint}/ (continue with --resume)", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
