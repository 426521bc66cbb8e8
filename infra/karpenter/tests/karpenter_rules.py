"""Karpenter v1.14.1's rules that the tests check the platform against, written down from its
source (aws/karpenter-provider-aws, tag v1.14.1, commit bde00654cd316fddb3dccfba3f5ac07039865429;
files named at each rule): what its Helm chart does with the feature gates, and what its
reference controller policy grants for capacity reservations.
"""

# charts/karpenter/values.yaml: settings.featureGates and their defaults.
CHART_FEATURE_GATES = {
    "nodeRepair": False,
    "nodeOverlay": False,
    "reservedCapacity": True,
    "spotToSpotConsolidation": False,
    "staticCapacity": False,
    "capacityBuffer": False,
}
# charts/karpenter/templates/deployment.yaml: the controller's FEATURE_GATES environment variable,
# "<Gate>=<value>" pairs joined by commas in this order, each value the settings.featureGates key
# as Go's text/template prints it (a bool as true or false).
FEATURE_GATES_ENV = [
    ("ReservedCapacity", "reservedCapacity"),
    ("SpotToSpotConsolidation", "spotToSpotConsolidation"),
    ("NodeRepair", "nodeRepair"),
    ("NodeOverlay", "nodeOverlay"),
    ("StaticCapacity", "staticCapacity"),
    ("CapacityBuffer", "capacityBuffer"),
]


def feature_gates_env(values: dict) -> str:
    """The FEATURE_GATES value the chart renders from (merged) Helm values."""
    gates = values["settings"]["featureGates"]
    return ",".join(f"{gate}={str(gates[key]).lower()}" for gate, key in FEATURE_GATES_ENV)


# website/content/en/docs/getting-started/getting-started-with-karpenter/cloudformation.yaml,
# KarpenterControllerPolicy: the statements that concern capacity reservations, by Sid, with
# their actions and the resources that cover reservations (partition aws; ${AWS::Region} is the
# stack's region).
RESERVATION_STATEMENTS = {
    "AllowScopedEC2InstanceAccessActions": {
        "actions": ["ec2:RunInstances", "ec2:CreateFleet"],
        "resources": ["arn:aws:ec2:{region}:*:capacity-reservation/*"],
    },
    "AllowRegionalReadActions": {
        "actions": [
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
        "resources": ["*"],
    },
}


# kubernetes-sigs/karpenter v1.14.1 (commit 6e7eab7a), which provider v1.14.1 builds on:
# pkg/controllers/disruption/types.go NewCandidate. A node whose pods may not be disrupted is no
# candidate (state/statenode.go ValidatePodsDisruptable: an active `karpenter.sh/do-not-disrupt`
# on a running pod, pkg/utils/pod/scheduling.go IsDoNotDisruptActive: "true", or a duration not yet
# elapsed since the pod started), except for an eventual method, Drift among them
# (disruption/drift.go Class), when its NodeClaim has a terminationGracePeriod: then the pods are
# deleted when the period runs out.
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"


def drift_may_disrupt(node_pool_spec: dict, pod_annotations: dict) -> bool:
    """Whether Karpenter's drift may take a node of this NodePool from under such a pod."""
    blocks = pod_annotations.get(DO_NOT_DISRUPT) == "true"
    grace = (node_pool_spec.get("template") or {}).get("spec", {}).get("terminationGracePeriod")
    return not blocks or grace is not None
