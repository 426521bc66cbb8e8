"""Karpenter: the controller that turns pending pods into EC2 nodes, its IAM and interruption queue.

The node pools it provisions are declared by NodePools (node_pools.py); this component is the
controller and what it needs from AWS.
"""

import json

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from infra.core.context import ClusterContext
from infra.core.helm import helm_release
from infra.core.iam import node_role, partition, pod_identity_role
from infra.core.network_policies import default_deny_ingress
from infra.core.nodes import SYSTEM_PLACEMENT
from infra.core.versions import KARPENTER_CHART, KARPENTER_CRD_CHART
from infra.eks.config import karpenter_role_names
from infra.karpenter.config import NodePoolConfig

NAMESPACE = "kube-system"
SERVICE_ACCOUNT = "karpenter"
# Its chart's selector labels with the release named karpenter (charts/karpenter/templates/
# _helpers.tpl karpenter.selectorLabels).
POD_LABELS = {"app.kubernetes.io/name": "karpenter", "app.kubernetes.io/instance": "karpenter"}

# Events Karpenter reacts to before AWS takes a node away (upstream getting-started template).
INTERRUPTION_EVENTS = {
    "health": ("aws.health", "AWS Health Event"),
    "spot-interruption": ("aws.ec2", "EC2 Spot Instance Interruption Warning"),
    "rebalance": ("aws.ec2", "EC2 Instance Rebalance Recommendation"),
    "instance-state-change": ("aws.ec2", "EC2 Instance State-change Notification"),
    "capacity-reservation-interruption": (
        "aws.ec2",
        "EC2 Capacity Reservation Instance Interruption Warning",
    ),
}
# EventBridge rule names are `<cluster>-<short>`: at most 64 characters with the longest cluster
# name config allows (44).
RULE_NAMES = {
    "health": "health",
    "spot-interruption": "spot",
    "rebalance": "rebalance",
    "instance-state-change": "state-change",
    "capacity-reservation-interruption": "reservation",
}


def feature_gates(pools: list[NodePoolConfig], node_repair: bool) -> dict[str, dict[str, bool]]:
    """Helm `settings` gate maps that differ from the chart's defaults: `featureGates` (core) and
    `awsFeatureGates` (the provider's, from 1.15). ReservedCapacity (capacity reservations, Capacity
    Blocks) is beta and on by default; StaticCapacity (NodePool `replicas`) is alpha and off, so
    static pools turn it on. NodeRepair (karpenter.nodeRepair) is alpha and off: on, repair is a
    voluntary disruption from 1.15, paced by each pool's budgets (node_pools.py), and with GPU
    pools the RebootForRepair gate lets it reboot a node for a GPU fault a reboot clears instead of
    replacing it (infra/karpenter/tests/karpenter_rules.py says what of the chart was read)."""
    core, provider = {}, {}
    if any(p.static_nodes for p in pools):
        core["staticCapacity"] = True
    if node_repair:
        core["nodeRepair"] = True
        if any(p.gpu for p in pools):
            provider["rebootForRepair"] = True
    gates = {"featureGates": core, "awsFeatureGates": provider}
    return {key: value for key, value in gates.items() if value}


