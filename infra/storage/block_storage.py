"""BlockStorage: the EBS CSI driver, the default gp3 StorageClass, and gp3-home for DevServer homes.

Homes outlive their claims: gp3-home retains the volume when the claim goes (a user removed from
stack config, a namespace deleted), where gp3 deletes it. A StorageClass's reclaimPolicy cannot
change once created (the API server refuses the update), hence a class of its own.
"""

import pulumi
import pulumi_kubernetes as k8s

from infra.core.context import ClusterContext
from infra.core.iam import csi_driver_addon
from infra.core.tags import CLUSTER_TAG, NAMESPACE_TAG, STACK_TAG
from infra.storage.csi_addons import EBS_ADDON, addon_configuration

EBS_CSI_POLICY = "service-role/AmazonEBSCSIDriverPolicy"
STORAGE_CLASS = "gp3"
HOME_STORAGE_CLASS = "gp3-home"
# The EBS CSI driver's parameters of both classes (aws-ebs-csi-driver docs/parameters.md).
GP3_PARAMETERS = {"type": "gp3", "encrypted": "true", "fsType": "ext4"}


def volume_tags(tags: dict[str, str]) -> dict[str, str]:
    """Tags the driver puts on each volume it creates (`tagSpecification_<n>: key=value`, with
    the claim's namespace templated: aws-ebs-csi-driver docs/tagging.md): the bill splits by
    them, and volumes a destroyed cluster left behind (Released homes) are found by them
    (docs/platform/upgrades.md)."""
    pairs = [
        (CLUSTER_TAG, tags[CLUSTER_TAG]),
        (NAMESPACE_TAG, "{{ .PVCNamespace }}"),
        (STACK_TAG, tags[STACK_TAG]),
    ]
    return {f"tagSpecification_{n}": f"{k}={v}" for n, (k, v) in enumerate(pairs, start=1)}


class BlockStorage(pulumi.ComponentResource):
    # The EBS CSI driver: it detaches and deletes volumes, so nodes with attached volumes and
    # namespaces with claims depend on it.
    addon: pulumi.Resource

    def __init__(
        self,
        name: str,
        cluster: ClusterContext,
        addon_version: str,
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("training-platform:infra:BlockStorage", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.addon = addon = csi_driver_addon(
            f"{name}-csi",
            cluster,
            EBS_ADDON,
            addon_version,
            "ebs-csi-controller-sa",
            child,
            configuration=addon_configuration(EBS_ADDON, addon_version),
            managed_policies=[EBS_CSI_POLICY],
        )
        for class_name, reclaim, annotations in (
            (STORAGE_CLASS, "Delete", {"storageclass.kubernetes.io/is-default-class": "true"}),
            (HOME_STORAGE_CLASS, "Retain", {}),
        ):
            k8s.storage.v1.StorageClass(
                class_name,
                metadata={"name": class_name, "annotations": annotations},
                provisioner="ebs.csi.aws.com",
                parameters={**GP3_PARAMETERS, **volume_tags(cluster.tags)},
                # Create the volume in the AZ the pod lands in, not before.
                volume_binding_mode="WaitForFirstConsumer",
                allow_volume_expansion=True,
                reclaim_policy=reclaim,
                opts=cluster.in_cluster(self, addon),
            )
        self.register_outputs({"storageClass": STORAGE_CLASS, "homes": HOME_STORAGE_CLASS})
