"""What a network change does to the nodes in it."""

from infra.core.change import CREATE, DELETE, REPLACE, Step
from infra.core.day_two import Change
from infra.vpc.facts import NAT_GATEWAY, SUBNET
from infra.vpc.network import discovery_tag

VPC = "aws:ec2/vpc:Vpc"
DISCOVERY_TAG = next(iter(discovery_tag("")))


def _subnet_zones(steps: list[Step], ops: tuple[str, ...], side: str) -> set[str]:
    return {
        str(getattr(step, side).inputs.get("availabilityZone"))
        for step in steps
        if step.type == SUBNET and step.op in ops
    }


def zones_dropped(steps: list[Step]) -> set[str]:
    """AZs the VPC's subnets leave and none comes back to."""
    return _subnet_zones(steps, (DELETE, REPLACE), "old") - _subnet_zones(
        steps, (CREATE, REPLACE), "new"
    )


def zones_added(steps: list[Step]) -> set[str]:
    """AZs the nodes' subnets come to where none was: a node subnet (Karpenter's discovery tag)
    is created in an AZ the VPC did not span (the control plane's own subnets are created in the
    zones a stack from before already had)."""
    created = {
        str(step.new.inputs.get("availabilityZone"))
        for step in steps
        if step.type == SUBNET
        and step.op == CREATE
        and DISCOVERY_TAG in (step.new.inputs.get("tags") or {})
    }
    return created - _subnet_zones(steps, (DELETE, REPLACE), "old")


def vpc_replaced(steps: list[Step]) -> list[str]:
    """Why the VPC is replaced (the inputs that force it), or nothing."""
    return [r for step in steps if step.type == VPC and step.op == REPLACE for r in step.reasons]


def network(change: Change) -> None:
    """What a network change does to the nodes in it: a NAT gateway's open connections end with
    it; AWS refuses to delete a subnet while network interfaces are in it (EC2 DeleteSubnet:
    DependencyViolation), so its nodes must go first."""
    for step in change.steps:
        if step.type == NAT_GATEWAY and step.op in (DELETE, REPLACE):
            change.found.notes.append(
                f"NAT gateway {step.name} is {'deleted' if step.op == DELETE else 'replaced'}: "
                "the connections of the nodes behind it to outside the VPC break (a pull, a "
                "download, a run's logging), and they go out through the route's new gateway"
            )
        if step.type == SUBNET and step.op in (DELETE, REPLACE):
            change.found.notes.append(
                f"subnet {step.name} is {'deleted' if step.op == DELETE else 'replaced'}: AWS "
                "refuses while a node, a mount target or a load balancer is in it, so the update "
                "fails until they are gone; Karpenter drifts its nodes (those running a job "
                "keep it: move them with deploy.roll)"
            )
