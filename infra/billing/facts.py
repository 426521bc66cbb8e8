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

# The usage recorder's namespace holds the node records (infra/billing/usage_recorder.py).
USAGE_RECORDS = "billing.recordUsage"
HOLDERS = {
    USAGE_RECORDS: "the usage recorder's node records: `devctl usage` no longer counts the pools' "
    "nodes that are gone (the teams' job records stay in their namespaces)",
}
