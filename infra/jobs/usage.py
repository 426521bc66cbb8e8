"""The usage-priced part of the bill: estimated from the stack's own jobs where the plan knows
what they do, else named with its unit price.

A job's checkpoints are known: its model preset gives the size of one DCP checkpoint (model and
AdamW state, trainer/presets.py), its arguments how many a run writes (--steps,
--checkpoint-every) and how many it keeps (--keep-last), its manifest where they go. What a run
costs follows from the store's prices, per run of the job (a run's length in hours depends on a
step time the plan cannot know):
  EFS (Elastic Throughput)  every byte written bills per GB; storage: the kept checkpoints
  S3                        one PUT per 8 MiB part (s3torchconnector's default part size) plus
                            the files' own requests; storage: the kept checkpoints, and each one
                            --keep-last prunes for the days the bucket's lifecycle rule keeps
                            noncurrent versions (versioning keeps every deleted object)
  FSx for Lustre            no per-byte charge on the file system (throughput is provisioned);
                            its export to the bucket (fsx/checkpoints/) bills as S3: a PUT per
                            file at least, the kept copies, and the pruned ones as noncurrent
                            versions under their own lifecycle rule
Gradient traffic between a job's nodes bills $0.01/GB each way when they sit in different AZs:
pools without an availabilityZone may spread, so those jobs get an upper bound (every node's ring
all-reduce traffic, 2 (n-1)/n of the fp32 gradients a step, crossing AZs).
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass

from infra.core.bill import PriceBook, StackCost
from infra.core.catalog import HOURS_PER_MONTH
from infra.core.declared import Declared, dig, listed
from infra.jobs.declared import DeclaredJob, declared_jobs
from infra.karpenter.facts import NODEPOOL, ZONE_LABEL, allowed
from infra.storage.config import CHECKPOINT_PREFIX, FSX_EXPORT_PREFIX
from infra.storage.facts import LIFECYCLE
from infra.vpc.facts import NAT_GATEWAY, VPC_ENDPOINT

GB = 1e9
S3_PART_BYTES = 8 * 2**20  # s3torchconnector's default multipart part size


@dataclass(frozen=True)
class UsageLine:
    item: str
    formula: str
    usd: float | None  # None: a unit price only, no figure the plan can know
    per: str  # "run" (of a job) or "month"


def _gb(n: float) -> str:
    return f"{n / GB:,.3g} GB"


def _noncurrent_days(stack: Sequence[Declared], prefix: str) -> int:
    """Days the bucket's lifecycle rule for `prefix` keeps noncurrent versions (0: no rule)."""
    for rule in (
        rule for r in stack if r.type == LIFECYCLE for rule in listed(dig(r.props, "rules"))
    ):
        if dig(rule, "filter", "prefix") == prefix:
            return int(dig(rule, "noncurrentVersionExpiration", "noncurrentDays") or 0)
    return 0


def _kept_in_s3(
    job: DeclaredJob, book: PriceBook, size: float, where: str, days: int
) -> list[UsageLine]:
    """The kept checkpoints a month, and what a run's pruned ones cost as noncurrent versions."""
    kept, pruned = job.options.keep_last, max(job.checkpoints - job.options.keep_last, 0)
    storage = book.usd("s3StandardPerGibMonth")
    month_share = days * 24 / HOURS_PER_MONTH
    return [
        UsageLine(
            f"{job.name} kept {where}",
            f"{kept} kept x {_gb(size)} x ${storage}/GB-month",
            kept * size / GB * storage,
            "month",
        ),
        UsageLine(
            f"{job.name} pruned versions",
            f"{pruned} pruned x {_gb(size)} kept {days} days as noncurrent versions "
            f"(storage.bucket.noncurrentVersionDays) x ${storage}/GB-month",
            pruned * size / GB * storage * month_share,
            "run",
        ),
    ]


