from pydantic import Field

from infra.core.config import Model


class BillingConfig(Model):
    """The bill's side of the cost figures: which tags Cost Explorer may group by."""

    activate_cost_allocation_tags: bool = Field(
        default=False,
        description="Activate the stack's tags (infra/core/tags.py) as cost allocation tags. "
        "Only the payer account of an AWS Organization (or a standalone account) may, and AWS "
        "accepts a key only once it has appeared in billing data, up to a day after the first "
        "tagged resource: set it in a second `pulumi up`, run with the payer account's "
        "credentials.",
    )
