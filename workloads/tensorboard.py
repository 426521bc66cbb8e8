"""TeamTensorBoard: one TensorBoard per team, over the curves of all the team's jobs.

It reads what the trainer writes beside its checkpoints (trainer/scalars.py): the team's S3
prefix `s3://<bucket>/checkpoints/<namespace>` with a Pod Identity role that may only read that
prefix, and the team's EFS and FSx claims, mounted read-only. It runs the trainer image (which
ships TensorBoard) through trainer.tensorboard_server, so a store that fails never stops the
others' curves. It listens on the pod's loopback only: members reach it with `kubectl
port-forward -n <namespace> svc/tensorboard 6006` (the kubelet forwards into the pod's network
namespace), no pod can. It runs on the system nodes: light and always on, it must not hold a
pool node up outside Kueue's quota, which equals the pools' ceilings.
"""

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from infra.core.context import ClusterContext
from infra.core.iam import pod_identity_role
from infra.core.nodes import SYSTEM_PLACEMENT
from infra.kueue.config import TENSORBOARD, TeamConfig
from infra.storage.bucket import TrainingBucket
from infra.storage.config import CHECKPOINT_PREFIX
from trainer import RESTRICTED_CONTAINER, RESTRICTED_POD
from workloads.manifests import CHECKPOINT_ROOTS, MOUNTS

NAME = TENSORBOARD
PORT = 6006
LABELS = {"app.kubernetes.io/name": NAME}
# Each store's curves show as runs `<store>/<job>/tensorboard`. TensorBoard lists every store
# again at each reload: on S3 that is LIST requests, billed per thousand.
RELOAD_SECONDS = 30


def logdir_spec(namespace: str, bucket: str, storage: set[str]) -> str:
    """TensorBoard's --logdir_spec: the team's S3 prefix, and the checkpoint folders of its
    shared file systems (where workloads.manifests puts the jobs that checkpoint there)."""
    # With the slash: the team's role lists its prefix as a folder only (infra/storage/bucket.py).
    stores = [("s3", f"s3://{bucket}/{CHECKPOINT_PREFIX}{namespace}/")]
    stores += [(kind, CHECKPOINT_ROOTS[kind]) for kind in sorted(storage)]
    return ",".join(f"{name}:{path}" for name, path in stores)


def deployment(namespace: str, image, spec: str, region: str, storage: set[str]) -> dict:
    volumes = [{"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}}]
    mounts = [{"name": "tmp", "mountPath": "/tmp"}]  # TensorBoard's own info file
    for kind in sorted(storage):
        mount = MOUNTS[kind][0]  # the one holding the checkpoints
        claim = {"claimName": mount.claim, "readOnly": True}
        volumes.append({"name": mount.volume, "persistentVolumeClaim": claim})
        mounts.append({"name": mount.volume, "mountPath": mount.path, "readOnly": True})
    command = ["python", "-m", "trainer.tensorboard_server", "--logdir_spec", spec]
    command += ["--host", "127.0.0.1", "--port", str(PORT)]
    command += ["--reload_interval", str(RELOAD_SECONDS)]
    return {
        "metadata": {"name": NAME, "namespace": namespace, "labels": LABELS},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": LABELS},
            "template": {
                "metadata": {"labels": LABELS},
                "spec": {
                    "serviceAccountName": NAME,
                    # Pod Identity mounts its own token; TensorBoard never calls the API server.
                    "automountServiceAccountToken": False,
                    **SYSTEM_PLACEMENT,
                    "securityContext": RESTRICTED_POD,
                    "containers": [
                        {
                            "name": NAME,
                            "image": image,
                            "command": command,
                            "env": [{"name": "AWS_REGION", "value": region}],
                            "ports": [{"name": "http", "containerPort": PORT}],
                            "resources": {
                                "requests": {"cpu": "100m", "memory": "512Mi"},
                                "limits": {"memory": "1Gi"},
                            },
                            "securityContext": {
                                **RESTRICTED_CONTAINER,
                                "readOnlyRootFilesystem": True,
                            },
                            "volumeMounts": mounts,
                        }
                    ],
                    "volumes": volumes,
                },
            },
        },
    }


def service(namespace: str) -> dict:
    """What `kubectl port-forward svc/tensorboard 6006` resolves to the TensorBoard's pod and
    port; nothing reaches it through the Service itself (it listens on loopback)."""
    return {
        "metadata": {"name": NAME, "namespace": namespace, "labels": LABELS},
        "spec": {
            "selector": LABELS,
            "ports": [{"name": "http", "port": PORT, "targetPort": "http"}],
        },
    }


class TeamTensorBoard(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        team: TeamConfig,
        namespace: k8s.core.v1.Namespace,
        image: pulumi.Input[str],
        bucket: TrainingBucket,
        cluster: ClusterContext,
        storage: set[str],  # the shared file systems the team has a claim of: fsx, efs
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("training-platform:workloads:TeamTensorBoard", name, None, opts)
        k8s_child = cluster.in_cluster(self, namespace)
        namespace_name = namespace.metadata.name
        role = pod_identity_role(
            name,
            cluster.name,
            namespace_name,
            NAME,
            [],
            cluster.tags,
            pulumi.ResourceOptions(parent=self),
            inline_policy=namespace_name.apply(
                lambda ns: bucket.prefix_policy(f"{CHECKPOINT_PREFIX}{ns}", write=False)
            ),
        )
        account = k8s.core.v1.ServiceAccount(
            name, metadata={"name": NAME, "namespace": namespace_name}, opts=k8s_child
        )
        identity = aws.eks.PodIdentityAssociation(
            name,
            cluster_name=cluster.name,
            namespace=namespace_name,
            service_account=NAME,
            role_arn=role.arn,
            tags=cluster.tags,
            opts=pulumi.ResourceOptions(parent=self, depends_on=role.ready),
        )
        region = aws.get_region().region
        manifest = pulumi.Output.all(namespace_name, bucket.name).apply(
            lambda v: deployment(v[0], image, logdir_spec(v[0], v[1], storage), region, storage)
        )
        # The identity exists before the pod starts: EKS injects its credentials at creation.
        k8s.apps.v1.Deployment(
            name,
            metadata=manifest["metadata"],
            spec=manifest["spec"],
            opts=pulumi.ResourceOptions.merge(
                k8s_child,
                pulumi.ResourceOptions(
                    depends_on=[account, identity, *bucket.ready],
                    # The first start pulls the trainer image (gigabytes) onto a system node.
                    custom_timeouts=pulumi.CustomTimeouts(create="20m", update="20m"),
                ),
            ),
        )
        front = namespace_name.apply(service)
        k8s.core.v1.Service(name, metadata=front["metadata"], spec=front["spec"], opts=k8s_child)
        self.register_outputs({})
