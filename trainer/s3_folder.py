"""A job's checkpoint folder in S3, read inside trainer.fetch's copy pod with the pod's own AWS
identity (trainer.cluster_copy):

    python s3_folder.py s3://BUCKET/PREFIX          every object under PREFIX, one a line,
                                                    named relative to it
    python s3_folder.py s3://BUCKET/PREFIX FOLDER   the objects under PREFIX/FOLDER/ as a tar
                                                    stream on stdout, named relative to PREFIX

trainer.cluster_copy sends this file's text to the pod (`python -c`), so the job's image, of
whatever revision, runs this revision of it: hence the standard library and boto3 alone. A
failure is one line, ERROR and the reason, on stdout (the copy reads no stderr), and exit status
1.
"""

import sys
import tarfile

import boto3
from botocore.exceptions import BotoCoreError, ClientError

ERROR = "error: "


def objects(s3, bucket: str, prefix: str):
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        yield from page.get("Contents", [])


def main(argv: list[str]) -> int:
    uri, *folder = argv
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    base = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
    # The region and credentials of the pod's environment: EKS Pod Identity's, for the team's
    # service account.
    s3 = boto3.client("s3")
    try:
        if not folder:
            for found in objects(s3, bucket, base):
                print(found["Key"][len(base) :])
            return 0
        with tarfile.open(fileobj=sys.stdout.buffer, mode="w|") as tar:
            for found in objects(s3, bucket, f"{base}{folder[0]}/"):
                member = tarfile.TarInfo(found["Key"][len(base) :])
                member.size = found["Size"]
                tar.addfile(member, s3.get_object(Bucket=bucket, Key=found["Key"])["Body"])
    except (BotoCoreError, ClientError) as error:
        print(f"{ERROR}{str(error).strip().splitlines()[0]}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
