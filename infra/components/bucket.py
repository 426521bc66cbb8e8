"""TrainingBucket: the S3 bucket for datasets, checkpoints and trained models."""

import json

import pulumi
import pulumi_aws as aws

from infra.config import CHECKPOINT_PREFIX, BucketConfig


def prefix_read_write_policy(bucket_arn: str, prefix: str) -> dict:
    """IAM policy: read/write objects under `prefix` of one bucket, list only that prefix."""
    prefix = prefix.strip("/")
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "ObjectsUnderPrefix",
                "Effect": "Allow",
                "Action": [
                    "s3:GetObject",
                    "s3:PutObject",
                    "s3:DeleteObject",
                    "s3:AbortMultipartUpload",
                ],
                "Resource": f"{bucket_arn}/{prefix}/*",
            },
            {
                "Sid": "ListPrefix",
                "Effect": "Allow",
                "Action": "s3:ListBucket",
                "Resource": bucket_arn,
                "Condition": {"StringLike": {"s3:prefix": [prefix, f"{prefix}/*"]}},
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

    def __init__(
        self,
        name: str,
        config: BucketConfig,
        tags: dict[str, str],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("training-platform:infra:TrainingBucket", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        bucket = aws.s3.Bucket(name, force_destroy=config.force_destroy, tags=tags, opts=child)
        # The ARN from the bucket's name (known in a preview, the `arn` output is not), so the
        # policy pack can read the policies below before the bucket exists.
        partition = aws.get_partition().partition
        arn = bucket.bucket.apply(lambda bucket_name: f"arn:{partition}:s3:::{bucket_name}")
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
                tags=tags,
                opts=child,
            )
            default = {"sse_algorithm": "aws:kms", "kms_master_key_id": key.arn}
        else:
            default = {"sse_algorithm": "AES256"}
        aws.s3.BucketServerSideEncryptionConfiguration(
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
                    "noncurrent_version_expiration": {"noncurrent_days": 7},
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

    def prefix_policy(self, prefix: str) -> pulumi.Output[str]:
        """Policy document (JSON) granting read/write on `prefix` of this bucket only."""
        return self.arn.apply(lambda arn: json.dumps(prefix_read_write_policy(arn, prefix)))
