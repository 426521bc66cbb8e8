"""Token data: byte-level token files, and the embedded default corpus.

    python -m trainer.data --input PATH [--out data/corpus.bin]

turns a text file or a directory of them into a file of uint8 tokens. With no --input it uses the
default corpus: the CPython standard library's own sources, real text on every machine with Python.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import sysconfig
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

DEFAULT_TOKENS = Path("build/data/stdlib.bin")
TEXT_SUFFIXES = {".py", ".txt", ".md", ".rst", ".json", ".yaml", ".yml", ".toml", ".c", ".h"}


def default_corpus_files() -> list[Path]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return sorted(stdlib.glob("*.py"))


def text_files(source: Path) -> list[Path]:
    if source.is_file():
        return [source]
    if source.is_dir():
        return sorted(p for p in source.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES)
    raise FileNotFoundError(f"no such file or directory: {source}")


def prepare(files: list[Path], out: Path) -> int:
    """Concatenate files as bytes into `out`; returns the token count."""
    if not files:
        raise ValueError("no text files to prepare")
    out.parent.mkdir(parents=True, exist_ok=True)
    # Every worker of a fresh run may prepare the default corpus at once: each writes its own
    # temporary file and renames it into place, so readers only ever see a complete file.
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    with tmp.open("wb") as sink:
        for path in files:
            sink.write(path.read_bytes())
            sink.write(b"\n")
    tmp.replace(out)
    return out.stat().st_size


# The last 5 % of the token file is held out: validation loss is measured on text never trained on.
VALIDATION_FRACTION = 0.05


class TokenData:
    """Training samples addressed by a global sample index.

    Sample i is a fixed window of the tokens, independent of the world size, so a run that
    resumes on a different number of workers sees the same samples in the same order.
    """

    def __init__(self, tokens: np.ndarray, seq_len: int, pin_memory: bool = False):
        self.tokens = tokens
        self.seq_len = seq_len
        self.pin_memory = pin_memory  # page-locked batches copy to the GPU asynchronously
        self.windows = len(tokens) - seq_len - 1
        # A stride coprime with the window count visits every window once per pass, in an order
        # that jumps through the corpus instead of reading it front to back.
        stride = int(self.windows * 0.6180339887) | 1
        while np.gcd(stride, self.windows) != 1:
            stride += 2
        self.stride = stride

    def batch(self, sample_indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        starts = [(i * self.stride) % self.windows for i in sample_indices]
        rows = np.stack([self.tokens[s : s + self.seq_len + 1] for s in starts]).astype(np.int64)
        # Imported here: preparing a token file (python -m trainer.data, every worker's first
        # look at the default corpus) needs no torch, whose import is 2 s of CPU.
        import torch

        rows = torch.from_numpy(rows)
        if self.pin_memory:
            rows = rows.pin_memory()
        return rows[:, :-1], rows[:, 1:]


def open_splits(path: Path, seq_len: int, pin_memory: bool = False) -> tuple[TokenData, TokenData]:
    """(training, validation) samples of a token file; ValueError says what is wrong with it."""
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    size = path.stat().st_size
    # Both splits need at least one window of seq_len + 1 tokens and one more to shift by.
    needed = math.ceil((seq_len + 2) / VALIDATION_FRACTION)
    if size < needed:
        raise ValueError(
            f"{path} has {size} tokens; this model (sequence length {seq_len}) needs at least "
            f"{needed}"
        )
    tokens = np.memmap(path, dtype=np.uint8, mode="r")
    split = size - int(size * VALIDATION_FRACTION)
    return (
        TokenData(tokens[:split], seq_len, pin_memory),
        TokenData(tokens[split:], seq_len, pin_memory),
    )


def ensure_default_tokens(path: Path = DEFAULT_TOKENS) -> Path:
    if not path.exists():
        prepare(default_corpus_files(), path)
    return path


def parser() -> argparse.ArgumentParser:
    found = argparse.ArgumentParser(
        prog="python -m trainer.data", description=__doc__.splitlines()[0]
    )
    found.add_argument(
        "--input",
        type=Path,
        help="a text file, or a folder whose text files (by suffix: "
        f"{', '.join(sorted(TEXT_SUFFIXES))}) are taken in name order; default: the Python "
        "standard library's sources",
    )
    found.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_TOKENS,
        help="the token file to write, one byte per token (default: %(default)s)",
    )
    return found


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        files = text_files(args.input) if args.input else default_corpus_files()
        count = prepare(files, args.out)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {count:,} tokens from {len(files)} files to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
