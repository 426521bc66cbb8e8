"""What a change does to DevServers: the operator replaces the pods of every server of a changed
flavor, and stops those of a deleted one (devservers/operator.py on_flavor, controller.py
_refused)."""

from devservers.api import API_VERSION
from infra.core.change import DELETE, UPDATE
from infra.core.day_two import Change, existing
from infra.core.declared import dig
from infra.karpenter.facts import NODEPOOL, ZONE_LABEL, allowed
from infra.vpc.day_two import zones_dropped

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


def stranded_homes(change: Change) -> None:
    """A home is an EBS volume, which attaches only in the AZ it was made in: when a flavor's pool
    leaves a zone (an EFA pool's availabilityZone, a zone the VPC drops), the homes made there
    stay, and their servers cannot start on the pool's nodes elsewhere (the pod stays Pending on
    its volume's node affinity) until each home is moved. A hybrid pool's homes are on its
    machines, in no AZ."""
    dropped = zones_dropped(change.steps)
    left: dict[str, set[str]] = {}
    for step in change.steps:
        if step.type == NODEPOOL and step.op == UPDATE and (now := _pool_zones(step.new)):
            left[dig(step.new.inputs, "metadata", "name")] = _pool_zones(step.old) - now
    for flavor, pool in sorted(change.flavors.items()):
        # Where its homes are: the pool's one AZ, or any of the VPC's (hybrid: none).
        homes_in = {change.pool_zones[pool]} if pool in change.pool_zones else dropped
        on_ec2 = dropped & homes_in if pool in change.pools else set()
        zones = sorted(on_ec2 | left.get(pool, set()))
        if zones:
            change.found.restarts.append(
                f"DevServer flavor {flavor}: homes made in {', '.join(zones)} stay there (an EBS "
                f"volume attaches in its own AZ only), so their servers cannot start on {pool} "
                "until each home is moved (snapshot it, restore it in the pool's zone: "
                "day-two.md, Moving a pool to another zone)"
            )


def _pool_zones(pool) -> set[str]:
    """The zones a NodePool's requirements hold it to; none: every zone of its subnets."""
    return set(allowed(dig(pool.inputs, "spec", "template", "spec"), ZONE_LABEL))
