"""The training loop: elastic DDP or FSDP2, fixed global batch, resume from the newest checkpoint.

    torchrun --standalone --nproc-per-node 2 -m trainer --steps 200
    python -m trainer --steps 50            # a single process works too

On SIGTERM (Spot interruption, Karpenter drain, `kubectl delete`) every rank finishes its step,
a checkpoint is saved, and the process exits 0 well inside the pod's grace period.
"""

import gc
import json
import math
import os
import signal
import socket
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from trainer.checkpoint import Checkpointer, UnusableCheckpoint, open_store
from trainer.data import TokenData, ensure_default_tokens, open_splits
from trainer.launch import INPUT_ERROR_FILE
from trainer.model import GPT, state_digest
from trainer.options import OptionsError, TrainConfig, parse_args
from trainer.options import usage as options_usage
from trainer.presets import PRESETS
from trainer.scalars import Scalars

# Ranks agree on a stop request every this many steps: one tiny collective, and on CUDA one host
# sync, per check rather than per step; a SIGTERM waits at most this many steps for its save.
STOP_CHECK_EVERY = 5

# Dense bf16 tensor peak per GPU (vendor datasheets), for MFU.
PEAK_FLOPS = {
    "H200": 989e12,
    "H100": 989e12,
    "A100": 312e12,
    "L40S": 362e12,
    "A10G": 125e12,
    "L4": 121e12,
    "T4": 65e12,
}


