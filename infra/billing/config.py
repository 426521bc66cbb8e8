from pydantic import Field

from infra.core.config import ImageConfig, Model


class BillingConfig(Model):
    """The bill's side of the cost figures: which tags Cost Explorer may group by, and the record
    of what ran that `devctl usage` counts."""

    activate_cost_allocation_tags: bool = Field(
        default=False,
        description="Activate the stack's tags (infra/core/tags.py) as cost allocation tags. "
        "Only the payer account of an AWS Organization (or a standalone account) may, and AWS "
        "accepts a key only once it has appeared in billing data, up to a day after the first "
        "tagged resource: set it in a second `pulumi up`, run with the payer account's "
        "credentials.",
    )
    record_usage: bool = Field(
        default=True,
        description="Run the usage recorder (usagerecorder/recorder.py): every 5 minutes it "
        "records the pools' nodes and the teams' Kueue admissions, so `devctl usage` counts "
        "nodes and jobs that are gone. Turning it off deletes namespace usage-records with the "
        "node records, a data loss acknowledgeDataLoss must accept (holder billing.recordUsage); "
        "the teams' usage-jobs-* ConfigMaps stay until deleted by hand.",
    )
    usage_record_days: int = Field(
        default=35,
        ge=1,
        le=400,
        description="Days of records kept, 1 to 400 (a day's records are one ConfigMap per "
        "team and one for the nodes). The default covers a monthly bill and its first days.",
    )
    usage_recorder_image: ImageConfig = Field(
        default=ImageConfig(),
        description="The recorder's image by digest; empty: built from usagerecorder/Dockerfile "
        "and pushed to ECR by pulumi up.",
    )
