"""What activating or dropping the cost allocation tags does: AWS accepts a key only from the
payer account, and only once the key has appeared in billing data, up to a day after the first
resource tagged with it (Cost Explorer's UpdateCostAllocationTagsStatus; the Pulumi registry's
CostAllocationTag: "it can take up to 24 hours for the tag keys to appear")."""

from infra.billing.facts import COST_ALLOCATION_TAG
from infra.core.change import CREATE, DELETE, Change

CRONJOB = "kubernetes:batch/v1:CronJob"
RECORDER = "usage-recorder"


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


def recorder_rights(change: Change) -> None:
    """The usage recorder's first `pulumi up` grants rights a reviewer should see in the plan:
    its own, and the team members' read of their namespace's ConfigMaps, where its records go."""
    if any(s.op == CREATE and s.type == CRONJOB and s.name == RECORDER for s in change.steps):
        change.found.notes.append(
            "billing: the usage recorder starts (a CronJob, every 5 minutes): it may list nodes "
            "cluster-wide, list Workloads and pods and write ConfigMaps in each team namespace, "
            "and keeps the node records in namespace usage-records; team members may now read "
            "the ConfigMaps of their own namespace, where the records of their jobs go"
        )
