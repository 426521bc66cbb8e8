"""Benchmark: a plan is a function of its inputs, also on a machine too busy to keep up.

    .venv/bin/python -m tests.bench_plan_determinism [--runs 12] [--parallel 3] [--burners 2]

Plans each stack `--runs` times with `deploy.plan`, `--parallel` processes at once, while
`--burners` processes spin on the CPU (a loaded CI runner: the one nondeterminism found so far,
a data holder reported unprotected once in eleven plans, showed only under load). Each run's
plan.json, outputs.json, manifests and printed summary are hashed; the plan of a stack is
deterministic when every run gives the same hash. Prints, per stack, the distinct hashes and
min/median/max seconds a plan took; exits 1 when a stack gave more than one hash or a plan
failed.
"""

import argparse
import hashlib
import multiprocessing
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STACKS = ("dev", "prod")


def burn(stop) -> None:
    while not stop.is_set():
        sum(i * i for i in range(10_000))


def plan_once(stack: str, out: Path) -> tuple[str, float, int]:
    """(hash of what the plan wrote and printed, seconds, exit status)."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "deploy.plan", "--stack", stack, "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    took = time.monotonic() - started
    # Each run writes to a folder of its own, which the summary and changes.txt name.
    digest = hashlib.sha256(done.stdout.replace(str(out), "<out>").encode())
    for path in sorted(p for p in out.rglob("*") if p.is_file() and p.parent.name != "base"):
        written = path.read_bytes().replace(str(out).encode(), b"<out>")
        digest.update(str(path.relative_to(out)).encode() + b"\0" + written)
    if done.returncode != 0:
        print(f"{stack}: exit {done.returncode}\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return digest.hexdigest()[:16], took, done.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=12, help="plans of each stack")
    parser.add_argument("--parallel", type=int, default=3, help="plans at once")
    parser.add_argument("--burners", type=int, default=2, help="processes spinning meanwhile")
    args = parser.parse_args(argv)
    stop = multiprocessing.Event()
    burners = [multiprocessing.Process(target=burn, args=(stop,)) for _ in range(args.burners)]
    for process in burners:
        process.start()
    failed = False
    try:
        with tempfile.TemporaryDirectory() as scratch, ThreadPoolExecutor(args.parallel) as pool:
            for stack in STACKS:
                outs = [Path(scratch) / f"{stack}-{i}" for i in range(args.runs)]
                results = list(pool.map(lambda out, s=stack: plan_once(s, out), outs))
                hashes = {h for h, _, _ in results}
                times = [t for _, t, _ in results]
                codes = {c for _, _, c in results}
                failed |= len(hashes) > 1 or codes != {0}
                print(
                    f"{stack}: {args.runs} plans, {len(hashes)} distinct "
                    f"({', '.join(sorted(hashes))}), exit {sorted(codes)}, seconds "
                    f"min {min(times):.1f} median {statistics.median(times):.1f} "
                    f"max {max(times):.1f}"
                )
    finally:
        stop.set()
        for process in burners:
            process.join()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
