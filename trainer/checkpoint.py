"""Sharded, atomic checkpoints with torch.distributed.checkpoint (DCP), on a path or in S3.

A checkpoint is `<root>/step-NNNNNNNN/`; it counts only once the `COMMITTED` marker exists, which
rank 0 writes after every rank has finished writing. A crash mid-save leaves an uncommitted
folder that resume ignores and pruning removes, so the last good checkpoint is never at risk.
A committed checkpoint that cannot be read is skipped on resume and set aside under
`unreadable-step-NNNNNNNN`, never deleted. DCP reshards on load, so a run saved on N workers
resumes on M.
"""

import os
import re
import shutil
import sys
import threading
from concurrent.futures import Future
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

MARKER = "COMMITTED"
_STEP = re.compile(r"step-(\d{8})")
SET_ASIDE = "unreadable-"


def step_name(step: int) -> str:
    return f"step-{step:08d}"


def step_folders(names) -> tuple[list[int], list[int]]:
    """(committed, uncommitted) steps, ascending, among the names found in a checkpoint folder:
    `step-NNNNNNNN` and `step-NNNNNNNN/<file>`, relative to it (S3 keys, `find` output)."""
    seen, committed = set(), set()
    for name in names:
        folder, _, file = name.partition("/")
        if match := _STEP.fullmatch(folder):
            seen.add(int(match.group(1)))
            if file == MARKER:
                committed.add(int(match.group(1)))
    return sorted(committed), sorted(seen - committed)


class LocalStore:
    """Checkpoints in a local or shared (FSx for Lustre, EFS) directory."""

    def __init__(self, root: str):
        self.root = Path(root)

    def steps(self) -> tuple[list[int], list[int]]:
        """(committed, uncommitted) steps, ascending."""
        if not self.root.is_dir():
            return [], []
        found = [
            (int(m.group(1)), p) for p in self.root.iterdir() if (m := _STEP.fullmatch(p.name))
        ]
        committed = sorted(s for s, p in found if (p / MARKER).exists())
        uncommitted = sorted(s for s, p in found if not (p / MARKER).exists())
        return committed, uncommitted

    def writer(self, step: int):
        return dcp.FileSystemWriter(self.root / step_name(step))

    def reader(self, step: int):
        return dcp.FileSystemReader(self.root / step_name(step))

    def commit(self, step: int) -> None:
        marker = self.root / step_name(step) / MARKER
        marker.write_text(f"{step}\n")
        _fsync_dir(marker.parent)

    def delete(self, step: int) -> None:
        shutil.rmtree(self.root / step_name(step), ignore_errors=True)

    def set_aside(self, step: int) -> None:
        (self.root / step_name(step)).rename(self.root / (SET_ASIDE + step_name(step)))

    def probe(self, rank: int) -> None:
        """Raises OSError unless this rank can create the folder and write files in it."""
        self.root.mkdir(parents=True, exist_ok=True)
        probe = self.root / f".write-probe-{rank}-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()

    def where(self, step: int) -> str:
        return str(self.root / step_name(step))


