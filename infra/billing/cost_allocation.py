"""CostAllocationTags: the stack's tag keys active for Cost Explorer and the Cost and Usage Report.

Activation is account-wide, not the stack's: two stacks billed to one payer share the keys. So
a removed or destroyed stack leaves them active (retain_on_delete); deactivating one would take
it away from every other stack's bill, and from the months already billed under it.
"""

import pulumi
import pulumi_aws as aws

from infra.core.tags import COST_ALLOCATION_TAGS


class CostAllocationTags(pulumi.ComponentResource):
    def __init__(self, name: str, opts: pulumi.ResourceOptions | None = None):
        super().__init__("training-platform:billing:CostAllocationTags", name, None, opts)
        kept = pulumi.ResourceOptions(parent=self, retain_on_delete=True)
        for key in COST_ALLOCATION_TAGS:
            slug = key.replace(":", "-").replace("/", "-")
            aws.costexplorer.CostAllocationTag(
                f"{name}-{slug}", tag_key=key, status="Active", opts=kept
            )
        self.register_outputs({})
