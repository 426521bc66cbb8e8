"""Benchmark (not a test): the trainer against a bare PyTorch loop, and what saving costs.

    python -m trainer.bench [--presets tiny small] [--pairs 5]

Every figure is the median over interleaved pairs of runs (A then B, B then A, ...), each run a
fresh process: on a shared machine one run swings by 10 % or more, and interleaving spreads the
drift over both sides. A run's throughput is the median of its timing windows (equal numbers of
steps, the first window left out as warm-up), the same statistic for the bare loop and the
trainer, so a burst of other work during one window moves neither side. Figures and targets:
  - trainer vs an independent bare loop, per preset, 1 and 2 threads (>= 0.97)
  - trainer at its default batch, 2 processes x 1 thread vs 1 process x 2 threads (>= 0.95; on a
    2-core CPU this measures DDP's overhead, not scaling)
  - with 2 workers while training: the time the loop is blocked by async saves, including every
    wait for a write still under way, vs the same saves done synchronously (<= 25%); a run ends
    with a save that nothing can hide, so the run saves often enough that the saves between are
    what the figure measures, as they are in a long run
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from trainer.data import ensure_default_tokens
from trainer.options import TrainConfig
from trainer.presets import PRESETS

# Sequences per step, steps per timing window and timed windows per run (one more window warms
# up): each window long enough to time, each run a few seconds on 2 cores.
RUN = {"tiny": (8, 10, 6), "small": (4, 2, 5), "gpt2-124m": (1, 1, 3)}


class BareBlock(nn.Module):
    """nanoGPT's block, written here on purpose: a reference that shared the trainer's model code
    could not show what that code costs."""

    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn, self.attn_out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.fc_out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.attn(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)
        x = x + self.attn_out(y.reshape(b, t, d))
        return x + self.fc_out(F.gelu(self.fc(self.ln2(x))))


def bare_loop(preset: str, threads: int, batch: int, window: int, windows: int) -> float:
    """The median tokens/s of the timing windows after the first, of the least a training step
    can be: batch, forward, backward, clip, AdamW (fused, like the trainer's)."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    c = PRESETS[preset]
    wte, wpe = nn.Embedding(c.vocab_size, c.d_model), nn.Embedding(c.seq_len, c.d_model)
    blocks = nn.Sequential(*(BareBlock(c.d_model, c.n_head) for _ in range(c.n_layer)))
    ln_f = nn.LayerNorm(c.d_model)
    model = nn.ModuleList([wte, wpe, blocks, ln_f])
    for module in model.modules():  # nanoGPT's initialisation
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear):
            nn.init.zeros_(module.bias)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), fused=True)
    data = np.memmap(ensure_default_tokens(), dtype=np.uint8, mode="r")
    rates = []
    start = time.perf_counter()
    for step in range(1, (windows + 1) * window + 1):
        ix = torch.randint(len(data) - c.seq_len - 1, (batch,)).tolist()
        rows = torch.from_numpy(
            np.stack([data[i : i + c.seq_len + 1] for i in ix]).astype(np.int64)
        )
        x, y = rows[:, :-1], rows[:, 1:]
        h = ln_f(blocks(wte(x) + wpe(torch.arange(c.seq_len))))
        loss = F.cross_entropy((h @ wte.weight.T).flatten(0, 1), y.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % window == 0:
            now = time.perf_counter()
            rates.append(window * batch * c.seq_len / (now - start))
            start = now
    return statistics.median(rates[1:])


def run_bare(preset: str, threads: int) -> float:
    out = subprocess.run(
        [sys.executable, "-m", "trainer.bench", "--bare", preset, str(threads)],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": str(threads)},
    )
    return float(out.stdout)


def run_trainer(
    preset: str,
    nproc: int,
    threads: int,
    *extra: str,
    run: tuple[int, int, int] | None = None,
    micro_batch: int | None = None,
    steps: int | None = None,
) -> list[dict]:
    """The trainer's metrics records for one run on the default corpus: by default the bare
    loop's batch, steps and timing windows, the batch split evenly over the workers."""
    batch, window, windows = run or RUN[preset]
    with tempfile.TemporaryDirectory() as tmp:
        metrics = Path(tmp) / "metrics.jsonl"
        args = [
            *("--model", preset, "--steps", str(steps or (windows + 1) * window)),
            *("--global-batch", str(batch)),
            *("--micro-batch", str(micro_batch or max(1, batch // nproc))),
            *("--threads", str(threads), "--log-every", str(window)),
            *("--checkpoint-dir", f"{tmp}/ckpt"),
            *("--metrics", str(metrics), "--eval-every", str(10**9), "--eval-samples", "1"),
            *("--checkpoint-every", str(10**9)),
            *extra,
        ]
        launcher = [
            sys.executable,
            "-m",
            "trainer.launch",
            "--standalone",
            f"--nproc-per-node={nproc}",
        ]
        subprocess.run(
            [*(launcher if nproc > 1 else [sys.executable]), "-m", "trainer", *args],
            check=True,
            capture_output=True,
            env={**os.environ, "OMP_NUM_THREADS": str(threads)},
        )
        return [json.loads(line) for line in metrics.read_text().splitlines()]


def steady_tokens_per_s(recs: list[dict]) -> float:
    """The median of the trainer's logging windows after the first (which warms up)."""
    return statistics.median([r["tokens_per_s"] for r in recs if "tokens_per_s" in r][1:])


def blocked_seconds(recs: list[dict]) -> float:
    """Time saves kept the loop from training: every save call (which first waits for the
    previous async write) plus the wait for the last write at the end."""
    saves = sum(r["blocked_s"] for r in recs if r.get("event") == "checkpoint")
    return saves + next(r["final_wait_s"] for r in recs if r.get("event") == "done")


def pairs(n: int, first, second) -> list[tuple[float, float]]:
    """n (first, second) results, alternating which of the two runs first."""
    out = []
    for i in range(n):
        if i % 2:
            b = second()
            a = first()
        else:
            a = first()
            b = second()
        out.append((a, b))
    return out


def median_ratio(results: list[tuple[float, float]]) -> float:
    return statistics.median(b / a for a, b in results)


def parser() -> argparse.ArgumentParser:
    found = argparse.ArgumentParser(
        prog="python -m trainer.bench", description=__doc__.splitlines()[0]
    )
    found.add_argument(
        "--presets",
        nargs="+",
        default=["tiny", "small"],
        choices=list(RUN),
        help="model presets to measure (default: %(default)s)",
    )
    found.add_argument(
        "--pairs",
        type=int,
        default=5,
        help="interleaved pairs of runs each figure is the median of (default: %(default)s)",
    )
    found.add_argument(
        "--bare",
        nargs=2,
        metavar=("PRESET", "THREADS"),
        help="only one run of the bare loop, what each pair's bare side runs in a process of "
        "its own (default: off, the whole benchmark)",
    )
    return found


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.bare:  # one bare-loop run, in a process of its own like the trainer's
        preset, threads = args.bare[0], int(args.bare[1])
        print(bare_loop(preset, threads, *RUN[preset]))
        return 0

    print(f"torch {torch.__version__}, {os.cpu_count()} cores, median of {args.pairs} pairs")
    rows = []
    for preset in args.presets:
        for threads in (1, 2):
            results = pairs(
                args.pairs,
                lambda p=preset, t=threads: run_bare(p, t),
                lambda p=preset, t=threads: steady_tokens_per_s(run_trainer(p, 1, t)),
            )
            bare = statistics.median(a for a, _ in results)
            trainer = statistics.median(b for _, b in results)
            rows.append(
                (
                    f"{preset}, 1 proc x {threads} thread: trainer / bare loop",
                    f"{median_ratio(results):.3f}",
                    f"({trainer:,.0f} / {bare:,.0f} tok/s)",
                    ">= 0.97",
                )
            )
            print(*rows[-1], flush=True)

    # DDP all-reduces the gradients once per optimizer step, so its share of a step depends on
    # the batch: this runs the trainer's default batch and micro-batch on both sides (4 and 2
    # micro-steps per step), one step per timing window.
    preset = args.presets[-1]
    default = TrainConfig()
    run = (default.global_batch, 1, 4)
    results = pairs(
        args.pairs,
        lambda: steady_tokens_per_s(
            run_trainer(preset, 1, 2, run=run, micro_batch=default.micro_batch)
        ),
        lambda: steady_tokens_per_s(
            run_trainer(preset, 2, 1, run=run, micro_batch=default.micro_batch)
        ),
    )
    rows.append(
        (
            f"{preset}, batch {default.global_batch} in micro-batches of {default.micro_batch}: "
            "2 procs x 1 thread / 1 proc x 2 threads",
            f"{median_ratio(results):.3f}",
            f"({statistics.median(b for _, b in results):,.0f} / "
            f"{statistics.median(a for a, _ in results):,.0f} tok/s)",
            ">= 0.95",
        )
    )
    print(*rows[-1], flush=True)

    # The same 12 saves of model + AdamW state (every 2 steps, the last at the end) on 2 workers.
    saving = ("--checkpoint-every", "2")
    runs: dict[str, list[list[dict]]] = {"sync": [], "async": []}

    def saves(mode: str) -> float:
        recs = run_trainer(
            preset, 2, 1, *saving, *(("--async-save",) if mode == "async" else ()), steps=24
        )
        runs[mode].append(recs)
        return blocked_seconds(recs)

    results = pairs(args.pairs, lambda: saves("sync"), lambda: saves("async"))
    loop = {
        mode: statistics.median(
            next(r["elapsed_s"] for r in recs if r.get("event") == "done") for recs in found
        )
        for mode, found in runs.items()
    }
    rows.append(
        (
            f"{preset}, 2 workers saving every 2 steps: loop blocked, async / sync",
            f"{median_ratio(results):.1%}",
            f"({statistics.median(b for _, b in results) * 1000:,.0f} / "
            f"{statistics.median(a for a, _ in results) * 1000:,.0f} ms of a "
            f"{loop['async']:.1f} / {loop['sync']:.1f} s loop)",
            "<= 25%",
        )
    )
    print()
    width = max(len(r[0]) for r in rows)
    for name, value, detail, target in rows:
        print(f"  {name:<{width}}  {value:>7}  {target:<8} {detail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
