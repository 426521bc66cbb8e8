"""`storage`: the training bucket, EFS and FSx for Lustre."""

from typing import Any, Literal

from pydantic import (
    Field,
    model_validator,
)

from infra.core.config import Model, retired

# S3 prefix of job checkpoints in the training bucket (each job writes under its own subprefix).
CHECKPOINT_PREFIX = "checkpoints/"
# S3 prefix FSx exports its /checkpoints to (infra/storage/lustre.py), outside the above.
FSX_EXPORT_PREFIX = "fsx/checkpoints"


class BucketConfig(Model):
    """The training bucket: checkpoints and datasets; public access blocked, TLS only."""

    kms: bool = Field(
        default=False,
        description="SSE-KMS with a key of this stack (production buckets must); false: SSE-S3.",
    )
    checkpoint_retention_days: int = Field(
        default=30, ge=1, le=3650, description="Checkpoints expire after this many days."
    )
    noncurrent_version_days: int = Field(
        default=7,
        ge=1,
        le=365,
        description="Days S3 keeps an overwritten or deleted version of a checkpoint (under "
        "checkpoints/ and FSx's exports under fsx/checkpoints/) before it expires: versioning "
        "keeps every one, and each bills as much as the checkpoint.",
    )
    force_destroy: bool = Field(
        default=False,
        description="Let pulumi destroy delete the bucket while it still holds objects (it is "
        "versioned: old versions count).",
    )


class EfsConfig(Model):
    """EFS shared by a team's pods and a user's DevServers."""

    enabled: bool = Field(
        default=True,
        description="EFS, its CSI driver and an efs-shared claim in each team and DevServer "
        "namespace; false gives every DevServer flavor sharedFileSystem false.",
    )


class FsxConfig(Model):
    """FSx for Lustre PERSISTENT_2, linked to the bucket's `datasetPrefix` (auto import/export)."""

    enabled: bool = Field(
        default=False,
        description="FSx for Lustre in one private subnet, its CSI driver, a static volume and "
        "claim per team.",
    )
    storage_capacity_gib: int = Field(
        default=1200, description="1200, or a multiple of 2400 (PERSISTENT_2 SSD)."
    )
    throughput_per_tib: Literal[125, 250, 500, 1000] = Field(
        default=125, description="MB/s per TiB of storage."
    )
    dataset_prefix: str = Field(
        default="datasets",
        pattern=r"^[a-zA-Z0-9!_.*'()-]+(/[a-zA-Z0-9!_.*'()-]+)*$",
        description="The bucket prefix linked to the file system's /datasets (import/export of "
        "new, changed and deleted objects), which team pods read at /fsx/datasets; no . or .. "
        "segment, not under checkpoints/ nor overlapping fsx/checkpoints.",
    )

    @model_validator(mode="before")
    @classmethod
    def _no_backups(cls, data: Any) -> Any:
        return retired(
            data,
            "backupRetentionDays",
            "FSx takes no backups of a file system linked to S3 (FSx for Lustre user guide, "
            "Protecting your data with backups); what protects its files is their export to the "
            "bucket (docs: day two)",
        )

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
        # FSx refuses data repository associations whose bucket paths overlap.
        export = FSX_EXPORT_PREFIX.split("/")
        if segments[: len(export)] == export or export[: len(segments)] == segments:
            raise ValueError(
                f"datasetPrefix {self.dataset_prefix!r} overlaps {FSX_EXPORT_PREFIX}/, where FSx "
                "exports its checkpoints; allowed: a prefix outside it, such as datasets"
            )
        capacity = self.storage_capacity_gib
        if capacity != 1200 and (capacity < 2400 or capacity % 2400):
            raise ValueError(
                f"storageCapacityGib {capacity}; allowed for PERSISTENT_2 SSD: 1200 or a multiple "
                "of 2400 (2400, 4800, ...)"
            )
        return self


class StorageConfig(Model):
    """The S3 bucket and EBS always; EFS on by default; FSx for Lustre off by default."""

    bucket: BucketConfig = Field(default=BucketConfig(), description="The training bucket.")
    efs: EfsConfig = Field(default=EfsConfig(), description="EFS.")
    fsx: FsxConfig = Field(default=FsxConfig(), description="FSx for Lustre.")

    @property
    def shared_file_systems(self) -> frozenset[str]:
        """The file systems training pods mount (workloads.manifests MOUNTS): fsx, efs."""
        return frozenset(k for k, c in (("fsx", self.fsx), ("efs", self.efs)) if c.enabled)
