"""The training loop: elastic DDP or FSDP2, fixed global batch, resume from the newest checkpoint.

    torchrun --standalone --nproc-per-node 2 -m trainer --steps 200
    python -m trainer --steps 50            # a single process works too

On SIGTERM (Spot interruption, Karpenter drain, `kubectl delete`) every rank finishes its step,
a checkpoint is saved, and the process exits 0 well inside the pod's grace period.
"""

import gc
import hashlib
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
from torch.nn.parallel import DistributedDataParallel

from trainer.checkpoint import Checkpointer, open_store
from trainer.data import TokenData, ensure_default_tokens
from trainer.model import GPT, PRESETS
from trainer.options import TrainConfig, parse_args

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


class Progress(Stateful):
    """What the run has consumed: steps taken and the global sample counter."""

    def __init__(self):
        self.step = 0
        self.samples = 0

    def state_dict(self):
        return {"step": torch.tensor(self.step), "samples": torch.tensor(self.samples)}

    def load_state_dict(self, state):
        self.step, self.samples = int(state["step"]), int(state["samples"])


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


def init_distributed() -> tuple[int, int, torch.device]:
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
        )
    else:
        dist.init_process_group(backend)
    return dist.get_rank(), dist.get_world_size(), device


def lr_at(step: int, config: TrainConfig) -> float:
    """Linear warmup, then cosine decay to 10%; a function of the step alone, so resumable."""
    if step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    progress = (step - config.warmup) / max(1, config.steps - config.warmup)
    return config.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * min(progress, 1.0))))


def param_digest(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(get_model_state_dict(model).items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


class Logger:
    """Rank 0 only: JSON lines to a file and stdout, a progress line on a terminal."""

    def __init__(self, rank: int, path: str, total_steps: int):
        self.enabled = rank == 0
        if self.enabled and path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.file = open(path, "a") if self.enabled and path else None  # noqa: SIM115
        self.total = total_steps
        self.tty = sys.stderr.isatty()

    def log(self, record: dict) -> None:
        if not self.enabled:
            return
        line = json.dumps(record)
        if self.file:
            self.file.write(line + "\n")
            self.file.flush()
        if self.tty and "loss" in record:
            done = int(30 * record["step"] / self.total)
            sys.stderr.write(
                f"\r[{'#' * done}{'.' * (30 - done)}] step {record['step']}/{self.total} "
                f"loss {record['loss']:.3f} {record['tokens_per_s']:,.0f} tok/s"
            )
            sys.stderr.flush()
        else:
            print(line, flush=True)


def build_model(config: TrainConfig, device: torch.device, world: int) -> torch.nn.Module:
    torch.manual_seed(config.seed)  # every rank starts from the same weights
    model = GPT(PRESETS[config.model]).to(device)
    if config.parallel == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    elif world > 1:  # with one worker DDP would only copy gradients around
        model = DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    if config.compile and device.type == "cuda":
        model = torch.compile(model)
    return model


def train(config: TrainConfig) -> int:
    rank, world, device = init_distributed()
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
    data = TokenData(
        Path(config.data) if config.data else ensure_default_tokens(), model_config.seq_len
    )

    model = build_model(config, device, world)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.lr, betas=(0.9, 0.95), weight_decay=config.weight_decay
    )
    progress = Progress()
    state = {"train": ModelAndOptimizer(model, optimizer), "progress": progress}
    checkpointer = Checkpointer(
        open_store(config.checkpoint_dir), config.keep_last, config.async_save
    )
    logger = Logger(rank, config.metrics, config.steps)
    resumed = checkpointer.latest()
    if resumed is not None:
        checkpointer.load(state, resumed)
    logger.log(
        {
            "event": "start",
            "world_size": world,
            "accumulation": accumulation,
            "resumed_from": resumed,
            "step": progress.step,
            "samples": progress.samples,
            "params": model_config.params(),
            "config": asdict(config),
        }
    )

    stop = StopOnSignal()
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16)
        if config.bf16 and device.type == "cuda"
        else nullcontext()
    )
    peak = next(
        (
            f
            for name, f in PEAK_FLOPS.items()
            if device.type == "cuda" and name in torch.cuda.get_device_name(device)
        ),
        None,
    )
    tokens_per_step = config.global_batch * model_config.seq_len
    loss_sum = torch.zeros((), device=device)
    window_start, window_steps = time.perf_counter(), 0
    while progress.step < config.steps:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(progress.step, config)
        mine = range(progress.samples + rank, progress.samples + config.global_batch, world)
        for micro in range(accumulation):
            samples = list(mine[micro * config.micro_batch : (micro + 1) * config.micro_batch])
            tokens, targets = data.batch(samples or [mine.start])
            # Gradients are averaged over ranks; this weight makes the result the mean over the
            # whole global batch, however unevenly it was split.
            weight = len(samples) * world / config.global_batch
            last = micro == accumulation - 1
            ddp = isinstance(model, DistributedDataParallel)
            sync = model.no_sync() if ddp and not last else nullcontext()
            with sync, autocast:
                loss = model(
                    tokens.to(device, non_blocking=True), targets.to(device, non_blocking=True)
                )
                (loss * weight).backward()
            loss_sum += loss.detach() * len(samples) / config.global_batch
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        progress.step += 1
        progress.samples += config.global_batch
        window_steps += 1

        # One tiny collective a step: every rank learns whether any rank was told to stop.
        flag = torch.tensor([float(stop.requested)], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        stopping = bool(flag.item())

        if progress.step % config.log_every == 0 or progress.step == config.steps or stopping:
            dist.all_reduce(loss_sum, op=dist.ReduceOp.SUM)
            elapsed = time.perf_counter() - window_start
            record = {
                "step": progress.step,
                "loss": round(loss_sum.item() / window_steps, 4),
                "lr": round(lr_at(progress.step - 1, config), 7),
                "tokens_per_s": round(tokens_per_step * window_steps / elapsed, 1),
                "step_time_s": round(elapsed / window_steps, 4),
                "samples": progress.samples,
            }
            if peak:
                record["mfu"] = round(
                    model_config.flops_per_token() * record["tokens_per_s"] / (peak * world), 4
                )
            logger.log(record)
            loss_sum.zero_()
            window_start, window_steps = time.perf_counter(), 0
        if (
            stopping
            or progress.step % config.checkpoint_every == 0
            or progress.step == config.steps
        ):
            save_start = time.perf_counter()
            checkpointer.save(state, progress.step)
            blocked = time.perf_counter() - save_start
            window_start += blocked  # throughput windows measure training; saves are logged apart
            logger.log(
                {
                    "event": "checkpoint",
                    "step": progress.step,
                    "async": config.async_save,
                    "blocked_s": round(blocked, 3),
                }
            )
            if stopping:
                break

    checkpointer.wait()
    digests = [None] * world
    dist.all_gather_object(digests, param_digest(model) if config.parallel == "ddp" else None)
    logger.log(
        {
            "event": "stopped" if stopping else "done",
            "step": progress.step,
            "samples": progress.samples,
            "param_digests": digests,
        }
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    return train(parse_args(argv))
