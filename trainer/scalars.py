"""The run's curves as TensorBoard scalars, beside its checkpoints: `<checkpoint-dir>/tensorboard`.

Rank 0 writes them (torch.utils.tensorboard's SummaryWriter, the `tensorboard` package's event
file format). In a local, FSx or EFS folder the event file is flushed at every logged record, so
a TensorBoard reading the folder sees the run as it trains. S3 has no append: for s3:// the file
is written in a temporary folder and uploaded whole at most every UPLOAD_SECONDS, at every
checkpoint and at the end; TensorBoard reads s3:// logdirs itself (boto3). An upload that fails
is reported and tried again at the next one: a curve never stops a training run.

Every run (a resumed one too) opens its own event file with a SessionLog START at the first step
it will log, one past the checkpoint it starts from (SummaryWriter's purge_step). TensorBoard
drops the points an earlier attempt logged from that step on, after that checkpoint, so a
restarted run continues one curve instead of drawing a second one over it. (TensorBoard's Python
loader, which reads s3://, takes the first START of a run for its beginning and purges only at
later ones: that is why a fresh run writes one too.)
"""

import sys
import tempfile
import time
from pathlib import Path

from trainer.checkpoint import LocalStore, S3Store

FOLDER = "tensorboard"
# The JSON-lines record's keys (trainer.train) and the TensorBoard tags they are shown under.
TAGS = {
    "loss": "loss/train",
    "val_loss": "loss/validation",
    "lr": "optimizer/learning_rate",
    "grad_norm": "optimizer/grad_norm",
    "tokens_per_s": "throughput/tokens_per_s",
    "mfu": "throughput/mfu",
}
UPLOAD_SECONDS = 30


class Scalars:
    """The scalars of one run (one attempt: a restart opens another), for rank 0."""

    def __init__(self, store: LocalStore | S3Store, first_step: int):
        self.store = store
        self.first_step = first_step
        self.writer = None  # opened at the first scalar: a run that logs none leaves no file
        self.uploaded_at = 0.0
        self.staging = None  # for S3: the folder the event file is written in

    def _open(self):
        from torch.utils.tensorboard import SummaryWriter

        if isinstance(self.store, S3Store):
            self.staging = tempfile.TemporaryDirectory(prefix="trainer-tensorboard-")
            folder = self.staging.name
        else:
            folder = self.store.root / FOLDER
        return SummaryWriter(str(folder), purge_step=self.first_step)

    def add(self, record: dict) -> None:
        """The record's scalars at its step; a checkpoint record uploads what S3 lacks."""
        values = {TAGS[key]: value for key, value in record.items() if key in TAGS}
        if values:
            self.writer = self.writer or self._open()
            for tag, value in values.items():
                self.writer.add_scalar(tag, value, record["step"])
            self.writer.flush()
        if time.monotonic() - self.uploaded_at >= UPLOAD_SECONDS or "event" in record:
            self.upload()

    def upload(self) -> None:
        if self.staging is None:
            return
        self.uploaded_at = time.monotonic()
        for path in Path(self.staging.name).iterdir():
            try:
                self.store.upload(path, f"{FOLDER}/{path.name}")
            except Exception as e:  # botocore's errors, whatever the cause: try again later
                print(
                    f"trainer: could not upload {path.name} to {self.store.uri}/{FOLDER} ({e}); "
                    "trying again later",
                    file=sys.stderr,
                    flush=True,
                )

    def close(self) -> None:
        if self.writer is None:
            return
        self.writer.close()
        self.upload()
        if self.staging is not None:
            self.staging.cleanup()
