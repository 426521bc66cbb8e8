"""BlockStorage: the EBS CSI driver and the default gp3 StorageClass."""

import pulumi
import pulumi_kubernetes as k8s

from infra.components.context import ClusterContext
from infra.components.iam import csi_driver_addon

EBS_CSI_POLICY = "service-role/AmazonEBSCSIDriverPolicy"
STORAGE_CLASS = "gp3"


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
            "aws-ebs-csi-driver",
            addon_version,
            "ebs-csi-controller-sa",
            child,
            managed_policies=[EBS_CSI_POLICY],
        )
        k8s.storage.v1.StorageClass(
            STORAGE_CLASS,
            metadata={
                "name": STORAGE_CLASS,
                "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
            },
            provisioner="ebs.csi.aws.com",
            parameters={"type": "gp3", "encrypted": "true", "fsType": "ext4"},
            # Create the volume in the AZ the pod lands in, not before.
            volume_binding_mode="WaitForFirstConsumer",
            allow_volume_expansion=True,
            reclaim_policy="Delete",
            opts=cluster.in_cluster(self, addon),
        )
        self.register_outputs({"storageClass": STORAGE_CLASS})
