"""`storage`: the training bucket, EFS and FSx for Lustre."""

from typing import Literal

from pydantic import (
    Field,
    model_validator,
)

from infra.config.base import Model

# S3 prefix of job checkpoints in the training bucket (each job writes under its own subprefix).
CHECKPOINT_PREFIX = "checkpoints/"


class BucketConfig(Model):
    kms: bool = False  # SSE-KMS with a key of this stack; default SSE-S3
    checkpoint_retention_days: int = Field(default=30, ge=1, le=3650)
    force_destroy: bool = False  # let `pulumi destroy` delete a bucket that still holds objects


class EfsConfig(Model):
    enabled: bool = True


class FsxConfig(Model):
    """FSx for Lustre PERSISTENT_2, linked to the bucket's `datasetPrefix` (auto import/export)."""

    enabled: bool = False
    storage_capacity_gib: int = 1200
    throughput_per_tib: Literal[125, 250, 500, 1000] = 125
    dataset_prefix: str = Field(
        default="datasets", pattern=r"^[a-zA-Z0-9!_.*'()-]+(/[a-zA-Z0-9!_.*'()-]+)*$"
    )
    # Days FSx keeps its daily automatic backups (0 turns them off; FSx allows up to 90).
    backup_retention_days: int = Field(default=7, ge=0, le=90)

    @model_validator(mode="after")
    def _capacity(self) -> "FsxConfig":
        segments = self.dataset_prefix.split("/")
        if {".", ".."} & set(segments):
            raise ValueError(
                f"datasetPrefix {self.dataset_prefix!r} has a . or .. segment; allowed: a plain "
                "S3 prefix such as datasets or datasets/text"
            )
        checkpoints = CHECKPOINT_PREFIX.rstrip("/")
        if segments[0] == checkpoints:
            raise ValueError(
                f"datasetPrefix {self.dataset_prefix!r} lies under the checkpoint prefix "
                f"{CHECKPOINT_PREFIX}; allowed: a prefix outside it, such as datasets"
            )
        capacity = self.storage_capacity_gib
        if capacity != 1200 and (capacity < 2400 or capacity % 2400):
            raise ValueError(
                f"storageCapacityGib {capacity}; allowed for PERSISTENT_2 SSD: 1200 or a multiple "
                "of 2400 (2400, 4800, ...)"
            )
        return self


class StorageConfig(Model):
    bucket: BucketConfig = BucketConfig()
    efs: EfsConfig = EfsConfig()
    fsx: FsxConfig = FsxConfig()
