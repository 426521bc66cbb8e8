"""What the platform knows about the hybrid kinds: EKS bills joined machines per vCPU-hour (the
ResourceFlavor that stands for them says which), the gateway is an EC2 instance, its key an SSM
parameter; the pods of Cilium and of the homes' local-path provisioner."""

from collections.abc import Sequence

from infra.core.bill import CostLine, PriceBook, gp3_volume, listed_annotation, required
from infra.core.declared import Declared, dig
from infra.core.facts import TF, ImmutableRule, Kind, ReplaceRule
from infra.core.pods import EVERY_TAINT, ChartPods, OverlayPods, Requests
from infra.kueue.facts import KUEUE_CRDS

# The machines a hybrid nodes' ResourceFlavor stands for (JSON: a list of {name, vcpu}), written
# by infra/hybrid/nodes.py: EKS bills hybrid nodes per vCPU-hour while they are joined.
HYBRID_MACHINES_ANNOTATION = "training-platform/hybrid-machines"
HYBRID_NODES_ITEM = "EKS hybrid nodes"


def _instance(r: Declared, stack: Sequence[Declared], book: PriceBook) -> list[CostLine]:
    kind = str(required(r.props, "instanceType"))
    root = dig(r.props, "rootBlockDevice")
    # Without a volumeSize the root volume takes the AMI's size (a few GiB): not priced.
    disk = gp3_volume(root, book) if dig(root, "volumeSize") else None
    return [
        CostLine(
            f"EC2 instance {r.name}",
            f"{kind}, {disk.describe()}" if disk else kind,
            book.instance(kind) + (disk.per_hour(book) if disk else 0.0),
        )
    ]


def _ssm_parameter(r: Declared, stack: Sequence[Declared], book: PriceBook) -> list[CostLine]:
    """Standard-tier parameters are free; an advanced one bills per month."""
    if (dig(r.props, "tier") or "Standard") == "Standard":
        return []
    return [
        CostLine(
            f"SSM parameter {r.name}",
            "advanced tier",
            book.per_hour("ssmAdvancedParameterPerMonth"),
        )
    ]


def _hybrid_nodes(r: Declared, stack: Sequence[Declared], book: PriceBook) -> list[CostLine]:
    """EKS bills a joined hybrid node per vCPU-hour, in tiers by the account's monthly vCPU-hours;
    the first (dearest) tier's rate bounds it. The machines themselves are their owners' cost."""
    machines = listed_annotation(r, HYBRID_MACHINES_ANNOTATION)
    if not machines:
        return []
    vcpu = sum(int(required(m, "vcpu")) for m in machines)
    rate = book.usd("eksHybridNodesPerVcpuHour")
    return [
        CostLine(
            HYBRID_NODES_ITEM,
            f"{len(machines)} machines, {vcpu} vCPU at ${rate}/vCPU-hour (first tier)",
            vcpu * rate,
        )
    ]


KINDS = (
    Kind(
        "aws:ec2/instance:Instance",
        price=_instance,
        replace=ReplaceRule(
            (
                "ami",
                "associatePublicIpAddress",
                "availabilityZone",
                "cpuOptions",
                "ebsOptimized",
                "enclaveOptions",
                "ephemeralBlockDevices",
                "hibernation",
                "hostId",
                "instanceMarketOptions",
                "ipv6Addresses",
                "keyName",
                "launchTemplate",
                "networkInterfaces",
                "placementGroup",
                "placementPartitionNumber",
                "privateDnsNameOptions",
                "privateIp",
                "securityGroups",
                "subnetId",
                "tenancy",
                "ebsBlockDevices",
                "rootBlockDevice.encrypted",
                "rootBlockDevice.kmsKeyId",
            ),
            f"{TF}/ec2/ec2_instance.go",
        ),
    ),
    Kind("aws:ssm/parameter:Parameter", price=_ssm_parameter),
    Kind(
        "kubernetes:kueue.x-k8s.io/v1beta2:ResourceFlavor",
        price=_hybrid_nodes,
        # A flavor with a topology keeps its labels, tolerations and topology.
        immutable=ImmutableRule(
            ("spec.topologyName", "spec.nodeLabels", "spec.tolerations"),
            f"{KUEUE_CRDS}resourceflavors.yaml, spec: once topologyName is set",
            "remove the flavor in one `pulumi up` (with the queues that name it) and add it "
            "back in the next",
            when="spec.topologyName",
        ),
    ),
    Kind(
        "aws:ssm/activation:Activation",
        free="Systems Manager: hybrid activations register standard-tier "
        "managed instances, free up to 1,000 per account and region (SSM pricing, from memory)",
    ),
)


CHARTS = {
    "oci://public.ecr.aws/eks/cilium/cilium": [
        ChartPods(
            "agent",
            "",
            "resources",
            Requests(),
            "hybrid nodes only (its affinity): never on the system nodes",
            daemonset=True,
            default_tolerations=EVERY_TAINT,
        ),
        ChartPods(
            "operator",
            "operator",
            "operator.resources",
            Requests(),
            "cilium/cilium chart values.yaml: operator.resources {} (read from memory)",
            replicas="operator.replicas",
            default_replicas=2,
        ),
    ],
}


OVERLAYS = {
    "manifests/local-path-provisioner": [
        OverlayPods(
            "local-path-provisioner", "rancher/local-path-provisioner v0.0.37 deploy/: none"
        )
    ],
}
