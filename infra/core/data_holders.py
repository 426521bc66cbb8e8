"""What holds data the platform cannot rebuild, and the one switch that lets an edit lose it.

Every resource whose replacement or deletion loses data is a *data holder*. Each carries its
holder key (a stack-config path: `storage.fsx`, `devServers.users[alice]`, ...) in an AWS tag or a
Kubernetes annotation, so that the offline plan, the policy pack and the gate over a real
`pulumi preview --json` all find it the same way, and is `protect`ed: the Pulumi engine refuses
to replace or delete it (pulumi/pulumi pkg/resource/deploy/step_generator.go: a replacement needs
`protect` off in the program; step.go DeleteStep.Apply: a deletion needs it off in the state
already, i.e. one `pulumi up` before the one that removes it).

`acknowledgeDataLoss` in stack config names the holders whose loss is accepted; only those lose
`protect`. Nothing else releases data. Which holders there are, and what losing each loses, is
each integration's to say (`Integration.holders`; the DevServers' in devservers/day_two.py).
"""

from dataclasses import dataclass

import pulumi

# Where the holder key is written: an AWS tag, a Kubernetes annotation.
HOLDER_TAG = "training-platform:data"
HOLDER_ANNOTATION = "training-platform/data"


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
