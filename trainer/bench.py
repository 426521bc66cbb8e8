"""Benchmark (not a test): the trainer against a bare PyTorch loop, and what saving costs.

    python -m trainer.bench [--presets tiny small] [--pairs 5]

Every figure is the median over interleaved pairs of runs (A then B, B then A, ...), each run a
fresh process: on a shared machine one run swings by 10 % or more, and interleaving spreads the
drift over both sides. Figures and the targets they should meet:
  - trainer vs an independent bare loop, per preset, 1 and 2 threads (>= 0.97)
  - trainer, 2 processes x 1 thread vs 1 process x 2 threads (>= 0.95; on a 2-core CPU this
    measures DDP's overhead, not scaling)
  - with 2 workers while training: the time the loop is blocked by async saves, including the
    wait for the last one, vs the same saves done synchronously (<= 25%)
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
from trainer.model import PRESETS

# Sequences per step and timed steps per run: about the same seconds per run for each preset.
RUN = {"tiny": (8, 24), "small": (4, 4), "gpt2-124m": (1, 2)}


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


def bare_loop(preset: str, threads: int, batch: int, steps: int) -> float:
    """Tokens/s of the least a training step can be: batch, forward, backward, clip, AdamW."""
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
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95))
    data = np.memmap(ensure_default_tokens(), dtype=np.uint8, mode="r")
    warmup = max(2, steps // 4)
    for step in range(warmup + steps):
        if step == warmup:
            start = time.perf_counter()
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
    return steps * batch * c.seq_len / (time.perf_counter() - start)


def run_bare(preset: str, threads: int) -> float:
    batch, steps = RUN[preset]
    out = subprocess.run(
        [sys.executable, "-m", "trainer.bench", "--bare", preset, str(threads)],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": str(threads)},
    )
    return float(out.stdout)


def run_trainer(
    preset: str, nproc: int, threads: int, *extra: str, steps: int | None = None
) -> list[dict]:
    """The trainer's metrics records for one run on the default corpus."""
    batch, timed = RUN[preset]
    timed = steps or timed
    warmup = max(2, timed // 4)
    with tempfile.TemporaryDirectory() as tmp:
        metrics = Path(tmp) / "metrics.jsonl"
        args = [
            *("--model", preset, "--steps", str(warmup + timed), "--global-batch", str(batch)),
            *("--micro-batch", str(max(1, batch // nproc)), "--threads", str(threads)),
            *("--log-every", str(warmup), "--checkpoint-dir", f"{tmp}/ckpt"),
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
    """Tokens/s over the logging windows after the first (which holds the warm-up steps)."""
    windows = [r for r in recs if "tokens_per_s" in r]
    steps = [w["step"] - prev["step"] for prev, w in zip(windows, windows[1:], strict=False)]
    seconds = [w["step_time_s"] * n for w, n in zip(windows[1:], steps, strict=True)]
    tokens = [w["tokens_per_s"] * s for w, s in zip(windows[1:], seconds, strict=True)]
    return sum(tokens) / sum(seconds)


def blocked_seconds(recs: list[dict]) -> float:
    """Time saves kept the loop from training: every save call plus the wait for the last one."""
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainer.bench", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--presets", nargs="+", default=["tiny", "small"], choices=list(RUN))
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--bare", nargs=2, metavar=("PRESET", "THREADS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
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

    preset = args.presets[-1]
    results = pairs(
        args.pairs,
        lambda: steady_tokens_per_s(run_trainer(preset, 1, 2)),
        lambda: steady_tokens_per_s(run_trainer(preset, 2, 1)),
    )
    rows.append(
        (
            f"{preset}: 2 procs x 1 thread / 1 proc x 2 threads",
            f"{median_ratio(results):.3f}",
            f"({statistics.median(b for _, b in results):,.0f} / "
            f"{statistics.median(a for a, _ in results):,.0f} tok/s)",
            ">= 0.95",
        )
    )
    print(*rows[-1], flush=True)

    # The same saves of model + AdamW state (steps 3, 6 and the last, 8) on 2 training workers.
    saving = ("--checkpoint-every", "3")
    results = pairs(
        args.pairs,
        lambda: blocked_seconds(run_trainer(preset, 2, 1, *saving, steps=6)),
        lambda: blocked_seconds(run_trainer(preset, 2, 1, *saving, "--async-save", steps=6)),
    )
    rows.append(
        (
            f"{preset}, 2 workers saving every 3 steps: loop blocked, async / sync",
            f"{median_ratio(results):.1%}",
            f"({statistics.median(b for _, b in results) * 1000:,.0f} / "
            f"{statistics.median(a for a, _ in results) * 1000:,.0f} ms)",
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
