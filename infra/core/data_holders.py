"""What holds data the platform cannot rebuild, and the one switch that lets an edit lose it.

Every resource whose replacement or deletion loses data is a *data holder*. Each carries its
holder key (a stack-config path: `storage.fsx`, `devServers.users[alice]`, ...) in an AWS tag or a
Kubernetes annotation, so that the offline plan, the policy pack and the gate over a real
`pulumi preview --json` all find it the same way, and is `protect`ed: the Pulumi engine refuses
to replace or delete it (pulumi/pulumi pkg/resource/deploy/step_generator.go: a replacement needs
`protect` off in the program; step.go DeleteStep.Apply: a deletion needs it off in the state
already, i.e. one `pulumi up` before the one that removes it).

`acknowledgeDataLoss` in stack config names the holders whose loss is accepted; only those lose
`protect`. Nothing else releases data.
"""

import re
from dataclasses import dataclass

import pulumi

# Where the holder key is written: an AWS tag, a Kubernetes annotation.
HOLDER_TAG = "training-platform:data"
HOLDER_ANNOTATION = "training-platform/data"

CLUSTER = "cluster"
IMAGES = "images"
BUCKET = "storage.bucket"
EFS = "storage.efs"
FSX = "storage.fsx"


def user_holder(user: str) -> str:
    return f"devServers.users[{user}]"


def team_holder(team: str) -> str:
    return f"queues.teams[{team}]"


HOLDER_PATTERN = re.compile(
    r"^(cluster|images|storage\.(bucket|efs|fsx)|devServers\.users\[[a-z0-9-]+\]"
    r"|queues\.teams\[[a-z0-9-]+\])$"
)

# What each kind of holder loses when it is replaced or deleted: what the plan and the gate say.
LOSSES = {
    CLUSTER: "every Kubernetes object (jobs, DevServers, claims, secrets), the running pods, and "
    "the volumes whose reclaim policy is Delete",
    IMAGES: "every image in the platform's ECR repositories, those the running jobs and servers "
    "pull included",
    BUCKET: "every dataset, checkpoint and model in the training bucket (and with its KMS key, "
    "the ability to read them)",
    EFS: "every user's /shared and every team's EFS checkpoints (AWS Backup recovery points stay)",
    FSX: "every file on FSx for Lustre not yet exported to the bucket (FSx backs up no file "
    "system linked to S3); what the data repository associations exported stays, in "
    "s3://<bucket>/fsx/checkpoints/ and the dataset prefix, and a new file system imports it "
    "again: export what is pending first (docs: day two, FSx)",
    "devServers.users": "the user's namespace: her DevServers stop, her LocalQueue and quota go; "
    "her homes are kept as Released volumes (StorageClass reclaimPolicy Retain)",
    "queues.teams": "the team's namespace: its running jobs are killed and its claims deleted; "
    "the team's EFS directory and FSx files stay, its S3 checkpoints stay",
}


def loss(holder: str) -> str:
    """What losing `holder` loses, in words."""
    return LOSSES[holder.split("[", 1)[0]]


@dataclass(frozen=True)
class DataGuard:
    """The holders the stack file releases (acknowledgeDataLoss); every other one is protected."""

    released: frozenset[str] = frozenset()

    def protect(self, holder: str) -> pulumi.ResourceOptions:
        """Options for a data holder: `protect` unless its loss is acknowledged."""
        return pulumi.ResourceOptions(protect=holder not in self.released)

    def tags(self, holder: str, tags: dict[str, str]) -> dict[str, str]:
        return {**tags, HOLDER_TAG: holder}


def annotated(metadata: dict, holder: str) -> dict:
    """Kubernetes metadata with the holder annotation added."""
    annotations = {**(metadata.get("annotations") or {}), HOLDER_ANNOTATION: holder}
    return {**metadata, "annotations": annotations}
