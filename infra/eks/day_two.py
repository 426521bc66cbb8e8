"""What a change does to the control plane and the system nodes: EKS upgrades one minor version
at a time, replaces a node group's nodes one by one, and the controllers restart."""

from infra.core.change import DELETE, REPLACE, UPDATE, Step
from infra.core.day_two import Change
from infra.core.kinds import HELM_RELEASE
from infra.eks.facts import EKS_CLUSTER, EKS_COMPONENT, LAUNCH_TEMPLATE, NODE_GROUP
from infra.vpc.day_two import vpc_replaced, zones_added, zones_dropped

# The control plane: pulumi-eks's component offline (its children are invisible under mocks), the
# aws:eks Cluster it creates in a real preview.
EKS_CLUSTERS = {EKS_COMPONENT, EKS_CLUSTER}


def _minor(version: object) -> tuple[int, int]:
    major, minor = str(version).split(".")[:2]
    return int(major), int(minor)


def version_changes(steps: list[Step]) -> set[tuple[str, str]]:
    return {
        (str(s.old.inputs.get("version")), str(s.new.inputs.get("version")))
        for s in steps
        if s.type in EKS_CLUSTERS and s.op == UPDATE and "version" in s.reasons
    }


def versions(change: Change) -> None:
    """EKS upgrades a control plane one minor version at a time and never downgrades one
    (Amazon EKS user guide, "Update existing cluster to new Kubernetes version")."""
    for old, new in sorted(version_changes(change.steps)):
        (old_major, old_minor), (new_major, new_minor) = _minor(old), _minor(new)
        if (new_major, new_minor) < (old_major, old_minor):
            why = "EKS never downgrades a control plane"
        elif new_major != old_major or new_minor > old_minor + 1:
            why = "EKS upgrades one minor version at a time"
        else:
            continue
        change.found.refusals.append(
            f"kubernetes-version: cluster.kubernetesVersion {old} -> {new}: {why}; allowed: "
            f"{old}, or {old_major}.{old_minor + 1}"
        )


def controllers(change: Change) -> None:
    found = change.found
    for old, new in sorted(version_changes(change.steps)):
        found.notes.append(
            f"the EKS control plane upgrades {old} -> {new} first; add-ons and the system node "
            "group follow it (docs/platform/upgrades.md)"
        )
    for step in change.steps:
        if step.op != UPDATE:
            continue
        if step.type == NODE_GROUP and any(
            p.startswith(("version", "launchTemplate.version", "releaseVersion"))
            for p in step.reasons
        ):
            found.notes.append(
                f"node group {step.name}: EKS replaces its nodes one at a time (rolling update); "
                "the controllers on them restart elsewhere"
            )
        elif step.type == LAUNCH_TEMPLATE and any(p.startswith(REPLACING) for p in step.reasons):
            fields = sorted({p.split(".")[0].split("[")[0] for p in step.reasons})
            found.restarts.append(
                f"launch template {step.name} changes ({', '.join(fields)}): a new version, "
                "which the system node group takes: EKS replaces every system node, one at a "
                "time (rolling update, maxUnavailable 1); the controllers on them (Karpenter, "
                "Kueue, the operators, CoreDNS) restart on the new nodes, and jobs keep running"
            )
        elif step.type == HELM_RELEASE and "version" in step.reasons:
            found.notes.append(
                f"Helm release {step.name}: chart {step.old.inputs.get('version')} -> "
                f"{step.new.inputs.get('version')}; its controller restarts, running jobs keep "
                "running"
            )


# What of a launch template its instances are made from: a change makes a new version, which an
# EKS managed node group rolls its nodes onto (its tags alone change nothing that runs).
REPLACING = ("blockDeviceMappings", "metadataOptions", "tagSpecifications", "imageId", "userData")

# pulumi-eks takes the control plane's subnets as subnetIds or as the private and public ones.
SUBNET_INPUTS = ("subnetIds", "privateSubnetIds", "publicSubnetIds", "vpcConfig.subnetIds")


def control_plane_subnets(change: Change) -> None:
    """EKS moves a cluster's network interfaces in place (UpdateClusterConfig, since 2023-10),
    into subnets of the AZs it was created in and of its VPC only (EKS user guide, "VPC and
    subnet requirements"); the webhook policies admit the new subnets (infra/core/
    network_policies.py)."""
    for step in change.steps:
        if step.type in EKS_CLUSTERS and step.op == UPDATE and _names_subnets(step.reasons):
            change.found.notes.append(
                f"cluster {step.name}: EKS moves the control plane's network interfaces into "
                "its own subnets (in place; they must lie in the cluster's original AZs and "
                "VPC); the platform's webhook policies admit the API server from them once "
                "the update is done"
            )


def control_plane_network(change: Change) -> None:
    """EKS keeps a cluster in the VPC and the AZs it was created in: an update may name other
    subnets, but "all subnets that you add must be in the same set of AZs as originally
    provided", at least one in each, "and ... in the same VPC as the original subnets" (EKS user
    guide, networking/network-reqs.adoc, VPC requirements); an EFS file system's mount targets
    all lie in one VPC too. Such an update fails half applied: refused before it starts."""
    if any(s.type in EKS_CLUSTERS and s.op in (REPLACE, DELETE) for s in change.steps):
        return  # the cluster goes too: the data-loss rule speaks for it
    way = (
        "allowed: the network as it is, or a new stack for the new network (a new cluster and "
        "file systems; data moved by hand)"
    )
    replaced = vpc_replaced(change.steps)
    if replaced:
        change.found.refusals.append(
            f"eks-network: the VPC is replaced ({', '.join(replaced)}): EKS keeps the cluster in "
            f"the VPC it was made in, and EFS its mount targets, so the update would fail half "
            f"applied; {way}"
        )
        return
    for zones, verb in (
        (zones_dropped(change.steps), "leaves"),
        (zones_added(change.steps), "adds"),
    ):
        if zones:
            change.found.refusals.append(
                f"eks-network: the VPC {verb} {', '.join(sorted(zones))} (network.azCount): "
                "EKS takes control-plane subnets only in the AZs the cluster was made in, one in "
                f"each at least, so the update would fail half applied; {way}"
            )


def _names_subnets(reasons) -> bool:
    return any(r.startswith(SUBNET_INPUTS) for r in reasons)


LOG_GROUP = "aws:cloudwatch/logGroup:LogGroup"


def _days(value: object) -> int | None:
    """A retention in days; None: kept forever (0 or unset, CloudWatch's never-expire)."""
    return int(value) if value else None


def log_retention(change: Change) -> None:
    """CloudWatch deletes the events older than a shortened retention within days of the change
    (CloudWatch Logs API, PutRetentionPolicy: "log events ... older than the retention period
    are deleted"): the control plane's audit and API server logs among them."""
    for step in change.steps:
        if step.type != LOG_GROUP or step.op != UPDATE or "retentionInDays" not in step.reasons:
            continue
        old = _days(step.old.inputs.get("retentionInDays"))
        new = _days(step.new.inputs.get("retentionInDays"))
        if new is not None and (old is None or new < old):
            change.found.losses.append(
                f"log group {step.name}: retention {old or 'forever'} -> {new} days: CloudWatch "
                f"deletes the events older than {new} days (the control plane's audit logs "
                "among them); export what you must keep first (aws logs create-export-task)"
            )
