"""Karpenter's rules that the tests check the platform against, written down from its source
(aws/karpenter-provider-aws, tag v1.14.1, commit bde00654cd316fddb3dccfba3f5ac07039865429;
files named at each rule): what its Helm chart does with the feature gates, and what its
reference controller policy grants for capacity reservations.

Re-read for the pinned v1.15.1 (READ_FOR), whose tag is not in the stored source: at main
1d927085dd81a9df9301e613f371dac5b4d16bfe (2026-08-21), the newest readable commit of the 1.15
line, and the v1.15 docs (website/content/en/v1.15 at d77d1a3a: reference/cloudformation.md,
concepts/disruption.md's opening, reference/annotations). Read there: the chart's core gates and
their FEATURE_GATES rendering are unchanged; the provider's own gates are new
(settings.awsFeatureGates, rendered into AWS_FEATURE_GATES); v1.15's policy adds
ec2:RebootInstances to AllowScopedDeletion for the RebootForRepair gate. Not readable: the 1.15.1
chart itself, so the Helm key of RebootForRepair (`rebootForRepair`, the lowerCamel form every
other gate key has: CHART_AWS_FEATURE_GATES) and of `settings.legacyNodeRepair` (named by the
v1.15.0 release notes, #9709; the platform leaves it unset) are not confirmed from the chart.
"""

# The Karpenter release these rules were last read for: a bump of KARPENTER_CHART fails the suite
# until they are read again (infra/karpenter/tests/test_karpenter.py).
READ_FOR = "1.15.1"

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


# settings.awsFeatureGates (main 1d927085: nodeClassCEL, false) and, per the v1.15.0 release notes
# (#9716: "add the RebootForRepair AWS feature gate"), RebootForRepair, off by default (the EKS
# user guide, "Repair behavior on Karpenter v1.15.0 and later": reboot needs the gate enabled).
CHART_AWS_FEATURE_GATES = {"nodeClassCEL": False, "rebootForRepair": False}
# charts/karpenter/templates/deployment.yaml at main 1d927085: AWS_FEATURE_GATES, as above.
AWS_FEATURE_GATES_ENV = [("NodeClassCEL", "nodeClassCEL"), ("RebootForRepair", "rebootForRepair")]


def feature_gates_env(values: dict, key: str = "featureGates") -> str:
    """The FEATURE_GATES (or, with key awsFeatureGates, AWS_FEATURE_GATES) value the chart
    renders from (merged) Helm values."""
    gates = values["settings"][key]
    pairs = FEATURE_GATES_ENV if key == "featureGates" else AWS_FEATURE_GATES_ENV
    return ",".join(f"{gate}={str(gates[name]).lower()}" for gate, name in pairs)


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


# kubernetes-sigs/karpenter v1.14.1 (commit 6e7eab7a), which provider v1.14.1 builds on, and as
# v1.15's annotations reference states it ("does not block drift when ... the NodeClaim sets a
# terminationGracePeriod"; never expiration or repair): pkg/controllers/disruption/types.go
# NewCandidate. A node whose pods may not be disrupted is no
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


# website/content/en/v1.15/upgrading/compatibility.md (d77d1a3a): the Karpenter releases each
# Kubernetes minor supports, as (oldest, newest) minor; None: no newest named (">= x").
COMPATIBILITY = {
    "1.34": ((1, 6), None),
    "1.35": ((1, 9), None),
    "1.36": ((1, 13), None),
    "1.37": ((1, 15), (1, 15)),  # "1.15.x"
}