class S3Store:
    """Checkpoints under s3://bucket/prefix, written by s3torchconnector's DCP writer."""

    def __init__(self, uri: str):
        import boto3

        bucket, _, prefix = uri.removeprefix("s3://").partition("/")
        self.uri = uri.rstrip("/")
        self.bucket, self.prefix = bucket, prefix.strip("/")
        # The bucket's region, which s3torchconnector needs: the environment's, else the AWS
        # profile's.
        self.region = (
            os.environ.get("AWS_REGION") or boto3.session.Session().region_name or "us-east-1"
        )
        self.s3 = boto3.client("s3", region_name=self.region)

    def _key(self, step: int, name: str = "") -> str:
        return "/".join(p for p in (self.prefix, step_name(step), name) if p)

    def _keys(self) -> list[str]:
        from trainer import s3_folder  # boto3, as above: only for S3 checkpoints

        prefix = f"{self.prefix}/" if self.prefix else ""
        return [o["Key"] for o in s3_folder.objects(self.s3, self.bucket, prefix)]

    def steps(self) -> tuple[list[int], list[int]]:
        start = len(self.prefix) + 1 if self.prefix else 0
        return step_folders(key[start:] for key in self._keys())

    def writer(self, step: int):
        from s3torchconnector.dcp import S3StorageWriter

        return S3StorageWriter(region=self.region, path=f"{self.uri}/{step_name(step)}")

    def reader(self, step: int):
        from s3torchconnector.dcp import S3StorageReader

        return S3StorageReader(region=self.region, path=f"{self.uri}/{step_name(step)}")

    def commit(self, step: int) -> None:
        self.s3.put_object(
            Bucket=self.bucket, Key=self._key(step, MARKER), Body=f"{step}\n".encode()
        )

    def delete(self, step: int) -> None:
        prefix = self._key(step) + "/"
        for key in [k for k in self._keys() if k.startswith(prefix)]:
            self.s3.delete_object(Bucket=self.bucket, Key=key)

    def set_aside(self, step: int) -> None:
        prefix = self._key(step) + "/"
        for key in [k for k in self._keys() if k.startswith(prefix)]:
            moved = key.replace(step_name(step), SET_ASIDE + step_name(step), 1)
            source = {"Bucket": self.bucket, "Key": key}
            self.s3.copy_object(Bucket=self.bucket, Key=moved, CopySource=source)
            self.s3.delete_object(Bucket=self.bucket, Key=key)

    def upload(self, path: Path, name: str) -> None:
        """Put the local file `path` at `<prefix>/<name>`."""
        key = "/".join(p for p in (self.prefix, name) if p)
        self.s3.upload_file(str(path), self.bucket, key)

    def probe(self, rank: int) -> None:
        key = "/".join(p for p in (self.prefix, f".write-probe-{rank}-{os.getpid()}") if p)
        self.s3.put_object(Bucket=self.bucket, Key=key, Body=b"")
        self.s3.delete_object(Bucket=self.bucket, Key=key)

    def where(self, step: int) -> str:
        return f"{self.uri}/{step_name(step)}"


def open_store(uri: str) -> LocalStore | S3Store:
    return S3Store(uri) if uri.startswith("s3://") else LocalStore(uri)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class UnusableCheckpoint(ValueError):
    """Resuming is impossible: a checkpoint of another model's shape, or none readable."""


