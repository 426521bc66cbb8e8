"""Data rules: every resource that holds data says so and is protected, unless the stack file
acknowledges losing it (infra/core/data_holders.py, `acknowledgeDataLoss`).

A real preview hands the rule each resource's options, `protect` among them; what a change would
replace or delete is the plan's and the pull-request gate's concern (deploy/day_two.py), which
see the deployed state, not the policy pack.
"""

from collections.abc import Iterable, Mapping

from pulumi_policy import ResourceValidationArgs

from infra.core.data_holders import HOLDER_ANNOTATION, HOLDER_TAG
from infra.core.declared import dig
from policies.rules.base import config_of

# Types whose every resource holds data; a Namespace holds it when a team or a user works in it.
HOLDING_TYPES = {
    "aws:fsx/lustreFileSystem:LustreFileSystem",
    "aws:efs/fileSystem:FileSystem",
    "aws:s3/bucket:Bucket",
    "aws:s3/bucketV2:BucketV2",
    "aws:kms/key:Key",
    "aws:ecr/repository:Repository",
    "eks:index:Cluster",
    "aws:eks/cluster:Cluster",
}
NAMESPACE = "kubernetes:core/v1:Namespace"
TENANT_LABELS = ("training-platform/team", "dev.training-platform.io/owner")


def holder(props: Mapping) -> str | None:
    for key in ("tags", "clusterTags"):
        tags = props.get(key)
        if isinstance(tags, Mapping) and tags.get(HOLDER_TAG):
            return str(tags[HOLDER_TAG])
    annotation = dig(props, "metadata", "annotations", HOLDER_ANNOTATION)
    return str(annotation) if annotation else None


def protected(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    kind = args.resource_type
    labels = dig(props, "metadata", "labels") or {}
    tenant = kind == NAMESPACE and any(label in labels for label in TENANT_LABELS)
    if kind not in HOLDING_TYPES and not tenant:
        return
    name = holder(props)
    if name is None:
        where = "annotation " + HOLDER_ANNOTATION if kind == NAMESPACE else "tag " + HOLDER_TAG
        yield f"holds data but names no holder: set its {where} (infra/core/data_holders.py)"
        return
    acknowledged = config_of(args)["acknowledgedDataLoss"]
    if name not in acknowledged and not (args.opts and args.opts.protect):
        yield (
            f"holds {name}'s data but is not protected: only a holder listed in "
            "acknowledgeDataLoss may be replaced or deleted"
        )
