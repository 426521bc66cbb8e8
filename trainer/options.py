"""The trainer's options, parsed without torch, so stack config can check a job's arguments."""

import argparse
import math
from dataclasses import dataclass, field, fields

from trainer.presets import PRESETS

MODELS = tuple(PRESETS)
PARALLEL = ("ddp", "fsdp")
# Options that take one of a few words: --help shows them, parse_options refuses others.
CHOICES = {"model": MODELS, "parallel": PARALLEL}


def option(default, help: str):
    """A field of TrainConfig and the help text of its flag: --help and the docs show the same.
    `%(default)s` in the text is the default (argparse expands it)."""
    return field(default=default, metadata={"help": help})


@dataclass
class TrainConfig:
    model: str = option("tiny", "model preset (default: %(default)s)")
    data: str = option(
        "",
        "token file made by `python -m trainer.data`; default: the embedded corpus (the Python "
        "standard library's sources, prepared on first use)",
    )
    steps: int = option(
        200, "optimizer steps of the whole run, resumed ones included (default: %(default)s)"
    )
    global_batch: int = option(
        32, "sequences per optimizer step, whatever the number of workers (default: %(default)s)"
    )
    micro_batch: int = option(
        8,
        "sequences per forward/backward on one worker; gradients accumulate up to the global "
        "batch (default: %(default)s)",
    )
    lr: float = option(
        3e-3, "peak learning rate, after warmup; cosine decay to 10%% of it (default: %(default)s)"
    )
    warmup: int = option(20, "steps of linear learning-rate warmup (default: %(default)s)")
    weight_decay: float = option(
        0.1, "AdamW weight decay of the Linear weights (default: %(default)s)"
    )
    seed: int = option(1337, "seed of the initial weights (default: %(default)s)")
    parallel: str = option(
        "ddp",
        "data parallelism; fsdp (FSDP2) shards parameters, gradients and optimizer state "
        "(default: %(default)s)",
    )
    checkpoint_dir: str = option(
        "build/checkpoints/tiny",
        "where checkpoints and TensorBoard event files (its tensorboard/ folder) go: a path "
        "(local, FSx, EFS) or s3://bucket/prefix; a run resumes from the newest checkpoint "
        "there (default: %(default)s)",
    )
    checkpoint_every: int = option(
        50, "save a checkpoint every this many steps, and at the end (default: %(default)s)"
    )
    keep_last: int = option(3, "committed checkpoints kept (default: %(default)s)")
    async_save: bool = option(
        False,
        "save checkpoints in the background; training blocks only while the state is copied "
        "to host memory (default: %(default)s)",
    )
    metrics: str = option(
        "",
        "also append the JSON-lines records (loss, throughput, events) to this file; default: "
        "stdout only",
    )
    log_every: int = option(
        10, "log training loss and throughput every this many steps (default: %(default)s)"
    )
    eval_every: int = option(
        50,
        "validation loss on held-out text every this many steps, and at the end "
        "(default: %(default)s)",
    )
    eval_samples: int = option(32, "held-out sequences per validation (default: %(default)s)")
    bf16: bool = option(True, "bf16 autocast, CUDA only (default: %(default)s)")
    compile: bool = option(False, "torch.compile each block, CUDA only (default: %(default)s)")
    threads: int = option(
        0,
        "intra-op threads per worker; 0: the machine's cores / local workers "
        "(default: %(default)s)",
    )
    # A rank's checkpoint write may lag the others' by at most this much.
    collective_timeout: int = option(
        600,
        "seconds a collective (training or checkpoint) waits for a worker that stopped "
        "answering before this one fails and torchrun re-forms the group without it "
        "(default: %(default)s)",
    )


class OptionsError(ValueError):
    """Arguments the trainer would refuse."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # raise instead of exiting, so callers decide
        raise OptionsError(message)


def parser(add_help: bool = False) -> argparse.ArgumentParser:
    """The trainer's command line, as --help and the docs show it."""
    # Without add_help, `--help` is an unknown argument (an error), never an exit with status 0.
    found = _Parser(
        prog="python -m trainer",
        description="Train the byte-level GPT (DDP or FSDP2).",
        add_help=add_help,
    )
    for f in fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        if f.type is bool or f.type == "bool":
            found.add_argument(
                flag,
                action=argparse.BooleanOptionalAction,
                default=f.default,
                help=f.metadata["help"],
            )
        else:
            choices = CHOICES.get(f.name)
            found.add_argument(
                flag,
                type=type(f.default),
                default=f.default,
                metavar="{" + ",".join(choices) + "}" if choices else None,
                help=f.metadata["help"],
            )
    return found


def parse_options(argv: list[str]) -> TrainConfig:
    """TrainConfig from command-line arguments; OptionsError names what is wrong."""
    config = TrainConfig(**vars(parser().parse_args(argv)))
    for name, allowed in CHOICES.items():
        if getattr(config, name) not in allowed:
            value = getattr(config, name)
            raise OptionsError(f"--{name} {value!r}; allowed: {', '.join(allowed)}")
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
        parser(add_help=True).parse_args(["--help"])  # prints help, exits 0
    return parse_options(argv)


def usage() -> str:
    return parser().format_usage()
