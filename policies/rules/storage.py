"""Storage rules: everything encrypted, production buckets on KMS, no public or plaintext S3."""

from collections.abc import Iterable, Mapping

from pulumi_policy import ReportViolation, ResourceValidationArgs, StackValidationArgs

from infra.core.declared import dig, listed
from policies.rules.base import (
    NODECLASS,
    SSE_CONFIGS,
    allows,
    in_production,
    present,
    spec_of,
    statements_of,
)

BUCKETS = {"aws:s3/bucket:Bucket", "aws:s3/bucketV2:BucketV2"}
PUBLIC_ACLS = {"public-read", "public-read-write", "authenticated-read"}
PUBLIC_GRANTEES = ("AllUsers", "AuthenticatedUsers")


def encrypted(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    kind = args.resource_type
    if kind in {"aws:ebs/volume:Volume", "aws:efs/fileSystem:FileSystem"}:
        if props.get("encrypted") is not True:
            yield "encrypted must be true"
    if kind in SSE_CONFIGS:
        algorithms = [
            dig(r, "applyServerSideEncryptionByDefault", "sseAlgorithm")
            for r in listed(props.get("rules"))
        ]
        if not algorithms or not all(
            a in {"AES256", "aws:kms", "aws:kms:dsse"} for a in algorithms
        ):
            yield f"S3 default encryption must be AES256 or aws:kms, got {algorithms}"
    if kind == "aws:sqs/queue:Queue":
        if props.get("sqsManagedSseEnabled") is not True and not present(props, "kmsMasterKeyId"):
            yield "SQS queue must set sqsManagedSseEnabled or kmsMasterKeyId"
    if kind == "aws:fsx/lustreFileSystem:LustreFileSystem":
        # SCRATCH_1 has no encryption in transit; every other type encrypts at rest and in transit.
        if props.get("deploymentType") in {None, "SCRATCH_1"}:
            yield "FSx for Lustre must not be SCRATCH_1 (unencrypted in transit)"
    if kind == "eks:index:Cluster" and not present(props, "encryptionConfigKeyArn"):
        yield "EKS secrets must be envelope-encrypted: set encryptionConfigKeyArn"
    if kind == "aws:eks/cluster:Cluster" and not present(props, "encryptionConfig"):
        yield "EKS secrets must be envelope-encrypted: set encryptionConfig"
    if kind == "aws:ec2/launchTemplate:LaunchTemplate":
        for mapping in listed(props.get("blockDeviceMappings")):
            if str(dig(mapping, "ebs", "encrypted")).lower() != "true":
                yield f"volume {mapping.get('deviceName')} must be encrypted"
    if kind == NODECLASS:
        for mapping in listed(spec_of(props).get("blockDeviceMappings")):
            if dig(mapping, "ebs", "encrypted") is not True:
                yield f"volume {mapping.get('deviceName')} must be encrypted"
    if (
        kind == "kubernetes:storage.k8s.io/v1:StorageClass"
        and props.get("provisioner") == "ebs.csi.aws.com"
    ):
        if dig(props, "parameters", "encrypted") != "true":
            yield 'EBS StorageClass must set parameters.encrypted: "true"'


def bucket_kms(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    if not in_production(args):
        return
    for rule in listed(props.get("rules")):
        default = dig(rule, "applyServerSideEncryptionByDefault") or {}
        if not str(default.get("sseAlgorithm", "")).startswith("aws:kms"):
            yield "production buckets must use SSE-KMS (storage.bucket.kms: true)"
        elif not present(default, "kmsMasterKeyId"):
            yield "production buckets must name their KMS key (kmsMasterKeyId)"


def public_bucket(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    kind = args.resource_type
    if str(props.get("acl")) in PUBLIC_ACLS:
        yield f"bucket ACL {props.get('acl')} makes objects public"
    grants = listed(dig(props, "accessControlPolicy", "grants"))
    for grant in grants:
        uri = str(dig(grant, "grantee", "uri"))
        if uri.endswith(PUBLIC_GRANTEES):
            yield f"bucket ACL grants {grant.get('permission')} to {uri.rsplit('/', 1)[-1]}"
    if kind in {"aws:s3/bucketPolicy:BucketPolicy", *BUCKETS}:
        for statement in filter(allows, statements_of(props.get("policy"))):
            principal = statement.get("Principal")
            everyone = principal == "*" or "*" in map(str, listed(dig(principal, "AWS")))
            if everyone and not statement.get("Condition"):
                yield "bucket policy allows anyone (Principal *)"
    if kind in {
        "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock",
        "aws:s3/accountPublicAccessBlock:AccountPublicAccessBlock",
    }:
        keys = ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")
        off = [k for k in keys if props.get(k) is not True]
        if off:
            yield f"public access block must set {', '.join(off)} true"


def s3_private_and_tls(args: StackValidationArgs, report: ReportViolation) -> None:
    guards: dict[str, set[str]] = {}
    for resource in args.resources:
        props = resource.props or {}
        for dependency in resource.dependencies or []:
            if resource.resource_type == "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock":
                keys = (
                    "blockPublicAcls",
                    "blockPublicPolicy",
                    "ignorePublicAcls",
                    "restrictPublicBuckets",
                )
                if all(props.get(k) is True for k in keys):
                    guards.setdefault(dependency.urn, set()).add("public-access-block")
            if resource.resource_type == "aws:s3/bucketPolicy:BucketPolicy":
                denies_plain_http = any(
                    s.get("Effect") == "Deny"
                    and dig(s, "Condition", "Bool", "aws:SecureTransport") in ("false", False)
                    for s in statements_of(props.get("policy"))
                )
                if denies_plain_http:
                    guards.setdefault(dependency.urn, set()).add("tls-only")
    for bucket in (r for r in args.resources if r.resource_type in BUCKETS):
        missing = {"public-access-block", "tls-only"} - guards.get(bucket.urn, set())
        if missing:
            report(f"bucket {bucket.name} lacks {', '.join(sorted(missing))}", bucket.urn)