def controller_policy(
    cluster_name: str,
    region: str,
    partition: str,
    account: str,
    queue_arn: str,
    node_role_arn: str,
    reboot: bool = False,
) -> dict:
    """The controller's permissions, scoped as upstream scopes them (v1.14 cloudformation.yaml;
    v1.15 adds ec2:RebootInstances to AllowScopedDeletion, used only by the RebootForRepair gate,
    so it is granted only with it: website/content/en/v1.15/reference/cloudformation.md).

    Writes are limited to resources tagged as this cluster's (`kubernetes.io/cluster/<name>:
    owned` plus a NodePool tag); reads to this region. Instance profiles are created by this
    program, so the controller gets no instance-profile management rights.
    """
    ec2 = f"arn:{partition}:ec2:{region}"
    owned = f"kubernetes.io/cluster/{cluster_name}"
    launched = [
        f"{ec2}:*:{kind}/*"
        for kind in (
            "fleet",
            "instance",
            "volume",
            "network-interface",
            "launch-template",
            "spot-instances-request",
        )
    ]
    request_tagged = {
        "StringEquals": {
            f"aws:RequestTag/{owned}": "owned",
            "aws:RequestTag/eks:eks-cluster-name": cluster_name,
        },
        "StringLike": {"aws:RequestTag/karpenter.sh/nodepool": "*"},
    }
    resource_tagged = {
        "StringEquals": {f"aws:ResourceTag/{owned}": "owned"},
        "StringLike": {"aws:ResourceTag/karpenter.sh/nodepool": "*"},
    }
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "AllowScopedEC2InstanceAccessActions",
                "Effect": "Allow",
                "Action": ["ec2:RunInstances", "ec2:CreateFleet"],
                "Resource": [
                    f"{ec2}::image/*",
                    f"{ec2}::snapshot/*",
                    f"{ec2}:*:security-group/*",
                    f"{ec2}:*:subnet/*",
                    f"{ec2}:*:capacity-reservation/*",
                    f"{ec2}:*:placement-group/*",
                ],
            },
            {
                "Sid": "AllowScopedEC2LaunchTemplateAccessActions",
                "Effect": "Allow",
                "Action": ["ec2:RunInstances", "ec2:CreateFleet"],
                "Resource": f"{ec2}:*:launch-template/*",
                "Condition": resource_tagged,
            },
            {
                "Sid": "AllowScopedEC2InstanceActionsWithTags",
                "Effect": "Allow",
                "Action": ["ec2:RunInstances", "ec2:CreateFleet", "ec2:CreateLaunchTemplate"],
                "Resource": launched,
                "Condition": request_tagged,
            },
            {
                "Sid": "AllowScopedResourceCreationTagging",
                "Effect": "Allow",
                "Action": "ec2:CreateTags",
                "Resource": launched,
                "Condition": {
                    "StringEquals": {
                        **request_tagged["StringEquals"],
                        "ec2:CreateAction": ["RunInstances", "CreateFleet", "CreateLaunchTemplate"],
                    },
                    "StringLike": request_tagged["StringLike"],
                },
            },
            {
                "Sid": "AllowScopedResourceTagging",
                "Effect": "Allow",
                "Action": "ec2:CreateTags",
                "Resource": f"{ec2}:*:instance/*",
                "Condition": {
                    **resource_tagged,
                    "StringEqualsIfExists": {"aws:RequestTag/eks:eks-cluster-name": cluster_name},
                    "ForAllValues:StringEquals": {
                        "aws:TagKeys": ["eks:eks-cluster-name", "karpenter.sh/nodeclaim", "Name"]
                    },
                },
            },
            {
                "Sid": "AllowScopedDeletion",
                "Effect": "Allow",
                "Action": [
                    "ec2:TerminateInstances",
                    "ec2:DeleteLaunchTemplate",
                    *(["ec2:RebootInstances"] if reboot else []),
                ],
                "Resource": [f"{ec2}:*:instance/*", f"{ec2}:*:launch-template/*"],
                "Condition": resource_tagged,
            },
            {
                "Sid": "AllowRegionalReadActions",
                "Effect": "Allow",
                "Action": [
                    "ec2:DescribeCapacityReservations",
                    "ec2:DescribeImages",
                    "ec2:DescribeInstances",
                    "ec2:DescribeInstanceStatus",
                    "ec2:DescribeInstanceTypeOfferings",
                    "ec2:DescribeInstanceTypes",
                    "ec2:DescribeLaunchTemplates",
                    "ec2:DescribePlacementGroups",
                    "ec2:DescribeSecurityGroups",
                    "ec2:DescribeSpotPriceHistory",
                    "ec2:DescribeSubnets",
                ],
                "Resource": "*",
                "Condition": {"StringEquals": {"aws:RequestedRegion": region}},
            },
            {
                "Sid": "AllowSSMReadActions",
                "Effect": "Allow",
                "Action": "ssm:GetParameter",
                "Resource": f"arn:{partition}:ssm:{region}::parameter/aws/service/*",
            },
            {
                "Sid": "AllowPricingReadActions",
                "Effect": "Allow",
                "Action": "pricing:GetProducts",
                "Resource": "*",
            },
            {
                "Sid": "AllowInterruptionQueueActions",
                "Effect": "Allow",
                "Action": ["sqs:DeleteMessage", "sqs:GetQueueUrl", "sqs:ReceiveMessage"],
                "Resource": queue_arn,
            },
            {
                "Sid": "AllowPassingInstanceRole",
                "Effect": "Allow",
                "Action": "iam:PassRole",
                "Resource": node_role_arn,
                "Condition": {
                    "StringEquals": {
                        # The China partition's EC2 service principal, as upstream lists it.
                        "iam:PassedToService": ["ec2.amazonaws.com", "ec2.amazonaws.com.cn"]
                    }
                },
            },
            {
                "Sid": "AllowUnscopedInstanceProfileListAction",
                "Effect": "Allow",
                "Action": "iam:ListInstanceProfiles",
                "Resource": "*",
            },
            {
                "Sid": "AllowInstanceProfileReadActions",
                "Effect": "Allow",
                "Action": "iam:GetInstanceProfile",
                "Resource": f"arn:{partition}:iam::{account}:instance-profile/*",
            },
            {
                "Sid": "AllowAPIServerEndpointDiscovery",
                "Effect": "Allow",
                "Action": "eks:DescribeCluster",
                "Resource": f"arn:{partition}:eks:{region}:{account}:cluster/{cluster_name}",
            },
            {
                "Sid": "AllowZonalShiftStatusReadOnly",
                "Effect": "Allow",
                "Action": "arc-zonal-shift:GetManagedResource",
                "Resource": "*",
                "Condition": {
                    "StringEquals": {
                        "arc-zonal-shift:ResourceIdentifier": (
                            f"arn:{partition}:eks:{region}:{account}:cluster/{cluster_name}"
                        )
                    }
                },
            },
        ],
    }


