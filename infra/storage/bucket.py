"""TrainingBucket: the S3 bucket for datasets, checkpoints and trained models."""

import json

import pulumi
import pulumi_aws as aws

from infra.core.data_holders import DataGuard
from infra.core.iam import partition
from infra.storage.config import CHECKPOINT_PREFIX, FSX_EXPORT_PREFIX, BucketConfig
from infra.storage.facts import BUCKET


def prefix_access_policy(
    bucket_arn: str, prefix: str, key: tuple[str, str, str] | None = None, write: bool = True
) -> dict:
    """IAM policy: read (and with `write`, write) objects under `prefix` of one bucket, list only
    that prefix.

    With SSE-KMS, S3 calls KMS as the caller: writing needs kms:GenerateDataKey and reading
    kms:Decrypt on the bucket's key, or every request is denied. `key` is (region, account,
    alias): the grant names the key by its alias, because the key's ARN is unknown until AWS
    creates it and a policy that cannot be read in a preview fails the policy pack.
    """
    prefix = prefix.strip("/")
    objects = ["s3:GetObject"]
    if write:
        objects += ["s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"]
    statements = [
        {
            "Sid": "ObjectsUnderPrefix",
            "Effect": "Allow",
            "Action": objects,
            "Resource": f"{bucket_arn}/{prefix}/*",
        },
        {
            "Sid": "ListPrefix",
            "Effect": "Allow",
            "Action": "s3:ListBucket",
            "Resource": bucket_arn,
            # With the slash: `checkpoints/team-a` alone would list team-a2's keys too.
            "Condition": {"StringLike": {"s3:prefix": [f"{prefix}/", f"{prefix}/*"]}},
        },
    ]
    if key:
        region, account, alias = key
        statements.append(
            {
                "Sid": "BucketKey",
                "Effect": "Allow",
                "Action": ["kms:GenerateDataKey", "kms:Decrypt"] if write else ["kms:Decrypt"],
                "Resource": f"arn:{bucket_arn.split(':')[1]}:kms:{region}:{account}:key/*",
                "Condition": {"ForAnyValue:StringEquals": {"kms:ResourceAliases": alias}},
            }
        )
    return {"Version": "2012-10-17", "Statement": statements}


def bucket_key_policy(bucket_arn: str, account: str, region: str, dns_suffix: str) -> dict:
    """Key policy of the bucket's KMS key: IAM policies of this account decide who uses it, and
    FSx data repository associations of this account may use it through S3 for this bucket.

    The FSx statement is the one the FSx for Lustre guide gives for SSE-KMS buckets ("Working with
    server-side encrypted Amazon S3 buckets"); with S3 Bucket Keys the encryption context is the
    bucket's ARN.
    """
    partition = bucket_arn.split(":")[1]
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "AccountIamPolicies",
                "Effect": "Allow",
                "Principal": {"AWS": f"arn:{partition}:iam::{account}:root"},
                "Action": "kms:*",
                "Resource": "*",
            },
            {
                "Sid": "FsxDataRepositoryThroughS3",
                "Effect": "Allow",
                "Principal": {"AWS": "*"},
                "Action": [
                    "kms:Encrypt",
                    "kms:Decrypt",
                    "kms:ReEncrypt*",
                    "kms:GenerateDataKey*",
                    "kms:DescribeKey",
                ],
                "Resource": "*",
                "Condition": {
                    "StringEquals": {
                        "kms:CallerAccount": account,
                        "kms:ViaService": f"s3.{region}.{dns_suffix}",
                        "kms:EncryptionContext:aws:s3:arn": bucket_arn,
                    },
                    "StringLike": {"aws:userid": "*:FSx"},
                },
            },
        ],
    }


def tls_only_policy(bucket_arn: str) -> dict:
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "DenyNonTLS",
                "Effect": "Deny",
                "Principal": "*",
                "Action": "s3:*",
                "Resource": [bucket_arn, f"{bucket_arn}/*"],
                "Condition": {"Bool": {"aws:SecureTransport": "false"}},
            }
        ],
    }


