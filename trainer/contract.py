"""An optional helper for your own training script: save, resume and stop the way the platform
expects, in a few lines. A script that ignores it runs all the same (trainer.user_code gives
every script the same variables).

    from trainer.contract import Checkpoints, StopSignal

    stop = StopSignal()                      # SIGTERM/SIGINT become a flag
    checkpoints = Checkpoints()              # $CHECKPOINT_DIR, else ./checkpoints
    step, state = checkpoints.newest()       # (0, None) on a fresh start
    ...
    while step < steps:
        ...train one step...
        step += 1
        if stop.agreed() or step % 100 == 0:  # every rank stops at the same step
            checkpoints.save(step, {"model": model.state_dict(), ...})
        if stop.agreed():
            break

`save` writes on rank 0 only (torch.save to a temporary name, then a rename: a reader, or the
next start, never sees half a file), keeps the newest `keep`, and waits for every rank, so the
checkpoint exists when the ranks go on or exit. `agreed()` all-reduces the flag when a process
group is up, so a SIGTERM to one node's pod stops every rank at the same step.
"""

import os
import re
import signal
from pathlib import Path

NAME = re.compile(r"^step-(\d{8})\.pt$")


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


class StopSignal:
    """SIGTERM (a drained node, a deleted job) and SIGINT (Ctrl-C) as a flag to check between
    steps, so a step is never cut in half."""

    def __init__(self):
        self.requested = False
        for number in (signal.SIGTERM, signal.SIGINT):
            signal.signal(number, self._handle)

    def _handle(self, number, frame) -> None:
        self.requested = True

    def agreed(self) -> bool:
        """Whether any rank was asked to stop (every rank gets the same answer)."""
        import torch
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return self.requested
        flag = torch.tensor([float(self.requested)])
        if dist.get_backend() == "nccl":
            flag = flag.cuda()
        dist.all_reduce(flag)
        return bool(flag.item())


class Checkpoints:
    """`step-NNNNNNNN.pt` files in a folder: $CHECKPOINT_DIR, else `folder`."""

    def __init__(self, folder: str | Path | None = None, keep: int = 3):
        self.folder = Path(folder or os.environ.get("CHECKPOINT_DIR") or "checkpoints")
        self.keep = keep

    def steps(self) -> list[int]:
        if not self.folder.is_dir():
            return []
        return sorted(int(m[1]) for p in self.folder.iterdir() if (m := NAME.match(p.name)))

    def newest(self, map_location="cpu") -> tuple[int, object]:
        """(step, what was saved) of the newest checkpoint, or (0, None)."""
        import torch

        found = self.steps()
        if not found:
            return 0, None
        path = self.folder / f"step-{found[-1]:08d}.pt"
        return found[-1], torch.load(path, map_location=map_location, weights_only=False)

    def save(self, step: int, state) -> None:
        import torch

        if _rank() == 0:
            self.folder.mkdir(parents=True, exist_ok=True)
            final = self.folder / f"step-{step:08d}.pt"
            partial = self.folder / f".step-{step:08d}.pt.partial"
            torch.save(state, partial)
            os.replace(partial, final)
            for old in self.steps()[: -self.keep]:
                (self.folder / f"step-{old:08d}.pt").unlink(missing_ok=True)
        _barrier()
