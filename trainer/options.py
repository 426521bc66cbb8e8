"""The trainer's options, parsed without torch, so stack config can check a job's arguments."""

import argparse
import math
from dataclasses import dataclass, fields

from trainer.presets import PRESETS

MODELS = tuple(PRESETS)
PARALLEL = ("ddp", "fsdp")


@dataclass
class TrainConfig:
    model: str = "tiny"
    data: str = ""  # token file from `python -m trainer.data`; empty: the embedded stdlib corpus
    steps: int = 200
    global_batch: int = 32  # sequences per optimizer step, whatever the world size
    micro_batch: int = 8  # sequences per forward/backward on one worker
    lr: float = 3e-3
    warmup: int = 20
    weight_decay: float = 0.1
    seed: int = 1337
    parallel: str = "ddp"  # ddp | fsdp
    checkpoint_dir: str = "build/checkpoints/tiny"  # a path (local, FSx, EFS) or s3://bucket/prefix
    checkpoint_every: int = 50
    keep_last: int = 3
    async_save: bool = False
    metrics: str = ""  # JSON-lines file; empty: stdout only
    log_every: int = 10
    eval_every: int = 50  # validation loss on held-out text every this many steps, and at the end
    eval_samples: int = 32  # held-out sequences per validation
    bf16: bool = True  # autocast, CUDA only
    compile: bool = False  # torch.compile, CUDA only
    threads: int = 0  # intra-op threads per worker; 0: cores / local workers
    # Seconds a collective (training or checkpoint) waits for a rank that stopped answering (a
    # machine that fell off the network) before this worker fails and torchrun re-forms the
    # group without it. A rank's checkpoint write may lag the others' by at most this much.
    collective_timeout: int = 600


class OptionsError(ValueError):
    """Arguments the trainer would refuse."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # raise instead of exiting, so callers decide
        raise OptionsError(message)


def _parser(add_help: bool = False) -> argparse.ArgumentParser:
    # Without add_help, `--help` is an unknown argument (an error), never an exit with status 0.
    parser = _Parser(
        prog="python -m trainer",
        description="Train the byte-level GPT (DDP or FSDP2).",
        add_help=add_help,
    )
    for f in fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        if f.type is bool or f.type == "bool":
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default)
        else:
            parser.add_argument(flag, type=type(f.default), default=f.default)
    return parser


def parse_options(argv: list[str]) -> TrainConfig:
    """TrainConfig from command-line arguments; OptionsError names what is wrong."""
    config = TrainConfig(**vars(_parser().parse_args(argv)))
    if config.model not in MODELS:
        raise OptionsError(f"--model {config.model!r}; allowed: {', '.join(MODELS)}")
    if config.parallel not in PARALLEL:
        raise OptionsError(f"--parallel {config.parallel!r}; allowed: {', '.join(PARALLEL)}")
    for name in (
        "steps",
        "global_batch",
        "micro_batch",
        "checkpoint_every",
        "keep_last",
        "log_every",
        "eval_every",
        "eval_samples",
        "collective_timeout",
    ):
        if getattr(config, name) < 1:
            raise OptionsError(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("lr", "weight_decay", "warmup", "seed", "threads"):
        value = getattr(config, name)
        low = "> 0" if name == "lr" else ">= 0"
        if not math.isfinite(value) or value < 0 or (name == "lr" and value == 0):
            flag = name.replace("_", "-")
            raise OptionsError(f"--{flag} {value}; allowed: a finite number {low}")
    return config


def parse_args(argv: list[str] | None) -> TrainConfig:
    """For the command line: `--help` prints the options and exits 0; OptionsError otherwise."""
    import sys

    argv = sys.argv[1:] if argv is None else argv
    if {"-h", "--help"} & set(argv):
        _parser(add_help=True).parse_args(["--help"])  # prints help, exits 0
    return parse_options(argv)


def usage() -> str:
    return _parser().format_usage()
