"""`acknowledgeDataLoss`: the data holders whose replacement or deletion this stack file accepts.

Each entry lifts `protect` from one holder (infra/core/data_holders.py) for as long as it is listed,
so that a `pulumi up` may replace or delete it; the plan refuses any such loss not listed here.
Remove the entry once the change is applied: the holder is protected again.
"""

import re

from pydantic import Field

from infra.billing.facts import USAGE_RECORDS
from infra.core.config import PATTERN_HINTS, Model
from infra.eks.facts import CLUSTER
from infra.images.facts import IMAGES
from infra.kueue.facts import TEAMS
from infra.storage.facts import BUCKET, EFS, FSX

# A holder is a stack-config path: a section's store, or a user's or team's entry by name. The
# DevServers' holder (devservers/day_two.py) is the stack file's `devServers.users` key.
HOLDER_PATTERN = re.compile(
    rf"^({'|'.join(re.escape(h) for h in (CLUSTER, IMAGES, BUCKET, EFS, FSX, USAGE_RECORDS))}"
    rf"|{re.escape('devServers.users')}\[[a-z0-9-]+\]|{re.escape(TEAMS)}\[[a-z0-9-]+\])$"
)

PATTERN_HINTS[HOLDER_PATTERN.pattern] = (
    "a data holder the plan names: cluster, images, storage.bucket, storage.efs, storage.fsx, "
    "billing.recordUsage, devServers.users[<user>] or queues.teams[<team>]"
)


class DataLossAcknowledgement(Model):
    """One data holder whose loss the stack file accepts."""

    holder: str = Field(
        pattern=HOLDER_PATTERN.pattern,
        description="The holder the plan names in its refusal: cluster, images, storage.bucket, "
        "storage.efs, storage.fsx, billing.recordUsage, devServers.users[<user>] or "
        "queues.teams[<team>].",
    )
    reason: str = Field(
        min_length=1,
        max_length=500,
        description="Why the loss is fine, kept in the stack file's history for whoever "
        "reviews the change.",
    )


def holders_once(entries: list[DataLossAcknowledgement]) -> list[DataLossAcknowledgement]:
    holders = [e.holder for e in entries]
    repeated = sorted({h for h in holders if holders.count(h) > 1})
    if repeated:
        raise ValueError(f"names {', '.join(repeated)} more than once; allowed: each holder once")
    return entries