class Checkpointer:
    """Collective save/load: every rank calls every method, in the same order.

    Checkpoint collectives run on a process group of their own (gloo), so an async save's
    background thread never interleaves its collectives with training's on the default group;
    gloo also gives async save the CPU backend it needs when the default group is NCCL-only.
    """

    def __init__(
        self,
        store: LocalStore | S3Store,
        keep_last: int = 3,
        async_save: bool = False,
        timeout: timedelta = timedelta(minutes=10),
    ):
        self.store = store
        self.keep_last = keep_last
        self.async_save = async_save
        # How long a collective waits for a rank: a rank that stopped answering mid-save must
        # fail the others, not hold them (the default group's timeout does not apply here).
        self.group = dist.new_group(backend="gloo", timeout=timeout)
        self._pending: Future | None = None
        self.rank = dist.get_rank()

    def save(self, state: dict, step: int) -> None:
        self.wait()
        writer = self.store.writer(step)
        if self.async_save:
            # Blocks only while the state is staged to host memory; writing runs in DCP's thread
            # and the commit follows in ours the moment the write is done, not at the next save.
            written = dcp.async_save(state, storage_writer=writer, process_group=self.group)
            self._pending = Future()
            threading.Thread(
                target=self._commit_when_written,
                args=(step, written, self._pending),
                name="checkpoint-commit",
                daemon=True,  # a peer lost mid-save must not keep this process from exiting
            ).start()
        else:
            dcp.save(state, storage_writer=writer, process_group=self.group)
            self._commit(step)

    def _commit_when_written(self, step: int, written: Future, done: Future) -> None:
        try:
            written.result()
            self._commit(step)
            done.set_result(step)
        except BaseException as e:  # re-raised on the main thread by wait()
            done.set_exception(e)

    def wait(self) -> None:
        """Block until an async save still in flight is written and committed."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def _commit(self, step: int) -> None:
        dist.barrier(group=self.group)  # every rank's shards are written
        if self.rank == 0:
            self.store.commit(step)
            committed, uncommitted = self.store.steps()
            stale = committed[: -self.keep_last] + [s for s in uncommitted if s < step]
            for old in stale:
                self.store.delete(old)
        dist.barrier(group=self.group)

    def _agree(self, mine):
        """Every rank's value, so all ranks take the same branch."""
        values = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(values, mine, group=self.group)
        return values

    def committed(self) -> list[int]:
        """Committed steps, ascending, as rank 0 sees them, agreed by every rank."""
        found = [self.store.steps()[0] if self.rank == 0 else None]
        dist.broadcast_object_list(found, src=0, group=self.group)
        return found[0]

    def latest(self) -> int | None:
        committed = self.committed()
        return committed[-1] if committed else None

    def load(self, state: dict, step: int) -> None:
        dcp.load(state, storage_reader=self.store.reader(step), process_group=self.group)

    def restore(self, state: dict, shapes: dict[str, torch.Size]) -> tuple[int | None, list[str]]:
        """Load the newest readable committed checkpoint; (its step, the unreadable ones).

        `shapes` maps flattened state keys to the shapes this run expects: a checkpoint that
        holds other shapes raises UnusableCheckpoint instead of being loaded. Newer checkpoints
        that could not be read are set aside, so later saves and pruning never touch them.
        """
        unreadable: list[tuple[int, str]] = []
        restored = None
        for step in reversed(self.committed()):
            try:
                saved = self.store.reader(step).read_metadata().state_dict_metadata
                error = None
            except Exception as e:  # any failure to read means this checkpoint cannot be used
                saved, error = None, f"{type(e).__name__}: {e}"
            errors = [e for e in self._agree(error) if e]
            if not errors and (why := misfit(saved, shapes)):
                raise UnusableCheckpoint(
                    f"checkpoint {self.store.where(step)} does not fit this model: {why}"
                )
            if not errors:
                try:
                    self.load(state, step)
                except CheckpointException as e:
                    errors = [str(e).splitlines()[0]]
            if not errors:
                restored = step
                break
            unreadable.append((step, errors[0]))
            if self.rank == 0:
                print(
                    f"trainer: checkpoint {self.store.where(step)} is unreadable "
                    f"({errors[0][:300]}); trying the one before",
                    file=sys.stderr,
                    flush=True,
                )
        if unreadable and restored is None:
            raise UnusableCheckpoint(
                f"no readable checkpoint among {len(unreadable)} committed ones in "
                f"{self.store.where(unreadable[0][0]).rsplit('/', 1)[0]}; move them away "
                "to start from scratch"
            )
        if self.rank == 0:
            for step, _ in unreadable:
                self.store.set_aside(step)
        dist.barrier(group=self.group)
        return restored, [self.store.where(step) for step, _ in unreadable]


def misfit(saved: dict, shapes: dict[str, torch.Size]) -> str | None:
    """Where a checkpoint's tensors (`saved`: its metadata's state_dict_metadata) differ from
    `shapes` (flattened state keys -> the shapes expected); None if all are there as expected."""
    for key, shape in shapes.items():
        there = getattr(saved.get(key), "size", None)
        if there is None or tuple(there) != tuple(shape):
            found = "missing" if there is None else list(there)
            return f"{key} is {found} there, {list(shape)} here"
    return None
