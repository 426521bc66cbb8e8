"""What activating or dropping the cost allocation tags does: AWS accepts a key only from the
payer account, and only once the key has appeared in billing data, up to a day after the first
resource tagged with it (Cost Explorer's UpdateCostAllocationTagsStatus; the Pulumi registry's
CostAllocationTag: "it can take up to 24 hours for the tag keys to appear")."""

from infra.billing.facts import COST_ALLOCATION_TAG
from infra.core.change import CREATE, DELETE, Change


def activation(change: Change) -> None:
    steps = [s for s in change.steps if s.type == COST_ALLOCATION_TAG]
    created = sorted(s.new.inputs["tagKey"] for s in steps if s.op == CREATE)
    dropped = sorted(s.old.inputs["tagKey"] for s in steps if s.op == DELETE)
    if created:
        change.found.notes.append(
            f"billing: activates {', '.join(created)} as cost allocation tags: run with the payer "
            "account's credentials, at least a day after the stack's first pulumi up (AWS refuses "
            "a key not yet in billing data)"
        )
    if dropped:
        change.found.notes.append(
            f"billing: {', '.join(dropped)} leave the stack but stay active (retainOnDelete: "
            "other stacks billed to the payer may use them); deactivate them in the Billing "
            "console if none does"
        )
