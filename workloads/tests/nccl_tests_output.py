"""all_reduce_perf's output lines, written from the printf formats of nccl-tests v2.19.6 (the
version trainer/Dockerfile builds: NVIDIA/nccl-tests, tag v2.19.6, commit
a0b82b2260cf5152b9f8c061bbf7eaf0ba096432), src/util.cu: writeDeviceReport, writeResultHeader,
writeBenchmarkLinePreamble, writeBenchmarkLineBody with getFloatStr, writeResultFooter and
finalizeFooter. Rank 0 prints them; the layout is the one without -I (per-iteration report), -C
(cputime) and -T (timestamps).

The CPU stand-in prints its table with these, and the sample launcher logs in tests/fixtures/nccl
are checked against them.
"""

from dataclasses import dataclass

PROGRAM = "all_reduce_perf"  # common.cu: the basename of argv[0]


@dataclass(frozen=True)
class Half:
    """The out-of-place or the in-place half of a row."""

    time_us: float
    algbw: float
    busbw: float
    wrong: int | None  # None: run with -c 0, printed as N/A


def float_str(value: float, width: int) -> str:
    """getFloatStr: the most decimals (2, 1, 0) that fit `width`, else exponent notation."""
    for form in (f"{value:{width}.2f}", f"{value:{width}.1f}", f"{value:{width}.0f}"):
        if len(form) <= width:
            return form
    return f"{value:{width}.1e}" if width >= 7 else f"{value:{width}.0e}"


def options_line(
    min_bytes: int, max_bytes: int, step_factor: int, warmup: int, iters: int, check: int
) -> str:
    """writeDeviceReport's line of the run's options (one thread, one GPU per process)."""
    return (
        f"# nThread 1 nGpus 1 minBytes {min_bytes} maxBytes {max_bytes} step: {step_factor}"
        f"(factor) warmup iters: {warmup} iters: {iters} agg iters: 1 validation: {check} "
        "graph: 0 unalign: 0"
    )


def header_lines() -> list[str]:
    """writeResultHeader (its trailing "%*s" prints a space: no timestamp column)."""
    blank = f"# {'':>10}  {'':>12}  {'':>8}  {'':>6}  {'':>6}"
    names = ["size", "count", "type", "redop", "root"] + ["time", "algbw", "busbw", "#wrong"] * 2
    units = ["(B)", "(elements)", "", "", ""] + ["(us)", "(GB/s)", "(GB/s)", ""] * 2
    widths = [10, 12, 8, 6, 6] + [7, 6, 6, 6] * 2
    return [
        "#",
        blank + "           out-of-place                       in-place          ",
        *(
            "# " + "  ".join(f"{c:>{w}}" for c, w in zip(row, widths, strict=True)) + " "
            for row in (names, units)
        ),
    ]


def row_line(size: int, count: int, type_: str, redop: str, root: int, *halves: Half) -> str:
    """writeBenchmarkLinePreamble, then writeBenchmarkLineBody for out-of-place and in-place."""
    line = f"{size:12d}  {count:12d}  {type_:>8}  {redop:>6}  {root:6d}"
    for half in halves:
        line += f"  {float_str(half.time_us, 7)}  {float_str(half.algbw, 6)}"
        line += f"  {float_str(half.busbw, 6)}"
        line += "    N/A" if half.wrong is None else f"  {half.wrong:6g}"
    return line


def footer_lines(errors: int, average_busbw: float) -> list[str]:
    """writeResultFooter without NCCL_TESTS_MIN_BW, finalizeFooter, and writeErrors' empty line
    (NCCL has no error to report). `errors`: the checks that found wrong elements, summed over
    the ranks; the average is that of every busbw in the table (common.cu run())."""
    return [
        f"# {'Out of bounds values':<20} : {errors} {'FAILED' if errors else 'OK'}",
        f"# {'Avg bus bandwidth':<20} : {average_busbw:g} ",
        "#",
        f"# Collective test concluded: {PROGRAM}",
        "#",
        "",
    ]