def device_name(device: torch.device) -> str:
    """The GPU's name as CUDA gives it ("NVIDIA H100 80GB HBM3"); empty off GPUs."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else ""


def peak_flops(name: str) -> float | None:
    """The peak of the GPU called `name` (PEAK_FLOPS, longer names first: an L40S is no L4), or
    None: then the run logs no MFU."""
    return next(
        (PEAK_FLOPS[k] for k in sorted(PEAK_FLOPS, key=len, reverse=True) if k in name), None
    )


def mfu(flops_per_token: float, tokens_per_s: float, peak: float, world: int) -> float:
    """Model FLOPs utilization: the training FLOPs per second of all `world` workers' tokens
    over the peak of their GPUs together."""
    return round(flops_per_token * tokens_per_s / (peak * world), 4)


class Progress(Stateful):
    """What the run has consumed: steps taken and the global sample counter."""

    def __init__(self):
        self.step = 0
        self.samples = 0

    def state_dict(self):
        return {"step": torch.tensor(self.step), "samples": torch.tensor(self.samples)}

    def load_state_dict(self, state):
        self.step, self.samples = int(state["step"]), int(state["samples"])


# What the model's parameters are called in a checkpoint: the state saved is
# {"train": ModelAndOptimizer, "progress": Progress}, which DCP flattens to `train.model.<name>`,
# `train.optim...` and `progress.step`, `progress.samples`.
MODEL_KEYS = "train.model."


class ModelAndOptimizer(Stateful):
    """Model + optimizer as DCP sees them: fully qualified names, resharded on load."""

    def __init__(self, model, optimizer):
        self.model, self.optimizer = model, optimizer

    def state_dict(self):
        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        return {"model": model_state, "optim": optim_state}

    def load_state_dict(self, state):
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
        )


class InputError(Exception):
    """Something the user gave that the trainer cannot run with: one line, exit status 2."""


def agree(error: str | None) -> None:
    """Raise InputError on every rank if any rank found a problem, so none waits alone."""
    errors = [None] * dist.get_world_size()
    dist.all_gather_object(errors, error)
    first = next((e for e in errors if e), None)
    if first:
        raise InputError(first)


class StopOnSignal:
    """Turns SIGTERM/SIGINT into a flag the loop checks, so a step is never cut in half."""

    def __init__(self):
        self.requested = False
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        self.requested = True


# Under mpirun (MPIJob) the ranks come from OpenMPI; MASTER_ADDR/PORT from the launcher's env.
_OPENMPI_ENV = {
    "RANK": "OMPI_COMM_WORLD_RANK",
    "WORLD_SIZE": "OMPI_COMM_WORLD_SIZE",
    "LOCAL_RANK": "OMPI_COMM_WORLD_LOCAL_RANK",
    "LOCAL_WORLD_SIZE": "OMPI_COMM_WORLD_LOCAL_SIZE",
}


def init_distributed(timeout: timedelta) -> tuple[int, int, torch.device]:
    if "RANK" not in os.environ and "OMPI_COMM_WORLD_RANK" in os.environ:
        os.environ.update({ours: os.environ[theirs] for ours, theirs in _OPENMPI_ENV.items()})
    if "RANK" not in os.environ:  # plain `python -m trainer`: a group of one
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(
            RANK="0",
            LOCAL_RANK="0",
            WORLD_SIZE="1",
            LOCAL_WORLD_SIZE="1",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
    cuda = torch.cuda.is_available()
    if cuda:
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    backend = "nccl" if cuda else "gloo"
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # torchrun keeps one store across restarts; without a per-attempt prefix, restarted
        # workers can read the dead workers' addresses and fail to connect.
        store = dist.PrefixStore(
            f"trainer/attempt-{os.environ['TORCHELASTIC_RESTART_COUNT']}",
            dist.TCPStore(
                os.environ["MASTER_ADDR"],
                int(os.environ["MASTER_PORT"]),
                is_master=False,
                timeout=timedelta(minutes=10),
            ),
        )
        dist.init_process_group(
            backend,
            store=store,
            rank=int(os.environ["RANK"]),
            world_size=int(os.environ["WORLD_SIZE"]),
            timeout=timeout,
        )
    else:
        dist.init_process_group(backend, timeout=timeout)
    return dist.get_rank(), dist.get_world_size(), device


def lr_at(step: int, config: TrainConfig) -> float:
    """Linear warmup, then cosine decay to 10%; a function of the step alone, so resumable."""
    if step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    progress = (step - config.warmup) / max(1, config.steps - config.warmup)
    return config.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * min(progress, 1.0))))


def param_digest(model: torch.nn.Module) -> str:
    return state_digest(get_model_state_dict(model))


class Logger:
    """Rank 0 only: JSON lines to a file and stdout, a progress line on a terminal, the scalars
    to TensorBoard (trainer.scalars)."""

    def __init__(self, rank: int, path: str, total_steps: int, scalars: Scalars | None = None):
        self.enabled = rank == 0
        if self.enabled and path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.file = open(path, "a") if self.enabled and path else None  # noqa: SIM115
        self.scalars = scalars
        self.total = total_steps
        self.tty = sys.stderr.isatty()
        self.bar_shown = False  # the progress line is open: end it before printing another line

    def __enter__(self) -> "Logger":
        return self

    def __exit__(self, *exc) -> None:
        if self.scalars:
            self.scalars.close()
        if self.file:
            self.file.close()

    def log(self, record: dict) -> None:
        if not self.enabled:
            return
        line = json.dumps(record)
        if self.file:
            self.file.write(line + "\n")
            self.file.flush()
        if self.scalars:
            self.scalars.add(record)
        if self.tty and "loss" in record:
            done = int(30 * record["step"] / self.total)
            sys.stderr.write(
                f"\r[{'#' * done}{'.' * (30 - done)}] step {record['step']}/{self.total} "
                f"loss {record['loss']:.3f} {record['tokens_per_s']:,.0f} tok/s"
            )
            sys.stderr.flush()
            self.bar_shown = True
        else:
            if self.bar_shown:
                sys.stderr.write("\n")
                self.bar_shown = False
            print(line, flush=True)


def build_model(config: TrainConfig, device: torch.device) -> tuple[torch.nn.Module, GPT]:
    """(the model to train, wrapped for DDP or FSDP2; the GPT inside it)."""
    torch.manual_seed(config.seed)  # every rank starts from the same weights
    core = GPT(PRESETS[config.model]).to(device)
    cuda = device.type == "cuda"
    world = dist.get_world_size()
    model = wrap(
        core,
        config.parallel,
        world,
        device,
        compile=config.compile and cuda,
        bf16=config.bf16 and cuda,
    )
    return model, core


def wrap(
    core: GPT, parallel: str, world: int, device: torch.device, compile: bool, bf16: bool
) -> torch.nn.Module:
    if compile:
        # Block by block and before wrapping, as torchtitan does: DDP's no_sync and FSDP's
        # hooks stay outside the compiled graphs (compiling the DDP wrapper would bypass both).
        for i, block in enumerate(core.blocks):
            core.blocks[i] = torch.compile(block)
    if parallel == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        # bf16 parameters for compute and bf16 gradient reduce-scatter: half the bytes of fp32
        # on the wire; the fp32 master weights and optimizer state stay sharded in fp32.
        policy = (
            MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
            if bf16
            else MixedPrecisionPolicy()
        )
        for block in core.blocks:
            fully_shard(block, mp_policy=policy)
        fully_shard(core, mp_policy=policy)
        return core
    if world > 1:  # with one worker DDP would only copy gradients around
        return DistributedDataParallel(
            core, device_ids=[device.index] if device.type == "cuda" else None
        )
    return core


def gradient_sync(model: torch.nn.Module, last: bool):
    """Gradients cross ranks only on the last micro-step of an optimizer step."""
    if isinstance(model, DistributedDataParallel):
        return nullcontext() if last else model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        model.set_requires_gradient_sync(last)
    return nullcontext()


def validation_loss(
    model: torch.nn.Module, data: TokenData, config: TrainConfig, device: torch.device, autocast
) -> float:
    """Mean loss over the same held-out samples every time, whatever the world size."""
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = list(range(rank, config.eval_samples, world))
    # Every rank runs the same number of forwards (FSDP gathers parameters in each).
    chunks = math.ceil(math.ceil(config.eval_samples / world) / config.micro_batch)
    total = torch.zeros((), device=device)
    with torch.no_grad(), autocast:
        for chunk in range(chunks):
            samples = mine[chunk * config.micro_batch : (chunk + 1) * config.micro_batch]
            tokens, targets = data.batch(samples or [0])
            loss = model(
                tokens.to(device, non_blocking=True), targets.to(device, non_blocking=True)
            )
            total += loss.float() * len(samples)
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total.item() / config.eval_samples


def train(config: TrainConfig) -> int:
    """Raises InputError, before any training step, for what the user must fix."""
    rank, world, device = init_distributed(timedelta(seconds=config.collective_timeout))
    try:
        return _train(config, rank, world, device)
    finally:
        # Only once _train's model, DDP reducer and optimizer are gone (FSDP modules sit in
        # reference cycles, hence the collection): tearing the group down under them can hang
        # or abort the process at exit.
        gc.collect()
        dist.destroy_process_group()


def _train(config: TrainConfig, rank: int, world: int, device: torch.device) -> int:
    local_workers = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    torch.set_num_threads(config.threads or max(1, (os.cpu_count() or 1) // local_workers))
    # Rank r takes samples r, r+W, r+2W, ... of each step's global batch, so any world size
    # works, even one that does not divide the batch; every rank runs the same number of
    # micro-steps (DDP/FSDP need matching collectives), a rank short of samples a zero-weight one.
    accumulation = math.ceil(math.ceil(config.global_batch / world) / config.micro_batch)
    model_config = PRESETS[config.model]
    cuda = device.type == "cuda"

    # Everything the user gave is checked here, on every rank, before the first step.
    data_path = Path(config.data) if config.data else ensure_default_tokens()
    error = None
    try:
        data, held_out = open_splits(data_path, model_config.seq_len, pin_memory=cuda)
    except ValueError as e:
        error = f"--data {e}"
    agree(error)
    store = open_store(config.checkpoint_dir)
    try:
        store.probe(rank)
        error = None
    except Exception as e:  # OSError locally, botocore's errors for S3: all mean the same here
        reason = f"{e.strerror}: {e.filename}" if isinstance(e, OSError) and e.strerror else e
        error = f"--checkpoint-dir {config.checkpoint_dir}: cannot write there ({reason})"
    agree(error)

    model, core = build_model(config, device)
    # Fused AdamW (CUDA and CPU): one pass over parameters and state per group, where the
    # default foreach version makes about ten; 3-5x faster steps on CPU.
    optimizer = torch.optim.AdamW(
        core.parameter_groups(config.weight_decay), lr=config.lr, betas=(0.9, 0.95), fused=True
    )
    progress = Progress()
    state = {"train": ModelAndOptimizer(model, optimizer), "progress": progress}
    checkpointer = Checkpointer(
        store, config.keep_last, config.async_save, timedelta(seconds=config.collective_timeout)
    )
    shapes = {MODEL_KEYS + k: v.shape for k, v in get_model_state_dict(model).items()}
    try:
        resumed, unreadable = checkpointer.restore(state, shapes)
    except UnusableCheckpoint as e:
        raise InputError(f"{e} (this run: --model {config.model})") from None
    scalars = Scalars(store, first_step=progress.step + 1) if rank == 0 else None
    with Logger(rank, config.metrics, config.steps, scalars) as logger:
        logger.log(
            {
                "event": "start",
                "world_size": world,
                "accumulation": accumulation,
                "resumed_from": resumed,
                "unreadable": unreadable,
                "step": progress.step,
                "samples": progress.samples,
                "params": model_config.params(),
                "config": asdict(config),
            }
        )
        if progress.step >= config.steps:
            if rank == 0:
                print(
                    f"trainer: the run is already complete: checkpoint "
                    f"{store.where(progress.step)} is at step {progress.step} of {config.steps}",
                    file=sys.stderr,
                    flush=True,
                )
            logger.log({"event": "complete", "step": progress.step})
            return 0

        stop = StopOnSignal()
        autocast = (
            torch.autocast("cuda", dtype=torch.bfloat16) if config.bf16 and cuda else nullcontext()
        )
        peak = peak_flops(device_name(device))
        tokens_per_step = config.global_batch * model_config.seq_len
        loss_sum = torch.zeros((), device=device)
        norm_sum = torch.zeros((), device=device)
        stopping = False
        loop_start = window_start = time.perf_counter()
        window_steps = 0
        while progress.step < config.steps and not stopping:
            for group in optimizer.param_groups:
                group["lr"] = lr_at(progress.step, config)
            mine = range(progress.samples + rank, progress.samples + config.global_batch, world)
            for micro in range(accumulation):
                samples = list(mine[micro * config.micro_batch : (micro + 1) * config.micro_batch])
                tokens, targets = data.batch(samples or [mine.start])
                # Gradients are averaged over ranks; this weight makes the result the mean over the
                # whole global batch, however unevenly it was split.
                weight = len(samples) * world / config.global_batch
                with gradient_sync(model, last=micro == accumulation - 1), autocast:
                    loss = model(
                        tokens.to(device, non_blocking=True), targets.to(device, non_blocking=True)
                    )
                    (loss * weight).backward()
                loss_sum += loss.detach() * len(samples) / config.global_batch
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            norm_sum += norm.full_tensor() if isinstance(norm, DTensor) else norm
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            progress.step += 1
            progress.samples += config.global_batch
            window_steps += 1

            if progress.step % STOP_CHECK_EVERY == 0:
                # Every rank learns whether any rank was told to stop.
                flag = torch.tensor([float(stop.requested)], device=device)
                dist.all_reduce(flag, op=dist.ReduceOp.MAX)
                stopping = bool(flag.item())

            finished = progress.step == config.steps
            if progress.step % config.log_every == 0 or finished or stopping:
                dist.all_reduce(loss_sum, op=dist.ReduceOp.SUM)
                elapsed = time.perf_counter() - window_start
                record = {
                    "step": progress.step,
                    "loss": round(loss_sum.item() / window_steps, 4),
                    "grad_norm": round(norm_sum.item() / window_steps, 4),
                    "lr": round(lr_at(progress.step - 1, config), 7),
                    "tokens_per_s": round(tokens_per_step * window_steps / elapsed, 1),
                    "step_time_s": round(elapsed / window_steps, 4),
                    "samples": progress.samples,
                }
                if peak:
                    record["mfu"] = mfu(
                        model_config.flops_per_token(), record["tokens_per_s"], peak, world
                    )
                logger.log(record)
                loss_sum.zero_()
                norm_sum.zero_()
                window_start, window_steps = time.perf_counter(), 0
            # Evaluation and saves are timed apart: throughput windows measure training alone.
            if progress.step % config.eval_every == 0 or finished:
                eval_start = time.perf_counter()
                val_loss = validation_loss(model, held_out, config, device, autocast)
                logger.log({"step": progress.step, "val_loss": round(val_loss, 4)})
                window_start += time.perf_counter() - eval_start
            if stopping or finished or progress.step % config.checkpoint_every == 0:
                save_start = time.perf_counter()
                checkpointer.save(state, progress.step)
                blocked = time.perf_counter() - save_start
                window_start += blocked
                logger.log(
                    {
                        "event": "checkpoint",
                        "step": progress.step,
                        "async": config.async_save,
                        "blocked_s": round(blocked, 3),
                    }
                )

        wait_start = time.perf_counter()
        checkpointer.wait()
        final_wait = time.perf_counter() - wait_start
        elapsed = time.perf_counter() - loop_start
        digests = [None] * world
        dist.all_gather_object(digests, param_digest(model) if config.parallel == "ddp" else None)
        logger.log(
            {
                "event": "stopped" if stopping else "done",
                "step": progress.step,
                "samples": progress.samples,
                "final_wait_s": round(final_wait, 3),
                "elapsed_s": round(elapsed, 3),
                "param_digests": digests,
            }
        )
        return 0


def main(argv: list[str] | None = None) -> int:
    try:
        return train(parse_args(argv))
    except OptionsError as e:
        message, usage_text = str(e), options_usage()
    except InputError as e:
        message, usage_text = str(e), ""
    text = f"{usage_text}python -m trainer: error: {message}"
    if handoff := os.environ.get(INPUT_ERROR_FILE):
        # The launcher says it, once, and stops every worker (this one is killed while it
        # waits): a worker printing it could be killed before its line was out.
        partial = Path(f"{handoff}.{os.getpid()}")
        partial.write_text(text)
        partial.replace(handoff)  # whole or absent, whichever rank gets there first
        time.sleep(60)
    elif os.environ.get("RANK", "0") == "0":  # every rank found the same; one says it
        print(text, file=sys.stderr, flush=True)
    return 2
