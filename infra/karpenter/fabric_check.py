"""A node pool's NCCL fabric check (`nodePools[].fabricCheck`): the message sizes all_reduce_perf
sweeps and the busbw floors each size is held to."""

from dataclasses import dataclass

from pydantic import (
    Field,
    model_validator,
)

from infra.core.config import Model

# all_reduce_perf's message sizes: from 8 bytes, doubling (`-b 8 -f 2`), up to the check's maxBytes.
FABRIC_MIN_BYTES = 8


# What the check sweeps up to when neither maxBytes nor a floor says more: busbw has left the
# latency-bound small sizes well behind by 1 GiB on every published run.
FABRIC_DEFAULT_MAX_BYTES = 1 << 30


# all_reduce_perf allocates three buffers of maxBytes per GPU (send, receive, expected).
FABRIC_MAX_BYTES = 1 << 34


# A default floor is this share of the published figure: nccl-tests' own bandwidth check fails a
# run whose average busbw is below 0.9 times the figure given in NCCL_TESTS_MIN_BW
# (NVIDIA/nccl-tests src/util.cu writeResultFooter, src/common.cu run()).
PUBLISHED_FLOOR_SHARE = 0.9


def fabric_sizes(max_bytes: int) -> list[int]:
    """The message sizes all_reduce_perf -b 8 -e max_bytes -f 2 runs."""
    sizes, size = [], FABRIC_MIN_BYTES
    while size <= max_bytes:
        sizes.append(size)
        size *= 2
    return sizes


class BusbwFloor(Model):
    """The least busbw (GB/s, as all_reduce_perf prints it) every size from fromBytes to toBytes
    (inclusive; no toBytes: the largest size run) must reach, out-of-place and in-place."""

    from_bytes: int = Field(
        ge=FABRIC_MIN_BYTES,
        le=FABRIC_MAX_BYTES,
        description="The smallest message size the floor covers, bytes.",
    )
    to_bytes: int | None = Field(
        default=None,
        ge=FABRIC_MIN_BYTES,
        le=FABRIC_MAX_BYTES,
        description="The largest size it covers (inclusive, at least fromBytes); default: the "
        "largest size the check runs.",
    )
    min_busbw: float = Field(
        gt=0,
        le=10000,
        allow_inf_nan=False,
        description="The least busbw, GB/s as all_reduce_perf prints it, out-of-place and "
        "in-place.",
    )

    @model_validator(mode="after")
    def _ordered(self) -> "BusbwFloor":
        if self.to_bytes is not None and self.to_bytes < self.from_bytes:
            raise ValueError(
                f"toBytes {self.to_bytes} < fromBytes {self.from_bytes}; allowed: "
                "fromBytes <= toBytes"
            )
        return self

    def covers(self, size: int) -> bool:
        return self.from_bytes <= size and (self.to_bytes is None or size <= self.to_bytes)


class FabricCheckConfig(Model):
    """The pool's NCCL fabric check (python -m workloads.nccl_check): all_reduce_perf on every GPU
    of `nodes` nodes, each size's busbw held to `floors`."""

    nodes: int = Field(
        default=2, ge=2, le=1000, description="Nodes the check runs on, 2 to the pool's maxNodes."
    )
    max_bytes: int | None = Field(
        default=None,
        ge=FABRIC_MIN_BYTES,
        le=FABRIC_MAX_BYTES,
        description="The largest message size (all_reduce_perf -e); default: the largest size "
        "a floor names, else 1 GiB.",
    )
    floors: list[BusbwFloor] | None = Field(
        default=None,
        description="busbw floors, each covering a size the check runs. Default: 90 % of the "
        "published two-node figure of the pool's instance family "
        "(infra/core/catalog/nccl_busbw.yaml), "
        "a placeholder to replace with your cluster's measurement; []: no floor (only the "
        "network and #wrong are judged).",
    )


@dataclass(frozen=True)
class FabricCheckPlan:
    """A pool's fabric check as it runs: nodes, sizes, floors and where the floors came from."""

    nodes: int
    max_bytes: int
    floors: tuple[BusbwFloor, ...]
    basis: str  # one line for the report: stack config, a published figure, or why there is none

    @property
    def sizes(self) -> list[int]:
        return fabric_sizes(self.max_bytes)
