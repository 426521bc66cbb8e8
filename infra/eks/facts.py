"""What the platform knows about the cluster's resource kinds: the control plane and the system
node group bill by the hour, EKS add-ons and access objects are free; the pods of the add-ons
EKS installs; where the system node group is; which inputs replace them."""

import json
from collections.abc import Sequence

from infra.core.bill import CostLine, Part, PriceBook, describe_disks, ebs_disks, required
from infra.core.capacity import addon_pod_sets
from infra.core.catalog import UnpricedError
from infra.core.declared import Declared, dig, listed
from infra.core.facts import RUNS_ON_NODES, TF, Facts, Kind, ReplaceRule, SystemNodes
from infra.core.nodes import SYSTEM_NODE_LABEL
from infra.core.pods import CRITICAL_ADDONS, EVERY_TAINT, AddonPods, PodSet, Requests
from infra.eks.support import support_on

# The cluster as a data holder (infra/core/data_holders.py), and what losing it loses.
CLUSTER = "cluster"
HOLDERS = {
    CLUSTER: "every Kubernetes object (jobs, DevServers, claims, secrets), the running pods, and "
    "the volumes whose reclaim policy is Delete",
}

EKS_COMPONENT = "eks:index:Cluster"
EKS_CLUSTER = "aws:eks/cluster:Cluster"
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
EKS_ADDON = "aws:eks/addon:Addon"
# pulumi-eks's Cluster installs these add-ons itself (ours: cluster.py).
CLUSTER_ADDONS = ("vpc-cni", "kube-proxy")


def _encryption_removed(old: dict, new: dict) -> list[str]:
    """EKS: envelope encryption cannot be turned off (customdiff.ForceNewIf("encryption_config"),
    "You cannot disable envelope encryption after enabling it")."""
    for key in ("encryptionConfigKeyArn", "encryptionConfig"):
        if old.get(key) and not new.get(key):
            return [key]
    return []


EKS_CLUSTER_RULE = ReplaceRule(
    (
        "name",
        "roleArn",
        "serviceRole",
        "bootstrapSelfManagedAddons",
        "kubernetesServiceIpAddressRange",
        "kubernetesNetworkConfig.serviceIpv4Cidr",
        "kubernetesNetworkConfig.ipFamily",
        "ipFamily",
        "accessConfig.bootstrapClusterCreatorAdminPermissions",
    ),
    f"{TF}/eks/cluster.go; pulumi/pulumi-eks nodejs/eks/cluster/cluster.ts",
    _encryption_removed,
)


def _control_plane(r: Declared, stack: Sequence[Declared], book: PriceBook) -> list[CostLine]:
    # pulumi-eks's Cluster creates an aws:eks/cluster:Cluster, which a real preview shows too.
    if r.type == EKS_COMPONENT and any(other.type == EKS_CLUSTER for other in stack):
        return []
    # EKS's API default upgrade policy is EXTENDED (infra/eks/support.py).
    policy = str(dig(r.props, "upgradePolicy", "supportType") or "EXTENDED")
    support = support_on(str(required(r.props, "version")), policy)
    rate = (
        "eksExtendedSupportPerHour" if support.tier == "extended" else "eksStandardSupportPerHour"
    )
    return [CostLine(f"EKS control plane {r.name}", support.detail, book.usd(rate))]


def _node_group(r: Declared, stack: Sequence[Declared], book: PriceBook) -> list[CostLine]:
    """desiredSize nodes of the dearest type, each with its launch template's disks, in the
    floor: nothing scales a managed node group without a cluster autoscaler, and Karpenter does
    not manage it. maxSize is what it may grow to by hand: the rest is ceiling headroom."""
    desired = int(required(r.props, "scalingConfig", "desiredSize"))
    most = int(required(r.props, "scalingConfig", "maxSize"))
    types = [str(t) for t in listed(dig(r.props, "instanceTypes"))]
    if not types:
        raise UnpricedError("no instanceTypes to price it by")
    templates = [d for d in stack if d.urn in r.dependencies and d.type == LAUNCH_TEMPLATE]
    disks = ebs_disks(
        [m for t in templates for m in listed(dig(t.props, "blockDeviceMappings"))], book
    )
    dearest = max(types, key=book.instance)
    per_node = book.instance(dearest) + sum(d.per_hour(book) for d in disks)
    each = f"{dearest}, {describe_disks(disks)} each"
    lines = [
        CostLine(f"node group {r.name}", f"{desired} x {each} (desiredSize)", desired * per_node)
    ]
    if most > desired:
        lines.append(
            CostLine(
                f"node group {r.name} to maxSize",
                f"up to {most - desired} more x {dearest} (maxSize {most})",
                (most - desired) * per_node,
                Part.HEADROOM,
            )
        )
    return lines


