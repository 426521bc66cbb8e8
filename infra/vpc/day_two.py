"""What a network change does to the nodes in it."""

from infra.core.change import DELETE, REPLACE
from infra.core.day_two import Change
from infra.vpc.facts import NAT_GATEWAY, SUBNET


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
