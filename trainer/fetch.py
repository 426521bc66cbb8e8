"""Get a job's model: its newest committed checkpoint, as one file for `python -m trainer.sample`.

    python -m trainer.fetch s3://BUCKET/checkpoints/TEAM/JOB --out model.pt
    python -m trainer.fetch build/checkpoints/local --out model.pt
    python -m trainer.fetch /efs/checkpoints/JOB --namespace TEAM --image IMAGE --out model.pt
    python -m trainer.fetch s3://BUCKET/checkpoints/TEAM/JOB --namespace TEAM --image IMAGE

A checkpoint counts once it is committed (trainer.checkpoint). S3 is read directly with the
user's AWS credentials, a local or mounted folder directly; with --namespace, a job's FSx or EFS
folder or S3 prefix is read through a short-lived pod on the cluster, with the team's claims or
the team's AWS identity (trainer.cluster_copy). The DCP shards are
read for the model's parameters alone (no optimizer state) and saved with the model's preset and
shape, which the checkpoint does not record: they are recognised by the parameters' shapes.
"""

import argparse
import sys
import tempfile
import warnings
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError
from s3torchconnectorclient import S3Exception
from torch.distributed.checkpoint.api import CheckpointException

from trainer.checkpoint import LocalStore, S3Store, misfit, open_store
from trainer.cluster_copy import CLAIMS, PodFolder, claim_of, in_s3
from trainer.model import GPT, state_digest
from trainer.presets import PRESETS
from trainer.train import MODEL_KEYS

PROG = "python -m trainer.fetch"


class FetchError(Exception):
    """What the user must fix or know: one line, exit status 2."""


def newest_committed(steps: tuple[list[int], list[int]], where: str) -> int:
    committed, uncommitted = steps
    if not committed:
        partial = (
            f" ({len(uncommitted)} uncommitted: being saved, or cut short)" if uncommitted else ""
        )
        raise FetchError(f"no committed checkpoint in {where}{partial}")
    return committed[-1]


def preset_of(saved: dict) -> str | None:
    """The preset whose parameters a checkpoint holds (`saved`: its state_dict_metadata); the
    presets differ in shape."""
    for name, config in PRESETS.items():
        with torch.device("meta"):
            shapes = {MODEL_KEYS + k: v.shape for k, v in GPT(config).state_dict().items()}
        if misfit(saved, shapes) is None:
            return name
    return None


def model_file(store: LocalStore | S3Store, step: int) -> dict:
    """The model of checkpoint `step` as `python -m trainer.sample` reads it."""
    name = preset_of(store.reader(step).read_metadata().state_dict_metadata)
    if name is None:
        raise FetchError(
            f"{store.where(step)} holds no model of the trainer's presets ({', '.join(PRESETS)})"
        )
    config = PRESETS[name]
    state = {MODEL_KEYS + k: v for k, v in GPT(config).state_dict().items()}
    # Only the keys asked for are read, in this one process (DCP warns that it is one).
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp.load(state, storage_reader=store.reader(step), no_dist=True)
    return {
        "model": name,
        "config": asdict(config),
        "step": step,
        "source": store.where(step),
        "state_dict": {k.removeprefix(MODEL_KEYS): v for k, v in state.items()},
    }


def fetch(source: str, namespace: str, image: str, queue: str, start_timeout: float) -> dict:
    if namespace:
        if not image:
            raise FetchError("--namespace needs --image: the trainer image the job runs")
        if not in_s3(source):
            try:
                claim_of(source)
            except ValueError as e:
                why = f"{e}: only those and S3 are read through the cluster"
                raise FetchError(why) from None
        with tempfile.TemporaryDirectory(prefix="trainer-fetch-") as copy:
            with PodFolder(namespace, source, image, queue, start_timeout) as folder:
                step = newest_committed(folder.steps(), f"{source} (namespace {namespace})")
                folder.copy(step, Path(copy))
            found = model_file(LocalStore(copy), step)
        return found | {"source": folder.where(step)}
    store = open_store(source)
    if isinstance(store, LocalStore) and not store.root.is_dir():
        hint = ""
        if any(source.startswith(mount + "/") for mount in CLAIMS):
            hint = "; a job's FSx or EFS folder is read through the cluster: add --namespace TEAM"
        raise FetchError(f"{source}: no such folder here{hint}")
    return model_file(store, newest_committed(store.steps(), source))


def parser() -> argparse.ArgumentParser:
    found = argparse.ArgumentParser(
        prog=PROG,
        description="Fetch a job's newest committed checkpoint and convert it into one model "
        "file for `python -m trainer.sample`.",
    )
    found.add_argument(
        "source",
        help="the job's --checkpoint-dir: s3://bucket/prefix (read with your AWS credentials, or "
        "with --namespace with your team's), a local or mounted folder, or with --namespace its "
        "folder on the cluster's FSx or EFS (/fsx/checkpoints/JOB, /efs/checkpoints/JOB)",
    )
    found.add_argument(
        "--out", default="model.pt", help="the model file to write (default: %(default)s)"
    )
    found.add_argument(
        "--namespace",
        default="",
        help="read SOURCE on the cluster, through a short-lived pod in this namespace (your "
        "team's) that mounts the team's FSx or EFS claim, or reads S3 as the team's service "
        "account self-service-jobs; default: read SOURCE from here",
    )
    found.add_argument(
        "--image",
        default="",
        help="with --namespace: the trainer image the pod runs (the job's own, or its pool's "
        "runtime's); no default",
    )
    found.add_argument(
        "--queue",
        default="",
        help="with --namespace: the team's queue (LocalQueue) the pod waits in, as a team "
        "member's pods must (default: the namespace's one LocalQueue)",
    )
    found.add_argument(
        "--start-timeout",
        type=float,
        default=300.0,
        help="with --namespace: seconds to wait for the pod to start, its queue admitting it "
        "and a node coming up included (default: %(default)s)",
    )
    return found


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        model = fetch(args.source, args.namespace, args.image, args.queue, args.start_timeout)
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_name(f".{out.name}.partial")
        torch.save(model, partial)
        partial.replace(out)
    except FetchError as e:
        message = str(e)
    except (OSError, BotoCoreError, ClientError, S3Exception, CheckpointException) as e:
        # AWS, the Kubernetes API (trainer.cluster_copy), the file system: one line each.
        message = _one_line(e)
    else:
        print(
            f"wrote {out}: {model['model']} model, step {model['step']} of {model['source']}; "
            f"parameters sha256 {state_digest(model['state_dict'])}"
        )
        return 0
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2


def _one_line(error: BaseException) -> str:
    if isinstance(error, NoCredentialsError):
        return (
            "no AWS credentials found: run `aws sso login` or `aws configure`, or set AWS_PROFILE"
        )
    if isinstance(error, CheckpointException):  # DCP's: every rank's failure, with tracebacks
        error = next(iter(error.failures.values()), error)
    lines = str(error).strip().splitlines()
    return (
        lines[0]
        if lines and isinstance(error, OSError)
        else f"{type(error).__name__}: {lines[0] if lines else ''}"
    )


if __name__ == "__main__":
    sys.exit(main())