def pods(r: Declared, stack: Sequence[Declared], facts: Facts) -> list[PodSet]:
    if r.type == EKS_ADDON:
        raw = dig(r.props, "configurationValues")
        configuration = json.loads(str(raw)) if raw else {}
        return addon_pod_sets(str(dig(r.props, "addonName")), configuration, facts)
    if r.type == EKS_COMPONENT and not any(d.type == EKS_CLUSTER for d in stack):
        return [pods for addon in CLUSTER_ADDONS for pods in addon_pod_sets(addon, {}, facts)]
    return []


def system_nodes(stack: Sequence[Declared]) -> SystemNodes | None:
    groups = [
        r
        for r in stack
        if r.type == NODE_GROUP
        and all(dig(r.props, "labels", k) == v for k, v in SYSTEM_NODE_LABEL.items())
    ]
    if not groups:
        return None
    group = groups[0]
    return SystemNodes(
        str(listed(dig(group.props, "instanceTypes"))[0]),
        int(dig(group.props, "scalingConfig", "desiredSize") or 0),
    )


KINDS = (
    Kind(EKS_COMPONENT, price=_control_plane, replace=EKS_CLUSTER_RULE, stands_in=True),
    Kind(EKS_CLUSTER, price=_control_plane, replace=EKS_CLUSTER_RULE),
    Kind(
        NODE_GROUP,
        price=_node_group,
        replace=ReplaceRule(
            (
                "amiType",
                "capacityType",
                "clusterName",
                "diskSize",
                "instanceTypes",
                "launchTemplate.id",
                "launchTemplate.name",
                "nodeGroupName",
                "nodeGroupNamePrefix",
                "nodeRoleArn",
                "remoteAccess",
                "subnetIds",
            ),
            f"{TF}/eks/node_group.go",
        ),
    ),
    Kind(
        LAUNCH_TEMPLATE,
        free="a template: its instances and disks are priced on the node group's line",
        replace=ReplaceRule(
            ("name", "namePrefix"),
            f"{TF}/ec2/ec2_launch_template.go (other changes: a new version)",
        ),
    ),
    Kind(
        EKS_ADDON,
        free=f"EKS add-ons have no charge: {RUNS_ON_NODES}",
        replace=ReplaceRule(("addonName", "clusterName", "namespaceConfig"), f"{TF}/eks/addon.go"),
    ),
    # A member's access is gone between the delete and the create.
    Kind(
        "aws:eks/accessEntry:AccessEntry",
        free="EKS: access entries have no charge",
        replace=ReplaceRule(("clusterName", "principalArn", "type"), f"{TF}/eks/access_entry.go"),
    ),
    Kind(
        "aws:eks/accessPolicyAssociation:AccessPolicyAssociation",
        free="EKS: part of an access entry",
    ),
    Kind(
        "aws:eks/podIdentityAssociation:PodIdentityAssociation",
        free="EKS: Pod Identity has no charge",
        replace=ReplaceRule(
            ("clusterName", "namespace", "serviceAccount"),
            f"{TF}/eks/pod_identity_association.go",
        ),
    ),
    Kind(
        "aws:cloudwatch/logGroup:LogGroup",
        usage="CloudWatch Logs ingestion per GB, storage per GB-month",
        replace=ReplaceRule(("name", "namePrefix", "logGroupClass"), f"{TF}/logs/group.go"),
    ),
)


# EKS add-ons at their defaults (the add-on's own manifests follow each project's chart).
ADDONS = {
    "vpc-cni": [
        AddonPods(
            "aws-node",
            1,
            True,
            Requests(0.025, 0),
            EVERY_TAINT,
            "aws/amazon-vpc-cni-k8s v1.20.4 charts/aws-vpc-cni/values.yaml: 25m, tolerates all",
        )
    ],
    "kube-proxy": [
        AddonPods(
            "kube-proxy",
            1,
            True,
            Requests(0.1, 0),
            EVERY_TAINT,
            "EKS kube-proxy add-on manifest: 100m (read from memory)",
        )
    ],
    "coredns": [
        AddonPods(
            "coredns",
            2,
            False,
            Requests(0.1, 70),
            CRITICAL_ADDONS,
            "EKS CoreDNS add-on, as Kubernetes' cluster/addons/dns/coredns manifest: 2 "
            "replicas "
            "of 100m, 70Mi, tolerating CriticalAddonsOnly (read from memory)",
        )
    ],
    "eks-pod-identity-agent": [
        AddonPods(
            "agent",
            1,
            True,
            Requests(),
            EVERY_TAINT,
            "aws/eks-pod-identity-agent charts values.yaml: resources commented out, "
            "tolerations all",
        )
    ],
    "eks-node-monitoring-agent": [
        AddonPods(
            "agent",
            1,
            True,
            Requests(0.01, 30),
            EVERY_TAINT,
            "aws/eks-node-monitoring-agent v1.7.0 charts values.yaml: 10m, 30Mi, tolerates all",
        )
    ],
}
