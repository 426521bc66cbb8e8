"""Benchmark: your own code from `devctl submit` to its first training step, on the local API.

    .venv/bin/python -m tests.bench_submit [--runs 3]

The dev plan's team corner of a cluster (tests/team_cluster.py: RBAC, admission, the upstream
CRDs, the pools' runtimes; pods as local processes as the trainer's user), a member's kubeconfig,
and a one-step DDP script with one requirement from a local package index. Each run times:

- baseline: the script under plain torchrun on this machine, to its first step (what the
  script itself costs: torch's import, the process group);
- cold: `devctl submit` of a folder never sent (upload through a pod, job created), then its
  TrainJob's pod (made as the Trainer and JobSet make it) to the first step, building the
  dependency environment;
- warm: the same folder again (nothing sent, the environment reused);
- upload: `devctl submit` of a folder with 100 MB of data, to the job created.

It prints min/median/max of each, and warm minus baseline: what the platform adds to a
script's start once its code and environment are stored (the goal: at most 5 s).
"""

import argparse
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.plugin import plan_of
from tests.team_cluster import (
    TEAM,
    as_member,
    start_trainjob,
    team_cluster,
    trainer_account,
    wheel,
)
from workloads.tests.test_trainjob import ALICE

SCRIPT = """import torch, torch.distributed as dist, bench_helper
dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(bench_helper.SIDE, 1))
torch.nn.functional.mse_loss(model(torch.ones(4, bench_helper.SIDE)), torch.zeros(4, 1)).backward()
print("first step", flush=True)
dist.destroy_process_group()
"""
FIRST_STEP = "first step"


def project(root: Path, index: Path, data_mb: int = 0) -> Path:
    """A folder never sent before (a fresh token in it) with the script and its requirement."""
    folder = root / f"project-{secrets.token_hex(3)}"
    folder.mkdir()
    (folder / "train.py").write_text(f"# {secrets.token_hex(8)}\n{SCRIPT}")
    (folder / "requirements.txt").write_text(f"# {secrets.token_hex(8)}\nbench-helper==0.1\n")
    if data_mb:
        (folder / "data.bin").write_bytes(os.urandom(data_mb << 20))
    return folder


def submit(folder: Path, name: str, env: dict, *extra: str) -> float:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "devservers.cli", "submit", "--pool", "cpu", "--name", name,
         "--requirements", "requirements.txt", *extra, "--", "train.py"],
        cwd=folder, env={**os.environ, **env}, capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode:
        raise SystemExit(f"devctl submit failed: {done.stderr}")
    return time.monotonic() - started


def to_first_step(api, name: str) -> float:
    """From creating the job's pods to its first step printed."""
    trainjob = api.read("trainjobs", TEAM, name, group="trainer.kubeflow.org")
    runtime = api.read("clustertrainingruntimes", "", "torch-cpu", group="trainer.kubeflow.org")
    started = time.monotonic()
    (node,) = start_trainjob(api, trainjob, runtime)
    node.saw(FIRST_STEP, timeout=300)
    took = time.monotonic() - started
    node.wait()
    return took


def baseline(folder: Path, env: dict) -> float:
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1",
         "train.py"],
        cwd=folder, env={**os.environ, **env, "PYTHONPATH": str(env["SITE"])},
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    for line in process.stdout:
        if FIRST_STEP in line:
            took = time.monotonic() - started
            break
    process.wait()
    return took


def figures(values: list[float]) -> str:
    return (
        f"min {min(values):6.2f} s   median {statistics.median(values):6.2f} s   "
        f"max {max(values):6.2f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench_submit")
    parser.add_argument("--runs", type=int, default=3, help="runs of each (default: 3)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-submit-"))
    os.chmod(root, 0o755)
    index, site = root / "index", root / "site"
    index.mkdir()
    wheel(index, "bench_helper", "0.1", "SIDE = 16\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(index),
         "--target", str(site), "bench-helper==0.1"],
        check=True,
    )  # fmt: skip
    pip = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(index), "OMP_NUM_THREADS": "1"}
    pip_env = [a for k, v in pip.items() for a in ("--env", f"{k}={v}")]
    found = {
        "baseline": [],
        "cold": [],
        "  submit": [],
        "  pod to step": [],
        "warm": [],
        "  submit ": [],
        "  pod to step ": [],
        "upload 100 MB": [],
    }
    with team_cluster(plan_of("dev"), trainer_account()) as api:
        env = as_member(api, ALICE, root / "kubeconfig")
        for run in range(args.runs):
            folder = project(root, index)
            found["baseline"].append(baseline(folder, {**pip, "SITE": str(site)}))
            for what, suffix in (("cold", ""), ("warm", " ")):
                sent = submit(folder, f"{what}-{run}", env, *pip_env)
                started = to_first_step(api, f"{what}-{run}")
                found[what].append(sent + started)
                found[f"  submit{suffix}"].append(sent)
                found[f"  pod to step{suffix}"].append(started)
            big = project(root, index, data_mb=100)
            found["upload 100 MB"].append(submit(big, f"big-{run}", env, "--max-size", "200"))
            for pod in api.objects("pods", TEAM):
                api.call(api.delete, next(k for k in api.kinds.values() if k.plural == "pods"),
                         pod)  # fmt: skip
    print(f"devctl submit to the first step, {args.runs} runs ({os.cpu_count()} cores):")
    for what, values in found.items():
        print(f"  {what.rstrip():16} {figures(values)}")
    extra = [w - b for w, b in zip(found["warm"], found["baseline"], strict=True)]
    print(f"  {'warm - baseline':16} {figures(extra)}")


if __name__ == "__main__":
    main()
