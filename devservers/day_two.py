"""What a change does to DevServers: the operator replaces the pods of every server of a changed
flavor, and stops those of a deleted one (devservers/operator.py on_flavor, controller.py
_refused)."""

from devservers.api import API_VERSION
from infra.core.change import DELETE
from infra.core.day_two import Change, existing

FLAVOR = f"kubernetes:{API_VERSION}:DevServerFlavor"
# A user's DevServer namespace as a data holder (infra/core/data_holders.py), and what losing it
# loses.
USERS = "devServers.users"
HOLDERS = {
    USERS: "the user's namespace: her DevServers stop, her LocalQueue and quota go; her homes are "
    "kept as Released volumes (StorageClass reclaimPolicy Retain)",
}


def user_holder(user: str) -> str:
    return f"{USERS}[{user}]"


def flavors(change: Change) -> None:
    """The DevServer operator replaces the pods of every server of a changed flavor, and stops
    those of a deleted one (devservers/operator.py on_flavor, controller.py _refused)."""
    found = change.found
    for step, name in existing(change.steps, {FLAVOR}):
        if step.op == DELETE:
            found.restarts.append(
                f"DevServer flavor {name} is deleted: the servers of that flavor stop (homes "
                "stay) until their owners pick another"
            )
        else:
            fields = sorted({p.split(".")[1].split("[")[0] for p in step.reasons if "." in p})
            found.restarts.append(
                f"DevServer flavor {name} changes ({', '.join(fields) or 'spec'}): every server "
                "of that flavor restarts on new pods (homes stay; what runs in them ends)"
            )
