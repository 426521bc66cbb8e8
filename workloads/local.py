"""A job's local twin: the job's own trainer arguments under torchrun on this machine's CPU.

    python -m workloads.local smoke-cpu [--stack dev] [--nproc 2] [--steps 20]

Same trainer, same arguments as the PyTorchJob/MPIJob the stack declares; only the checkpoint
location (build/local-jobs/<job>), the step count and the worker count (CPU processes, gloo) differ,
so a job's configuration fails here before it costs GPU hours.
"""

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from infra.config import ConfigError, load_stack_file
from workloads.manifests import trainer_args


def local_command(job, nproc: int, steps: int, checkpoint: Path) -> list[str]:
    args = [*trainer_args(job, str(checkpoint)), "--steps", str(steps)]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "trainer",
        *args,
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m workloads.local", description=__doc__.splitlines()[0]
    )
    parser.add_argument("job", help="a job name from the stack's training-platform:jobs")
    parser.add_argument("--stack", default="dev")
    parser.add_argument("--nproc", type=int, default=2, help="CPU worker processes")
    parser.add_argument(
        "--steps", type=int, default=20, help="a short run; the job's own count is for GPUs"
    )
    parser.add_argument("--resume", action="store_true", help="keep the previous local checkpoints")
    args = parser.parse_args(argv)
    try:
        config = load_stack_file(args.stack)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    jobs = {j.name: j for j in config.jobs}
    if args.job not in jobs:
        print(
            f"error: no job {args.job!r} in Pulumi.{args.stack}.yaml; "
            f"allowed: {', '.join(jobs) or 'no jobs declared'}",
            file=sys.stderr,
        )
        return 2
    checkpoint = Path("build/local-jobs") / args.job
    if not args.resume:
        shutil.rmtree(checkpoint, ignore_errors=True)
    command = local_command(jobs[args.job], args.nproc, args.steps, checkpoint)
    print("+ " + " ".join(command[1:]), flush=True)
    return subprocess.call(command, env={**os.environ, "OMP_NUM_THREADS": "1"})


if __name__ == "__main__":
    sys.exit(main())
