"""A CPU stand-in for nccl-tests' all_reduce_perf, where no GPU is: it says so in its first line.

Same command-line subset as all_reduce_perf (-b, -e, -f, -g 1, -n, -w, -c; sizes with K/M/G, the
last of a repeated option wins) and the same result table, every figure measured: rank 0 and the
other MPI ranks (OMPI_COMM_WORLD_RANK/SIZE, rendezvous at MASTER_ADDR:MASTER_PORT) run
torch.distributed's gloo all_reduce (sum, float32) at each size, timed over `-n` iterations after
`-w` warm-up ones; algbw and busbw follow nccl-tests' formulas (src/all_reduce.cu AllReduceGetBw)
and #wrong counts the elements that differ from the expected sum after one all_reduce of known data,
as nccl-tests' check does. Out-of-place copies the send buffer into the receive buffer first (gloo
reduces in place); the copy is not timed. It is not NCCL: it prints no NCCL lines. Its lines are
nccl-tests' (workloads/tests/nccl_tests_output.py). Run it as `python -m
workloads.tests.nccl_stand_in` from the repository.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist

from workloads.tests.nccl_tests_output import (
    Half,
    footer_lines,
    header_lines,
    options_line,
    row_line,
)

STAND_IN_LINE = "# stand-in for all_reduce_perf: torch.distributed gloo on CPU, not NCCL"
UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def size(text: str) -> int:
    """nccl-tests' parsesize: a number with an optional K, M or G (powers of 1024)."""
    unit = UNITS.get(text[-1:].upper(), 1)
    return int(float(text[:-1] if unit > 1 else text) * unit)


def measure(buffer: torch.Tensor, send: torch.Tensor, in_place: bool, warmup: int, iters: int):
    """(microseconds per all_reduce, #wrong)."""
    world = dist.get_world_size()
    for _ in range(warmup):
        dist.all_reduce(buffer)
    dist.barrier()
    elapsed = 0.0
    for _ in range(iters):
        if not in_place:
            buffer.copy_(send)
        start = time.perf_counter()
        dist.all_reduce(buffer)
        elapsed += time.perf_counter() - start
    # The check: every rank contributes rank + 1, so every element must hold 1 + 2 + ... + world.
    buffer.fill_(dist.get_rank() + 1)
    dist.all_reduce(buffer)
    wrong = torch.tensor(int((buffer != world * (world + 1) / 2).sum()))
    dist.all_reduce(wrong)
    return elapsed / iters * 1e6, int(wrong)


def main() -> None:
    parser = argparse.ArgumentParser(prog="all_reduce_perf")
    parser.add_argument("-b", "--minbytes", type=size, default=size("32M"))
    parser.add_argument("-e", "--maxbytes", type=size, default=size("32M"))
    parser.add_argument("-f", "--stepfactor", type=int, default=1)
    parser.add_argument("-g", "--ngpus", type=int, default=1, choices=[1])
    parser.add_argument("-n", "--iters", type=int, default=20)
    parser.add_argument("-w", "--warmup_iters", type=int, default=5)
    parser.add_argument("-c", "--check", type=int, default=1)
    args = parser.parse_args()
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    world = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    out = print if rank == 0 else (lambda *_, **__: None)
    out(STAND_IN_LINE)
    out(
        options_line(
            args.minbytes, args.maxbytes, args.stepfactor, args.warmup_iters, args.iters, args.check
        )
    )
    out("\n".join(header_lines()))
    errors, busbws = 0, []
    nbytes = args.minbytes
    while nbytes <= args.maxbytes:
        elements = nbytes // 4
        send = torch.full((elements,), float(rank + 1))
        halves = []
        for in_place in (False, True):
            time_us, wrong = measure(
                torch.zeros(elements), send, in_place, args.warmup_iters, args.iters
            )
            algbw = nbytes / 1e9 / (time_us / 1e6)
            busbw = algbw * 2 * (world - 1) / world
            busbws.append(busbw)
            errors += 1 if wrong else 0
            halves.append(Half(time_us, algbw, busbw, wrong if args.check else None))
        out(row_line(nbytes, elements, "float", "sum", -1, *halves), flush=True)
        nbytes = nbytes * args.stepfactor if args.stepfactor > 1 else nbytes + 1
    out("\n".join(footer_lines(errors, sum(busbws) / len(busbws))))
    dist.destroy_process_group()
    raise SystemExit(1 if errors else 0)


if __name__ == "__main__":
    main()
