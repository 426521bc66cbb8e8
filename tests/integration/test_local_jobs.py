"""`make job-local`: a runnable echoed command, a stop that leaves a checkpoint, honest refusals."""

import json
import shlex
import signal
import subprocess
import sys
from pathlib import Path

from tests.plugin import ROOT


def local(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "workloads.local", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_model_too_big_for_cpu_is_refused_with_a_smaller_one_proposed():
    process = local("gpt-large-mpi")
    out, err = process.communicate(timeout=60)
    assert process.returncode == 2
    assert "job gpt-large-mpi trains --model gpt2-124m, too big for a CPU run here" in err
    assert "python -m workloads.local gpt-large-mpi --stack dev --model small" in err


def test_sigterm_stops_the_workers_with_a_checkpoint_and_the_echoed_command_runs(tmp_path):
    checkpoints = tmp_path / "smoke-cpu"
    process = local("smoke-cpu", "--steps", "100000", "--checkpoint-dir", str(checkpoints))
    echoed = process.stdout.readline()
    assert echoed.startswith("+ OMP_NUM_THREADS=1 ")
    env, python, *rest = shlex.split(echoed[2:])
    assert Path(ROOT, python).is_file() and rest[:2] == ["-m", "torch.distributed.run"]
    for line in process.stdout:  # wait for the first logged step, then interrupt
        if line.startswith("{") and '"loss"' in line:
            break
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err[-2000:]
    events = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    assert any(e.get("event") == "checkpoint" for e in events), out[-2000:]
    assert any((step / "COMMITTED").exists() for step in checkpoints.iterdir())
    assert "OMP_NUM_THREADS" not in err  # torchrun's warning when it is unset
    assert f"checkpoints: {checkpoints}/" in out
