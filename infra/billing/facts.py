"""What the platform knows about the billing kinds it declares."""

from infra.core.facts import Kind

COST_ALLOCATION_TAG = "aws:costexplorer/costAllocationTag:CostAllocationTag"
KINDS = (
    Kind(
        COST_ALLOCATION_TAG,
        free="Billing: activating a cost allocation tag bills nothing (Cost Explorer's API "
        "requests do, a cent each)",
    ),
)