def _checkpoints(job: DeclaredJob, stack: Sequence[Declared], book: PriceBook) -> list[UsageLine]:
    size, count, kept = job.model.checkpoint_bytes(), job.checkpoints, job.options.keep_last
    each = f"{count} checkpoints x {_gb(size)} ({job.options.model}, 12 B/parameter)"
    name = f"{job.name} checkpoints"
    put = book.usd("s3PutPer1000")
    files = job.ranks + 1  # a DCP checkpoint: one file a rank and the metadata
    if job.store == "efs":
        rate = book.usd("efsElasticWritePerGb")
        storage = book.usd("efsStandardPerGibMonth")
        return [
            UsageLine(name, f"EFS writes: {each} x ${rate}/GB", count * size / GB * rate, "run"),
            UsageLine(
                f"{job.name} kept on EFS",
                f"{kept} kept x {_gb(size)} x ${storage}/GB-month",
                kept * size / GB * storage,
                "month",
            ),
        ]
    if job.store == "s3":
        # One PUT a part, and a create and a complete for each rank's file and the metadata.
        requests = count * (math.ceil(size / S3_PART_BYTES) + 3 * files)
        return [
            UsageLine(
                name,
                f"S3 requests: {count} x ({_gb(size)} / 8 MiB parts + 3 per file of "
                f"{job.ranks} ranks and metadata) = {requests:,} PUTs x ${put}/1000",
                requests / 1000 * put,
                "run",
            ),
            *_kept_in_s3(job, book, size, "in S3", _noncurrent_days(stack, CHECKPOINT_PREFIX)),
        ]
    if job.store == "fsx":
        days = _noncurrent_days(stack, f"{FSX_EXPORT_PREFIX}/")
        return [
            UsageLine(
                name,
                f"FSx for Lustre: {each}, no per-byte charge; exported to the bucket: at least "
                f"{count} x {files} files = {count * files:,} PUTs x ${put}/1000",
                count * files / 1000 * put,
                "run",
            ),
            *_kept_in_s3(job, book, size, "in S3 (FSx export)", days),
        ]
    return []


def _zones(pool: str, stack: Sequence[Declared]) -> list[str]:
    return [
        zone
        for r in stack
        if r.type == NODEPOOL and dig(r.props, "metadata", "name") == pool
        for zone in allowed(dig(r.props, "spec", "template", "spec"), ZONE_LABEL)
    ]


def _cross_az(job: DeclaredJob, stack: Sequence[Declared], book: PriceBook) -> list[UsageLine]:
    if job.nodes < 2 or len(_zones(job.pool, stack)) == 1:
        return []
    rate = book.usd("crossAzPerGb")
    gradients = 4 * job.model.params()
    sent = 2 * (job.nodes - 1) * gradients * job.options.steps
    return [
        UsageLine(
            f"{job.name} cross-AZ",
            f"up to {job.options.steps:,} steps x 2 x ({job.nodes}-1) x {_gb(gradients)} fp32 "
            f"gradients x 2 x ${rate}/GB (pool {job.pool} may spread over AZs)",
            sent / GB * 2 * rate,
            "run",
        )
    ]


def _unit(book: PriceBook, item: str, key: str, unit: str, note: str = "") -> UsageLine:
    return UsageLine(item, f"${book.usd(key)}/{unit}" + (f" {note}" if note else ""), None, "month")


def usage_lines(cost: StackCost, stack: Sequence[Declared]) -> list[UsageLine]:
    """Estimates per job, then the unit prices of what the plan cannot know."""
    book = cost.book
    lines = []
    for job in declared_jobs(stack):
        lines += _checkpoints(job, stack, book) + _cross_az(job, stack, book)
    types = set(cost.usage_types) | {r.type for r in stack}
    if NAT_GATEWAY in types:
        lines.append(
            _unit(book, "NAT data", "natGatewayPerGb", "GB", "(S3 goes by the gateway endpoint)")
        )
    if any(dig(r.props, "vpcEndpointType") == "Interface" for r in stack if r.type == VPC_ENDPOINT):
        lines.append(_unit(book, "VPC endpoint data", "vpcInterfaceEndpointPerGb", "GB"))
    if "aws:s3/bucket:Bucket" in types:
        lines.append(_unit(book, "S3 other storage", "s3StandardPerGibMonth", "GB-month"))
    if "aws:efs/fileSystem:FileSystem" in types:
        lines.append(
            _unit(
                book,
                "EFS other use",
                "efsStandardPerGibMonth",
                "GB-month",
                f"+ ${book.usd('efsElasticReadPerGb')}/GB read, "
                f"${book.usd('efsElasticWritePerGb')}/GB written",
            )
        )
    if "aws:cloudwatch/logGroup:LogGroup" in types:
        lines.append(
            _unit(
                book,
                "control plane logs",
                "cloudwatchLogsIngestPerGb",
                "GB ingested",
                f"+ ${book.usd('cloudwatchLogsStoragePerGbMonth')}/GB-month kept (retention "
                "bounds it)",
            )
        )
    if "aws:ecr/repository:Repository" in types:
        lines.append(_unit(book, "ECR images", "ecrStoragePerGbMonth", "GB-month of layers"))
    if "aws:sqs/queue:Queue" in types:
        lines.append(
            _unit(
                book,
                "SQS (interruption queue)",
                "sqsRequestsPerMillion",
                "million requests",
                "after the first million a month (free tier)",
            )
        )
    if any(line.item == "EKS hybrid nodes" for line in cost.lines):
        # In from the internet is free; out bills per GB (README: Hybrid nodes' costs).
        lines.append(_unit(book, "hybrid traffic out of the gateway", "internetEgressPerGb", "GB"))
    return lines