class TrainingBucket(pulumi.ComponentResource):
    name: pulumi.Output[str]
    arn: pulumi.Output[str]
    key: tuple[str, str, str] | None  # (region, account, alias) of the SSE-KMS key, if any
    ready: list[pulumi.Resource]  # what a job using the bucket waits for

    def __init__(
        self,
        name: str,
        config: BucketConfig,
        key_alias: str,
        tags: dict[str, str],
        data: DataGuard,
        opts: pulumi.ResourceOptions | None = None,
    ):
        """`key_alias` (alias/...) names the SSE-KMS key, when the bucket has one."""
        super().__init__("training-platform:infra:TrainingBucket", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        # The bucket and its key hold the data: protected (infra/core/data_holders.py).
        holding = pulumi.ResourceOptions.merge(child, data.protect(BUCKET))
        bucket = aws.s3.Bucket(
            name,
            force_destroy=config.force_destroy,
            tags=data.tags(BUCKET, tags),
            opts=holding,
        )
        # The ARN from the bucket's name (known in a preview, the `arn` output is not), so the
        # policy pack can read the policies below before the bucket exists.
        aws_partition = partition()
        arn = bucket.bucket.apply(lambda bucket_name: f"arn:{aws_partition}:s3:::{bucket_name}")
        aws.s3.BucketPublicAccessBlock(
            name,
            bucket=bucket.id,
            block_public_acls=True,
            block_public_policy=True,
            ignore_public_acls=True,
            restrict_public_buckets=True,
            opts=child,
        )
        aws.s3.BucketOwnershipControls(
            name, bucket=bucket.id, rule={"object_ownership": "BucketOwnerEnforced"}, opts=child
        )
        if config.kms:
            key = aws.kms.Key(
                f"{name}-sse",
                description="S3 training bucket encryption",
                enable_key_rotation=True,
                deletion_window_in_days=30,
                policy=arn.apply(
                    lambda arn: json.dumps(
                        bucket_key_policy(
                            arn,
                            aws.get_caller_identity().account_id,
                            aws.get_region().region,
                            aws.get_partition().dns_suffix,
                        )
                    )
                ),
                tags=data.tags(BUCKET, tags),
                opts=holding,
            )
            alias = aws.kms.Alias(
                f"{name}-sse", name=key_alias, target_key_id=key.key_id, opts=child
            )
            default = {"sse_algorithm": "aws:kms", "kms_master_key_id": key.arn}
            self.key = (aws.get_region().region, aws.get_caller_identity().account_id, key_alias)
            self.ready: list[pulumi.Resource] = [alias]
        else:
            default = {"sse_algorithm": "AES256"}
            self.key = None
            self.ready = []
        encryption = aws.s3.BucketServerSideEncryptionConfiguration(
            name,
            bucket=bucket.id,
            rules=[
                {
                    "apply_server_side_encryption_by_default": default,
                    "bucket_key_enabled": config.kms,
                }
            ],
            opts=child,
        )
        self.ready.append(encryption)
        versioning = aws.s3.BucketVersioning(
            name, bucket=bucket.id, versioning_configuration={"status": "Enabled"}, opts=child
        )
        aws.s3.BucketLifecycleConfiguration(
            name,
            bucket=bucket.id,
            rules=[
                {
                    # The trainer keeps the last N checkpoints itself; this catches what a dead
                    # run left behind and the old versions that versioning keeps.
                    "id": "expire-old-checkpoints",
                    "status": "Enabled",
                    "filter": {"prefix": CHECKPOINT_PREFIX},
                    "expiration": {"days": config.checkpoint_retention_days},
                    "noncurrent_version_expiration": {
                        "noncurrent_days": config.noncurrent_version_days
                    },
                },
                {
                    # FSx exports every checkpoint the jobs write on Lustre here, overwriting
                    # the same keys as they change: the current objects are the file system's
                    # (they never expire), the versions they replace go.
                    "id": "expire-overwritten-fsx-exports",
                    "status": "Enabled",
                    "filter": {"prefix": f"{FSX_EXPORT_PREFIX}/"},
                    "noncurrent_version_expiration": {
                        "noncurrent_days": config.noncurrent_version_days
                    },
                },
                {
                    "id": "abort-incomplete-uploads",
                    "status": "Enabled",
                    "filter": {"prefix": ""},
                    "abort_incomplete_multipart_upload": {"days_after_initiation": 3},
                },
            ],
            opts=pulumi.ResourceOptions(parent=self, depends_on=[versioning]),
        )
        aws.s3.BucketPolicy(
            name,
            bucket=bucket.id,
            policy=arn.apply(lambda bucket_arn: json.dumps(tls_only_policy(bucket_arn))),
            opts=child,
        )
        self.name = bucket.bucket
        self.arn = arn
        self.register_outputs({"name": self.name, "arn": self.arn})

    def prefix_policy(self, prefix: str, write: bool = True) -> pulumi.Output[str]:
        """Policy document (JSON) granting read (and with `write`, write) on `prefix` of this
        bucket only."""
        return self.arn.apply(
            lambda arn: json.dumps(prefix_access_policy(arn, prefix, self.key, write))
        )
