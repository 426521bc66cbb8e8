"""A controller of the platform's own that runs as a CronJob on the system nodes: the GPU
registration watch and the usage recorder. One run lists a few collections and writes a few
objects, so runs never overlap (Forbid), one is killed well before the next would start, and a
failed run is retried by the next one rather than by a backoff."""

import pulumi
import pulumi_kubernetes as k8s

from infra.core.nodes import SYSTEM_PLACEMENT


def system_cronjob(
    name: str,
    namespace: str,
    container: str,
    image: pulumi.Input[str],
    args: list[str],
    schedule: str,
    deadline_s: int,
    opts: pulumi.ResourceOptions,
) -> k8s.batch.v1.CronJob:
    """CronJob `name` whose pods run as ServiceAccount `name`, non-root with no capabilities, on
    a read-only root file system."""
    labels = {"app.kubernetes.io/name": name}
    return k8s.batch.v1.CronJob(
        name,
        metadata={"name": name, "namespace": namespace, "labels": labels},
        spec={
            "schedule": schedule,
            "concurrencyPolicy": "Forbid",
            "successfulJobsHistoryLimit": 1,
            "failedJobsHistoryLimit": 3,
            "jobTemplate": {
                "spec": {
                    "backoffLimit": 0,
                    "activeDeadlineSeconds": deadline_s,
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {
                            "serviceAccountName": name,
                            "restartPolicy": "Never",
                            **SYSTEM_PLACEMENT,
                            "securityContext": {
                                "runAsNonRoot": True,
                                "seccompProfile": {"type": "RuntimeDefault"},
                            },
                            "containers": [
                                {
                                    "name": container,
                                    "image": image,
                                    "args": args,
                                    "resources": {
                                        "requests": {"cpu": "50m", "memory": "128Mi"},
                                        "limits": {"memory": "256Mi"},
                                    },
                                    "securityContext": {
                                        "allowPrivilegeEscalation": False,
                                        "readOnlyRootFilesystem": True,
                                        "capabilities": {"drop": ["ALL"]},
                                    },
                                }
                            ],
                        },
                    },
                }
            },
        },
        opts=opts,
    )