def interruption_queue_policy(queue_arn: str, rule_arns: list[str]) -> dict:
    """EventBridge may deliver only the events of this cluster's rules (confused deputy)."""
    return {
        "Version": "2012-10-17",
        "Id": "EC2InterruptionPolicy",
        "Statement": [
            {
                "Sid": "EventBridgeDelivers",
                "Effect": "Allow",
                "Principal": {"Service": ["events.amazonaws.com", "sqs.amazonaws.com"]},
                "Action": "sqs:SendMessage",
                "Resource": queue_arn,
                "Condition": {"ArnEquals": {"aws:SourceArn": rule_arns}},
            },
            {
                "Sid": "DenyNonTLS",
                "Effect": "Deny",
                "Principal": "*",
                "Action": "sqs:*",
                "Resource": queue_arn,
                "Condition": {"Bool": {"aws:SecureTransport": "false"}},
            },
        ],
    }


class Karpenter(pulumi.ComponentResource):
    node_role_name: pulumi.Output[str]
    node_role_arn: pulumi.Output[str]
    instance_profile_name: pulumi.Output[str]
    release: pulumi.Resource

    def __init__(
        self,
        name: str,
        cluster: ClusterContext,
        gates: dict[str, dict[str, bool]] | None = None,  # feature_gates(pools, node_repair)
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("training-platform:infra:Karpenter", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        region = aws.get_region().region
        account = aws.get_caller_identity().account_id

        # Nodes: role, instance profile, and an access entry so they can join the cluster.
        role_names = karpenter_role_names(cluster.config_name)
        nodes = node_role(f"{name}-node", cluster.tags, child, role_name=role_names["node"])
        profile = aws.iam.InstanceProfile(
            f"{name}-node",
            name=role_names["node"],
            role=nodes.name,
            tags=cluster.tags,
            opts=child,
        )
        node_access = aws.eks.AccessEntry(
            f"{name}-node",
            cluster_name=cluster.name,
            principal_arn=nodes.arn,
            type="EC2_LINUX",
            tags=cluster.tags,
            opts=child,
        )

        # ARNs built from names, so the policies below are known in a preview of a new stack
        # (the policy pack refuses to pass a policy document it cannot read).
        queue_name = f"karpenter-{cluster.config_name}"
        aws_partition = partition()
        queue_arn = f"arn:{aws_partition}:sqs:{region}:{account}:{queue_name}"
        node_role_arn = f"arn:{aws_partition}:iam::{account}:role/{role_names['node']}"
        rule_names = {
            event: f"{cluster.config_name}-{short}" for event, short in RULE_NAMES.items()
        }
        rule_arns = [
            f"arn:{aws_partition}:events:{region}:{account}:rule/{rule}"
            for rule in rule_names.values()
        ]

        # Interruption handling: EventBridge -> SQS -> controller drains before AWS reclaims.
        queue = aws.sqs.Queue(
            f"{name}-interruption",
            name=queue_name,
            message_retention_seconds=300,
            sqs_managed_sse_enabled=True,
            tags=cluster.tags,
            opts=child,
        )
        queue_policy = aws.sqs.QueuePolicy(
            f"{name}-interruption",
            queue_url=queue.url,
            policy=json.dumps(interruption_queue_policy(queue_arn, rule_arns)),
            opts=child,
        )
        for event, (source, detail_type) in INTERRUPTION_EVENTS.items():
            rule = aws.cloudwatch.EventRule(
                f"{name}-{event}",
                name=rule_names[event],
                description=f"{detail_type} events for Karpenter in {cluster.config_name}",
                event_pattern=json.dumps({"source": [source], "detail-type": [detail_type]}),
                tags=cluster.tags,
                opts=child,
            )
            aws.cloudwatch.EventTarget(f"{name}-{event}", rule=rule.name, arn=queue.arn, opts=child)

        # Controller: Pod Identity role for the chart's service account.
        controller_role = pod_identity_role(
            f"{name}-controller",
            cluster.config_name,
            NAMESPACE,
            SERVICE_ACCOUNT,
            [],
            cluster.tags,
            child,
            inline_policy=json.dumps(
                controller_policy(
                    cluster.config_name,
                    region,
                    aws_partition,
                    account,
                    queue_arn,
                    node_role_arn,
                    reboot="rebootForRepair" in (gates or {}).get("awsFeatureGates", {}),
                )
            ),
            role_name=role_names["controller"],
        )
        identity = aws.eks.PodIdentityAssociation(
            f"{name}-controller",
            cluster_name=cluster.name,
            namespace=NAMESPACE,
            service_account=SERVICE_ACCOUNT,
            role_arn=controller_role.arn,
            tags=cluster.tags,
            opts=child,
        )

        # CRDs from their own chart: Helm installs a chart's crds/ folder once and never
        # upgrades it, so CRDs shipped inside the controller chart would stay at the first version.
        crds = helm_release(
            "karpenter-crd",
            KARPENTER_CRD_CHART,
            NAMESPACE,
            {},
            cluster.in_cluster(self),
        )
        self.release = helm_release(
            "karpenter",
            KARPENTER_CHART,
            NAMESPACE,
            {
                "settings": {
                    "clusterName": cluster.config_name,
                    "interruptionQueue": queue.name,
                    # Helm merges these maps into the chart's, keeping its other gates' defaults.
                    **(gates or {}),
                },
                "serviceAccount": {"name": SERVICE_ACCOUNT},
                "replicas": 2,
                # Karpenter must not run on the nodes it manages.
                **SYSTEM_PLACEMENT,
                "dnsPolicy": "Default",
                "controller": {
                    "resources": {
                        "requests": {"cpu": "500m", "memory": "1Gi"},
                        "limits": {"memory": "1Gi"},
                    }
                },
            },
            # Created after, and on destroy deleted only after, everything Karpenter needs to
            # remove its nodes: its nodes to run on, its credentials and permissions, its
            # interruption queue. NodePools depend on this release, so they (and the instances
            # they launched) go first.
            cluster.in_cluster(
                self,
                crds,
                *cluster.controller_prerequisites,
                *controller_role.ready,
                identity,
                node_access,
                *nodes.ready,
                profile,
                queue_policy,
            ),
            skip_crds=True,
        )
        # kube-system is EKS's (CoreDNS answers every pod there): only Karpenter's own pods are
        # isolated. Karpenter serves no webhook since v1.1 (charts/karpenter/templates); its
        # probes and metrics come from its node or no one.
        k8s.networking.v1.NetworkPolicy(
            f"{name}-default-deny",
            metadata={"name": "karpenter-default-deny-ingress", "namespace": NAMESPACE},
            spec=default_deny_ingress({"matchLabels": POD_LABELS}),
            opts=cluster.in_cluster(self, self.release),
        )
        self.node_role_name = nodes.name
        self.node_role_arn = nodes.arn
        self.instance_profile_name = profile.name
        self.register_outputs(
            {"nodeRoleName": nodes.name, "instanceProfile": profile.name, "queue": queue.name}
        )
