"""Sharded, atomic checkpoints with torch.distributed.checkpoint (DCP), on a path or in S3.

A checkpoint is `<root>/step-NNNNNNNN/`; it counts only once the `COMMITTED` marker exists, which
rank 0 writes after every rank has finished writing. A crash mid-save leaves an uncommitted
folder that resume ignores and pruning removes, so the last good checkpoint is never at risk.
DCP reshards on load, so a run saved on N workers resumes on M.
"""

import os
import re
import shutil
from concurrent.futures import Future
from pathlib import Path

import torch.distributed as dist
import torch.distributed.checkpoint as dcp

MARKER = "COMMITTED"
_STEP = re.compile(r"step-(\d{8})")


def step_name(step: int) -> str:
    return f"step-{step:08d}"


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


class S3Store:
    """Checkpoints under s3://bucket/prefix, written by s3torchconnector's DCP writer."""

    def __init__(self, uri: str):
        import boto3

        bucket, _, prefix = uri.removeprefix("s3://").partition("/")
        self.uri = uri.rstrip("/")
        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.region = (
            os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        )
        self.s3 = boto3.client("s3", region_name=self.region)

    def _key(self, step: int, name: str = "") -> str:
        return "/".join(p for p in (self.prefix, step_name(step), name) if p)

    def _keys(self) -> list[str]:
        keys, token = [], None
        while True:
            kwargs = {"Bucket": self.bucket, "Prefix": f"{self.prefix}/" if self.prefix else ""}
            if token:
                kwargs["ContinuationToken"] = token
            page = self.s3.list_objects_v2(**kwargs)
            keys += [o["Key"] for o in page.get("Contents", [])]
            if not page.get("IsTruncated"):
                return keys
            token = page["NextContinuationToken"]

    def steps(self) -> tuple[list[int], list[int]]:
        keys = self._keys()
        seen = {int(m.group(1)) for k in keys if (m := _STEP.search(k))}
        committed = {s for s in seen if self._key(s, MARKER) in keys}
        return sorted(committed), sorted(seen - committed)

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


def open_store(uri: str) -> LocalStore | S3Store:
    return S3Store(uri) if uri.startswith("s3://") else LocalStore(uri)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Checkpointer:
    """Collective save/load: every rank calls every method, in the same order."""

    def __init__(self, store: LocalStore | S3Store, keep_last: int = 3, async_save: bool = False):
        self.store = store
        self.keep_last = keep_last
        self.async_save = async_save
        self._pending: tuple[int, Future] | None = None
        self.rank = dist.get_rank()

    def save(self, state: dict, step: int) -> None:
        self.wait()
        writer = self.store.writer(step)
        if self.async_save:
            # Blocks only while the state is staged to host memory; writing runs in the background.
            self._pending = (step, dcp.async_save(state, storage_writer=writer))
        else:
            dcp.save(state, storage_writer=writer)
            self._commit(step)

    def wait(self) -> None:
        """Finish and commit an async save still in flight."""
        if self._pending is not None:
            step, future = self._pending
            self._pending = None
            future.result()
            self._commit(step)

    def _commit(self, step: int) -> None:
        dist.barrier()  # every rank's shards are written
        if self.rank == 0:
            self.store.commit(step)
            committed, uncommitted = self.store.steps()
            stale = committed[: -self.keep_last] + [s for s in uncommitted if s < step]
            for old in stale:
                self.store.delete(old)
        dist.barrier()

    def latest(self) -> int | None:
        """Newest committed step, as rank 0 sees it, agreed by every rank."""
        found = [self.store.steps()[0][-1:] if self.rank == 0 else None]
        dist.broadcast_object_list(found, src=0)
        return found[0][0] if found[0] else None

    def load(self, state: dict, step: int) -> None:
        dcp.load(state, storage_reader=self.store.reader(step))
