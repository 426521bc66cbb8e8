"""The trainer on CPU with gloo: DDP/FSDP2 correctness, elastic resume, signals, crashes, S3."""

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from tests.moto_s3 import moto_server, s3_client
from tests.plugin import ROOT
from trainer.checkpoint import Checkpointer, LocalStore, step_name
from trainer.data import main as data_main
from trainer.data import open_splits, prepare
from trainer.launch import children
from trainer.model import GPT
from trainer.presets import PRESETS
from trainer.train import main as trainer_main
from trainer.train import wrap

FAST = [
    *("--global-batch", "8", "--micro-batch", "4", "--log-every", "5", "--checkpoint-every", "10"),
    *("--eval-samples", "8"),
]


def command(nproc: int, *args: str, max_restarts: int = 0) -> list[str]:
    """torchrun through trainer.launch (as in the pod) for several workers; python for one."""
    if nproc == 1:
        return [sys.executable, "-m", "trainer", *args]
    return [
        sys.executable,
        "-m",
        "trainer.launch",
        "--standalone",
        f"--nproc-per-node={nproc}",
        f"--max-restarts={max_restarts}",
        "-m",
        "trainer",
        *args,
    ]


def records(metrics: Path) -> list[dict]:
    return (
        [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    )


def train(tmp: Path, nproc: int, ckpt: str, *args: str, env: dict | None = None) -> list[dict]:
    """The metrics records of a successful run: several workers under torchrun, one in this
    process (train_here: no interpreter and torch to start)."""
    if nproc == 1:
        return train_here(tmp, ckpt, *args, env=env)
    return run(tmp, nproc, ckpt, *args, env=env)[0]


def run(
    tmp: Path,
    nproc: int,
    ckpt: str,
    *args: str,
    env: dict | None = None,
    metrics: Path | None = None,
):
    """(metrics records, stderr) of a successful run."""
    metrics = metrics or tmp / f"metrics-{time.monotonic_ns()}.jsonl"
    result = subprocess.run(
        command(nproc, *FAST, "--checkpoint-dir", ckpt, "--metrics", str(metrics), *args),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return records(metrics), result.stderr


def final_model(ckpt: Path) -> dict[str, torch.Tensor]:
    committed, _ = LocalStore(str(ckpt)).steps()
    out = ckpt.parent / f"{ckpt.name}-final.pt"
    dcp_to_torch_save(ckpt / step_name(committed[-1]), out)
    return torch.load(out, weights_only=False)["train"]["model"]


def event(recs: list[dict], name: str) -> dict:
    return next(r for r in recs if r.get("event") == name)


def test_two_worker_ddp_loss_falls_and_ranks_hold_identical_parameters(tmp_path, capsys):
    # 7 sequences over 2 workers: 4 and 3 of them, in micro-batches of 2 (two accumulation
    # steps), weighted so the gradient is the batch mean. A batch that divides, with no
    # accumulation, is the killed-worker tests' reference run.
    args = ["--steps", "30", "--eval-every", "10", "--global-batch", "7", "--micro-batch", "2"]
    recs = train(tmp_path, 2, str(tmp_path / "ckpt"), *args)
    losses = [r["loss"] for r in recs if "loss" in r]
    assert losses[-1] < losses[0] - 1.0, losses
    assert all(r["grad_norm"] > 0 for r in recs if "loss" in r)
    val = [r for r in recs if "val_loss" in r]
    assert [r["step"] for r in val] == [10, 20, 30] and val[-1]["val_loss"] < val[0]["val_loss"]
    done = event(recs, "done")
    assert done["step"] == 30 and done["samples"] == 30 * 7
    assert len(done["param_digests"]) == 2 and len(set(done["param_digests"])) == 1
    assert event(recs, "start")["accumulation"] == 2

    # Re-running a finished job (a torchrun restart, a resubmitted job) ends at once, with 0.
    capsys.readouterr()
    again = train(tmp_path, 1, str(tmp_path / "ckpt"), "--steps", "30")
    stderr = capsys.readouterr().err
    assert "the run is already complete" in stderr and "step-00000030" in stderr
    assert event(again, "complete")["step"] == 30 and not [r for r in again if "loss" in r]


# Both directions and both kinds of parallelism, in two cases to keep the suite short.
@pytest.mark.parametrize(("parallel", "first", "second"), [("ddp", 2, 1), ("fsdp", 1, 2)])
def test_resume_at_a_different_world_size(tmp_path, parallel, first, second):
    args = ["--parallel", parallel, "--checkpoint-every", "5"]
    reference = tmp_path / "reference"
    train(tmp_path, first, str(reference), "--steps", "10", *args)
    # The reference run's step-5 checkpoint, as a run stopped there would have left it.
    resized = tmp_path / "resized"
    shutil.copytree(reference / step_name(5), resized / step_name(5))
    recs = train(tmp_path, second, str(resized), "--steps", "10", *args)
    start = event(recs, "start")
    assert (start["world_size"], start["resumed_from"], start["samples"]) == (second, 5, 40)
    # The global batch is fixed, so accumulation makes up for the missing (or extra) workers.
    assert start["accumulation"] == 2 // second
    a, b = final_model(reference), final_model(resized)
    # Same samples, same schedule; only the order of floating-point sums differs.
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=2e-4, rtol=1e-3)


def wait_for_step(
    metrics: Path, step: int, process: subprocess.Popen, timeout: float = 120
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(r.get("step", 0) >= step and "loss" in r for r in records(metrics)):
            return
        assert process.poll() is None, "trainer ended before the step was reached"
        time.sleep(0.01)
    raise TimeoutError(f"step {step} not reached")


def test_sigterm_saves_a_checkpoint_and_exits_then_resumes(tmp_path):
    ckpt, metrics = tmp_path / "ckpt", tmp_path / "metrics.jsonl"
    args = ["--steps", "100000", "--log-every", "1", "--checkpoint-every", "100000"]
    process = subprocess.Popen(
        command(2, *FAST, *args, "--checkpoint-dir", str(ckpt), "--metrics", str(metrics)),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for_step(metrics, 5, process)
    process.send_signal(signal.SIGTERM)  # what the kubelet sends PID 1 of the pod
    assert process.wait(timeout=60) == 0
    stopped = event(records(metrics), "stopped")
    committed, uncommitted = LocalStore(str(ckpt)).steps()
    assert committed == [stopped["step"]] and not uncommitted
    resumed = train(tmp_path, 1, str(ckpt), "--steps", str(stopped["step"] + 5))
    assert event(resumed, "start")["resumed_from"] == stopped["step"]
    assert event(resumed, "done")["step"] == stopped["step"] + 5


# The kill comes after step 14: the 36 steps left (seconds) are the margin for a test process
# that the machine starves meanwhile.
KILL_ARGS = ["--steps", "50", "--log-every", "1"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The run the killed runs must reproduce, bit for bit."""
    tmp = tmp_path_factory.mktemp("reference")
    return event(train(tmp, 2, str(tmp / "ckpt"), *KILL_ARGS), "done")


@pytest.mark.parametrize(
    "saving", [["--checkpoint-every", "10"], ["--checkpoint-every", "3", "--async-save"]]
)
def test_killed_worker_restarts_and_finishes_with_the_same_parameters(
    tmp_path, uninterrupted, saving
):
    # The async case saves every 3 steps, so saves overlap DDP's all-reduces and stop checks.
    ckpt, metrics = tmp_path / "ckpt", tmp_path / "metrics.jsonl"
    process = subprocess.Popen(
        command(
            2,
            *FAST,
            *KILL_ARGS,
            *saving,
            "--checkpoint-dir",
            str(ckpt),
            "--metrics",
            str(metrics),
            max_restarts=1,
        ),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "torchrun.log").open("w"),
    )
    wait_for_step(metrics, 14, process)
    (torchrun,) = children(process.pid)  # trainer.launch's one child
    workers = children(torchrun)
    assert len(workers) == 2
    # What the trainer guarantees: it resumes from the newest checkpoint committed when the
    # worker died, or from one whose save was already under way then and committed after (an
    # async save commits once every rank has written; rank 0 may still commit after rank 1 dies).
    committed_before = LocalStore(str(ckpt)).steps()[0]
    os.kill(workers[1], signal.SIGKILL)
    reached = max(r["step"] for r in records(metrics) if "loss" in r)
    assert process.wait(timeout=180) == 0, (tmp_path / "torchrun.log").read_text()[-3000:]
    starts = [r for r in records(metrics) if r.get("event") == "start"]
    every = int(saving[1])
    assert starts[0]["resumed_from"] is None and len(starts) == 2
    resumed = starts[1]["resumed_from"]
    assert committed_before, "no checkpoint committed by step 14"
    assert max(committed_before) <= resumed <= reached and resumed % every == 0, (
        committed_before,
        resumed,
        reached,
    )
    # Both ranks of the reference hold the same parameters, and the killed run ends on them.
    assert len(set(uninterrupted["param_digests"])) == 1
    assert event(records(metrics), "done")["param_digests"] == uninterrupted["param_digests"]


class FailingStore(LocalStore):
    """A store whose writer dies halfway through a save, like a node lost mid-checkpoint."""

    fail = False

    def writer(self, step):
        writer = super().writer(step)
        if self.fail:

            def write_data(plan, planner):
                (self.root / step_name(step) / "partial.distcp").write_bytes(b"torn")
                raise OSError("disk vanished")

            writer.write_data = write_data
        return writer


@pytest.fixture
def process_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_crash_during_save_leaves_the_previous_checkpoint_loadable(tmp_path, process_group):
    store = FailingStore(str(tmp_path))
    checkpointer = Checkpointer(store, keep_last=2)
    checkpointer.save({"w": torch.arange(4.0)}, step=1)
    store.fail = True
    with pytest.raises(CheckpointException, match="disk vanished"):
        checkpointer.save({"w": torch.full((4,), 9.0)}, step=2)
    assert store.steps() == ([1], [2])
    assert checkpointer.latest() == 1
    state = {"w": torch.zeros(4)}
    checkpointer.load(state, 1)
    assert torch.equal(state["w"], torch.arange(4.0))
    store.fail = False
    checkpointer.save({"w": torch.ones(4)}, step=3)
    assert store.steps() == ([1, 3], [])  # the torn save is cleaned away once a newer one commits


def test_retention_keeps_the_last_n(tmp_path, process_group):
    checkpointer = Checkpointer(LocalStore(str(tmp_path)), keep_last=2)
    for step in range(1, 6):
        checkpointer.save({"w": torch.tensor([float(step)])}, step)
    assert LocalStore(str(tmp_path)).steps() == ([4, 5], [])


def test_async_save_commits_as_soon_as_written(tmp_path, process_group):
    store = LocalStore(str(tmp_path))
    checkpointer = Checkpointer(store, keep_last=3, async_save=True)
    checkpointer.save({"w": torch.ones(1000)}, step=1)
    deadline = time.monotonic() + 30
    while store.steps() != ([1], []):  # no wait() and no next save: the commit comes by itself
        assert time.monotonic() < deadline, store.steps()
        time.sleep(0.01)
    checkpointer.wait()
    state = {"w": torch.zeros(1000)}
    checkpointer.load(state, 1)
    assert torch.equal(state["w"], torch.ones(1000))


@pytest.fixture
def moto():
    with moto_server() as env:
        yield env


def test_s3_checkpoints_save_resume_and_prune(tmp_path, moto, capsys):
    s3 = s3_client(moto)
    s3.create_bucket(Bucket="ckpts")
    uri = "s3://ckpts/runs/tiny"
    train(
        tmp_path,
        1,
        uri,
        "--steps",
        "4",
        "--checkpoint-every",
        "2",
        "--keep-last",
        "1",
        env=moto,
    )
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="ckpts")["Contents"]]
    assert "runs/tiny/step-00000004/COMMITTED" in keys
    assert not any(k.startswith("runs/tiny/step-00000002/") for k in keys)  # pruned
    assert any(k.endswith(".distcp") for k in keys)
    resumed = train(tmp_path, 1, uri, "--steps", "6", "--checkpoint-every", "2", env=moto)
    assert event(resumed, "start")["resumed_from"] == 4
    assert event(resumed, "done")["step"] == 6

    # A committed checkpoint torn after the fact is named, moved aside (kept) and skipped.
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="ckpts")["Contents"]]
    shard = next(k for k in keys if k.startswith("runs/tiny/step-00000006/") and "distcp" in k)
    body = s3.get_object(Bucket="ckpts", Key=shard)["Body"].read()
    s3.put_object(Bucket="ckpts", Key=shard, Body=body[:100])
    capsys.readouterr()
    recs = train(tmp_path, 1, uri, "--steps", "8", "--checkpoint-every", "2", env=moto)
    stderr = capsys.readouterr().err
    assert f"checkpoint {uri}/step-00000006 is unreadable" in stderr
    assert event(recs, "start")["resumed_from"] == 4
    assert event(recs, "done")["step"] == 8
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="ckpts")["Contents"]]
    aside = s3.get_object(Bucket="ckpts", Key=shard.replace("step-", "unreadable-step-", 1))
    assert aside["Body"].read() == body[:100]  # moved as it was, while step 6 was saved anew


@pytest.mark.parametrize(
    "args, reason",
    [
        (["--model", "huge"], "--model 'huge'; allowed: tiny, small, gpt2-124m"),
        (["--data", "/nonexistent.bin"], "--data /nonexistent.bin: no such file"),
    ],
    ids=["option", "data"],
)
def test_bad_input_under_the_launcher_exits_2_once_without_restarts(tmp_path, args, reason):
    result = subprocess.run(
        command(2, *args, "--checkpoint-dir", str(tmp_path), max_restarts=3),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    # Said once by rank 0, in the first worker group: no restart, no torchrun traceback.
    assert result.stderr.count(f"python -m trainer: error: {reason}") == 1, result.stderr
    assert "Traceback" not in result.stderr and "ChildFailedError" not in result.stderr


def test_ranks_come_from_openmpi_under_mpirun_and_the_metrics_folder_is_made(tmp_path):
    env = {
        "OMPI_COMM_WORLD_RANK": "0",
        "OMPI_COMM_WORLD_SIZE": "1",
        "OMPI_COMM_WORLD_LOCAL_RANK": "0",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
    }
    metrics = tmp_path / "not" / "yet" / "metrics.jsonl"
    recs, _ = run(tmp_path, 1, str(tmp_path / "ckpt"), "--steps", "2", env=env, metrics=metrics)
    assert event(recs, "start")["world_size"] == 1 and event(recs, "done")["step"] == 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_data_prepare_and_sample_addressing(tmp_path, capsys):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("hello world " * 50)
    (corpus / "b.md").write_text("more text " * 50)
    (corpus / "skip.bin").write_bytes(b"\x00" * 10)
    assert data_main(["--input", str(corpus), "--out", str(tmp_path / "t.bin")]) == 0
    assert "from 2 files" in capsys.readouterr().out
    data, held_out = open_splits(tmp_path / "t.bin", seq_len=16)
    assert len(data.tokens) + len(held_out.tokens) == (tmp_path / "t.bin").stat().st_size
    x, y = data.batch([0, 1, 2])
    assert x.shape == (3, 16) and torch.equal(x[:, 1:], y[:, :-1])
    # Every window is visited once per pass, whatever the order.
    starts = {(i * data.stride) % data.windows for i in range(data.windows)}
    assert len(starts) == data.windows
    assert data_main(["--input", str(tmp_path / "missing")]) == 2


def test_prepare_refuses_an_empty_corpus(tmp_path):
    with pytest.raises(ValueError, match="no text files"):
        prepare([], tmp_path / "t.bin")


def test_concurrent_first_preparation_of_the_default_corpus(tmp_path):
    """Fresh clone, several workers: all prepare the corpus at once and all get a whole file."""
    out = tmp_path / "stdlib.bin"
    script = (
        "import sys; from pathlib import Path; from trainer.data import ensure_default_tokens; "
        "print(Path(ensure_default_tokens(Path(sys.argv[1]))).stat().st_size)"
    )
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(out)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    results = [w.communicate(timeout=120) for w in workers]
    assert [w.returncode for w in workers] == [0] * 4, [err for _, err in results]
    assert len({out for out, _ in results}) == 1
    assert not list(tmp_path.glob(".*.tmp"))


@contextlib.contextmanager
def one_process(env: dict | None = None):
    """`python -m trainer` inside pytest: a group of one, with `env`; the environment and the
    signal handlers put back afterwards."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in {
            "RANK": "0",
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(_free_port()),
            **(env or {}),
        }.items():
            patch.setenv(name, value)
        handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)


@pytest.fixture
def in_process():
    with one_process():
        yield


def train_here(tmp: Path, ckpt: str, *args: str, env: dict | None = None) -> list[dict]:
    """The metrics records of a successful one-worker run in this process (no interpreter and
    torch to start)."""
    metrics = tmp / f"metrics-{time.monotonic_ns()}.jsonl"
    with one_process(env):
        status = trainer_main([*FAST, "--checkpoint-dir", ckpt, "--metrics", str(metrics), *args])
    assert status == 0
    return records(metrics)


def trainer_exit(capsys, *args: str) -> tuple[int, str]:
    """(exit status, stderr) of the trainer's command line run in this process."""
    try:
        status = trainer_main([*FAST, *args])
    except SystemExit as e:
        status = e.code
    return status, capsys.readouterr().err


def write_tokens(path: Path, count: int) -> str:
    path.write_bytes(bytes(i % 251 for i in range(count)))
    return str(path)


BAD_INPUTS = {
    "negative threads": (["--threads", "-1"], "--threads -1; allowed: a finite number >= 0"),
    "negative lr": (["--lr", "-0.1"], "--lr -0.1; allowed: a finite number > 0"),
    "nan lr": (["--lr", "nan"], "--lr nan; allowed: a finite number > 0"),
    "negative weight decay": (
        ["--weight-decay", "-1"],
        "--weight-decay -1.0; allowed: a finite number >= 0",
    ),
    "negative warmup": (["--warmup", "-5"], "--warmup -5; allowed: a finite number >= 0"),
    "zero eval samples": (["--eval-samples", "0"], "--eval-samples must be at least 1"),
    "missing data": (["--data", "{tmp}/none.bin"], "none.bin: no such file"),
    "empty data": (["--data", "{empty}"], "has 0 tokens; this model (sequence length 128)"),
    "too-short data": (["--data", "{short}"], "has 1000 tokens; this model"),
    "file as checkpoint dir": (
        ["--checkpoint-dir", "{empty}/ckpt"],
        "cannot write there (Not a directory",
    ),
    "unwritable checkpoint dir": (
        ["--checkpoint-dir", "/sys/trainer-ckpt"],
        "--checkpoint-dir /sys/trainer-ckpt: cannot write there (Operation not permitted",
    ),
    "read-only checkpoint dir": (
        ["--checkpoint-dir", "/sys"],
        "--checkpoint-dir /sys: cannot write there (Permission denied",
    ),
}


@pytest.mark.parametrize("case", BAD_INPUTS, ids=list(BAD_INPUTS))
def test_bad_input_is_one_line_and_exit_2_before_any_step(tmp_path, capsys, in_process, case):
    args, expected = BAD_INPUTS[case]
    paths = {
        "tmp": tmp_path,
        "empty": write_tokens(tmp_path / "empty.bin", 0),
        "short": write_tokens(tmp_path / "short.bin", 1000),
    }
    metrics = tmp_path / "metrics.jsonl"
    args = [a.format(**paths) for a in args]
    defaults = ["--checkpoint-dir", str(tmp_path / "ckpt"), "--metrics", str(metrics)]
    status, stderr = trainer_exit(capsys, *defaults, *args)
    assert status == 2
    assert expected in stderr and "Traceback" not in stderr, stderr
    assert [line for line in stderr.splitlines() if "error" in line] == [stderr.splitlines()[-1]]
    assert not [r for r in records(metrics) if "loss" in r]


def test_resuming_with_another_model_size_names_the_checkpoint_and_model(
    tmp_path, capsys, in_process
):
    ckpt = str(tmp_path / "ckpt")
    assert trainer_exit(capsys, "--steps", "2", "--checkpoint-dir", ckpt)[0] == 0
    status, stderr = trainer_exit(
        capsys, "--steps", "4", "--model", "small", "--checkpoint-dir", ckpt
    )
    assert status == 2 and "Traceback" not in stderr
    assert f"checkpoint {ckpt}/step-00000002 does not fit this model" in stderr
    assert "(this run: --model small)" in stderr
    assert LocalStore(ckpt).steps() == ([2], [])  # the checkpoint is untouched


def test_corrupt_newest_checkpoint_is_named_set_aside_and_the_previous_one_used(
    tmp_path, capsys, in_process
):
    every = ["--checkpoint-every", "2", "--keep-last", "5"]
    reference = str(tmp_path / "reference")
    assert trainer_exit(capsys, "--steps", "6", *every, "--checkpoint-dir", reference)[0] == 0
    ckpt = tmp_path / "ckpt"
    assert trainer_exit(capsys, "--steps", "4", *every, "--checkpoint-dir", str(ckpt))[0] == 0
    shard = next((ckpt / step_name(4)).glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:100])  # a torn write that was committed anyway

    metrics = tmp_path / "metrics.jsonl"
    status, stderr = trainer_exit(
        capsys, "--steps", "6", *every, "--checkpoint-dir", str(ckpt), "--metrics", str(metrics)
    )
    assert status == 0, stderr
    assert f"checkpoint {ckpt}/step-00000004 is unreadable" in stderr
    start = event(records(metrics), "start")
    assert start["resumed_from"] == 2 and start["unreadable"] == [f"{ckpt}/step-00000004"]
    assert (ckpt / "unreadable-step-00000004" / shard.name).exists()  # kept, out of the way
    assert LocalStore(str(ckpt)).steps() == ([2, 4, 6], [])
    a, b = final_model(tmp_path / "reference"), final_model(ckpt)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_optimizer_decays_only_linear_weights():
    model = GPT(PRESETS["tiny"])
    decayed, kept = model.parameter_groups(0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    assert decayed["weight_decay"] == 0.1 and kept["weight_decay"] == 0.0
    assert all(names[id(p)].endswith("weight") for p in decayed["params"])
    assert not [
        n for p in decayed["params"] if any(k in (n := names[id(p)]) for k in ("ln", "emb"))
    ]
    assert {"tok_emb.weight", "pos_emb.weight", "ln_f.weight", "blocks.0.qkv.bias"} <= {
        names[id(p)] for p in kept["params"]
    }
    assert len(decayed["params"]) + len(kept["params"]) == len(names)


def test_compile_happens_inside_ddp_so_no_sync_still_applies(process_group):
    from torch._dynamo.eval_frame import OptimizedModule
    from torch.nn.parallel import DistributedDataParallel

    model = wrap(GPT(PRESETS["tiny"]), "ddp", 2, torch.device("cpu"), compile=True, bf16=False)
    assert isinstance(model, DistributedDataParallel)
    assert all(isinstance(block, OptimizedModule) for block in model.module.blocks)


def test_fsdp_casts_parameters_and_reduces_gradients_in_bf16_on_gpus(process_group):
    model = wrap(GPT(PRESETS["tiny"]), "fsdp", 1, torch.device("cpu"), compile=False, bf16=True)
    for module in (model, *model.blocks):
        policy = module._get_fsdp_state()._mp_policy
        assert policy.param_dtype == policy.reduce_dtype == torch.bfloat16


def test_progress_bar_line_ends_before_an_event_is_printed(monkeypatch, capsys):
    import io

    from trainer.train import Logger

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    logger = Logger(rank=0, path="", total_steps=10)
    logger.log({"step": 5, "loss": 2.5, "tokens_per_s": 1000.0})
    logger.log({"step": 5, "val_loss": 2.4})
    logger.log({"step": 10, "loss": 2.1, "tokens_per_s": 1000.0})
    assert terminal.getvalue().count("\n") == 1 and terminal.getvalue().endswith("tok/s")
    assert json.loads(capsys.readouterr().out) == {"step": 5, "val_loss": 2.4}


def test_gradients_cross_ranks_only_on_the_last_micro_step(process_group):
    from trainer.train import gradient_sync

    cpu = torch.device("cpu")
    ddp = wrap(GPT(PRESETS["tiny"]), "ddp", 2, cpu, compile=False, bf16=False)
    with gradient_sync(ddp, last=False):
        assert not ddp.require_backward_grad_sync
    with gradient_sync(ddp, last=True):
        assert ddp.require_backward_grad_sync

    fsdp = wrap(GPT(PRESETS["tiny"]), "fsdp", 1, cpu, compile=False, bf16=False)
    groups = [g for m in (fsdp, *fsdp.blocks) for g in m._get_fsdp_state()._fsdp_param_groups]
    for last in (False, True):
        with gradient_sync(fsdp, last=last):
            assert all(g.reduce_grads is last for g in groups)


def test_mfu_is_the_models_flops_over_the_gpus_peak_in_the_log_and_its_scalar(
    tmp_path, monkeypatch
):
    """On a GPU whose peak the trainer knows, each logged window's MFU is the model's training
    FLOPs per second over the peak of all its GPUs, in the JSON line and as TensorBoard's
    throughput/mfu. Here the run's device calls itself a GPU of a given peak (1e11 FLOP/s, so
    that a CPU run's MFU is not rounded away)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from trainer import train
    from trainer.scalars import TAGS

    assert train.peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert (train.peak_flops("NVIDIA L40S"), train.peak_flops("NVIDIA L4")) == (362e12, 121e12)
    assert train.peak_flops("") is None  # a CPU: no MFU
    assert train.mfu(1e9, 2000.0, 1e12, world=8) == 0.25  # 2e12 FLOP/s of 8e12
    monkeypatch.setitem(train.PEAK_FLOPS, "Test T1", 1e11)
    monkeypatch.setattr(train, "device_name", lambda device: "ACME Test T1 16GB")
    ckpt = tmp_path / "ckpt"
    recs = train_here(tmp_path, str(ckpt), "--steps", "10", "--threads", "1")
    logged = [r for r in recs if "mfu" in r]
    assert [r["step"] for r in logged] == [5, 10]
    flops = PRESETS["tiny"].flops_per_token()  # the trainer's default model, on one process
    for record in logged:
        assert record["mfu"] == round(flops * record["tokens_per_s"] / 1e11, 4) > 0
    shown = EventAccumulator(str(ckpt / "tensorboard")).Reload().Scalars(TAGS["mfu"])
    assert [(s.step, s.value) for s in shown] == [
        (r["step"], pytest.approx(r["mfu"], rel=1e-6)) for r in logged
    ]
