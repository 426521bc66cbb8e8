"""A small CNN that learns to tell four kinds of 16x16 pictures apart (bars across, bars down,
diagonals, boxes), drawn with noise from a fixed seed: no download, any machine. Plain PyTorch
DDP as you would write it anywhere; what it takes from the platform is four variables.

    torchrun --standalone --nproc-per-node 2 train.py --epochs 4

- CHECKPOINT_DIR: checkpoints (plain torch.save files); a restarted run resumes from the newest.
- TENSORBOARD_DIR: the loss curves (the team's TensorBoard shows them).
- OUTPUT_DIR: what the run made (the model), for `devctl fetch`.
- SIGTERM (a drained node, `devctl delete`): finish the step, checkpoint, exit 0.
Unset, all three folders default to ./run.
"""

import argparse
import os
import signal
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.tensorboard import SummaryWriter


def pictures(count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 4, (count,), generator=g)
    images = torch.rand(count, 1, 16, 16, generator=g) * 0.6
    where = torch.randint(2, 14, (count,), generator=g)
    for i, (label, at) in enumerate(zip(labels.tolist(), where.tolist(), strict=True)):
        if label == 0:
            images[i, 0, at, :] += 1
        elif label == 1:
            images[i, 0, :, at] += 1
        elif label == 2:
            images[i, 0].diagonal().add_(1)
        else:
            images[i, 0, 3:13, 3] += 1
            images[i, 0, 3:13, 12] += 1
            images[i, 0, 3, 3:13] += 1
            images[i, 0, 12, 3:13] += 1
    return images, labels


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.head = nn.Linear(16 * 4 * 4, 4)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.head(x.flatten(1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--samples", type=int, default=2048)
    args = parser.parse_args()

    stop = {"asked": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(asked=True))
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{os.environ['LOCAL_RANK']}" if cuda else "cpu")
    checkpoints = Path(os.environ.get("CHECKPOINT_DIR", "run"))
    outputs = Path(os.environ.get("OUTPUT_DIR", "run"))

    torch.manual_seed(0)
    model = Net().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    step, saved = 0, sorted(checkpoints.glob("step-*.pt"))
    if saved:
        state = torch.load(saved[-1], map_location=device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
        if rank == 0:
            print(f"resumed from {saved[-1].name}", flush=True)
    ddp = DistributedDataParallel(model)
    images, labels = pictures(args.samples, seed=1)
    mine = torch.arange(rank, args.samples, world)  # each rank its own share
    per_epoch = len(mine) // args.batch
    # TensorBoard drops what an earlier attempt logged after the checkpoint: one curve.
    writer = SummaryWriter(os.environ.get("TENSORBOARD_DIR", "run"), purge_step=step + 1)

    def save() -> None:
        if rank == 0:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
            torch.save(state, checkpoints / f".step-{step:08d}.tmp")
            os.replace(checkpoints / f".step-{step:08d}.tmp", checkpoints / f"step-{step:08d}.pt")
            print(f"checkpoint step {step}", flush=True)
        dist.barrier()

    stopped = False
    while step < args.epochs * per_epoch:
        batch = mine[(step % per_epoch) * args.batch :][: args.batch]
        x, y = images[batch].to(device), labels[batch].to(device)
        loss = F.cross_entropy(ddp(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if rank == 0:
            writer.add_scalar("loss/train", loss.item(), step)
            if step % 10 == 0:
                print(f"step {step} loss {loss.item():.4f}", flush=True)
        # Every rank stops at the same step: any rank's signal stops them all.
        asked = torch.tensor(float(stop["asked"]))
        dist.all_reduce(asked)
        if asked.item() or step % per_epoch == 0:
            save()
        if stopped := bool(asked.item()):
            break

    if rank == 0 and not stopped:
        with torch.no_grad():
            test_x, test_y = pictures(512, seed=2)
            accuracy = (model(test_x.to(device)).argmax(1).cpu() == test_y).float().mean().item()
        print(f"done at step {step}: test accuracy {accuracy:.3f}", flush=True)
        torch.save(model.state_dict(), outputs / "model.pt")
        (outputs / "accuracy.txt").write_text(f"{accuracy:.4f}\n")
    writer.close()
    # A rank that tears gloo down under a live DDP reducer, or while rank 0 still evaluates, can
    # abort at exit; torch 2.13's gloo still does, rarely, in the interpreter's own teardown after
    # all of this, so once every output is written the process leaves without it.
    del ddp
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
