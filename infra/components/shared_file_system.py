"""SharedFileSystem: encrypted EFS in every private subnet, its CSI driver and StorageClass."""

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from infra.components.context import ClusterContext
from infra.components.iam import csi_driver_addon

EFS_CSI_POLICY = "service-role/AmazonEFSCSIDriverPolicy"
NFS_PORT = 2049
STORAGE_CLASS = "efs"
CLAIM = "efs-shared"


class SharedFileSystem(pulumi.ComponentResource):
    file_system_id: pulumi.Output[str]
    # What pods mounting the file system need until they are gone: the CSI driver and the mount
    # targets NFS reaches. Namespaces holding such pods depend on it.
    driver: list[pulumi.Resource]

    def __init__(
        self,
        name: str,
        cluster: ClusterContext,
        addon_version: str,
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("training-platform:infra:SharedFileSystem", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        file_system = aws.efs.FileSystem(
            name,
            encrypted=True,
            performance_mode="generalPurpose",
            throughput_mode="elastic",
            lifecycle_policies=[{"transition_to_ia": "AFTER_30_DAYS"}],
            tags=cluster.tags,
            opts=child,
        )
        # NFS from the nodes' (and pods') security group only.
        group = aws.ec2.SecurityGroup(
            f"{name}-nfs",
            vpc_id=cluster.vpc.vpc_id,
            description="EFS: NFS from cluster nodes",
            tags=cluster.tags,
            opts=child,
        )
        nfs = aws.vpc.SecurityGroupIngressRule(
            f"{name}-nfs",
            security_group_id=group.id,
            referenced_security_group_id=cluster.vpc.cluster_security_group_id,
            ip_protocol="tcp",
            from_port=NFS_PORT,
            to_port=NFS_PORT,
            description="NFS from cluster nodes",
            opts=child,
        )
        targets = [
            aws.efs.MountTarget(
                f"{name}-{i}",
                file_system_id=file_system.id,
                subnet_id=subnet_id,
                security_groups=[group.id],
                opts=child,
            )
            for i, subnet_id in enumerate(cluster.vpc.private_subnets)
        ]
        addon = csi_driver_addon(
            f"{name}-csi",
            cluster,
            "aws-efs-csi-driver",
            addon_version,
            "efs-csi-controller-sa",
            child,
            managed_policies=[EFS_CSI_POLICY],
        )
        self.driver = [addon, *targets, nfs]
        k8s_opts = cluster.in_cluster(self, *self.driver)
        storage_class = k8s.storage.v1.StorageClass(
            STORAGE_CLASS,
            metadata={"name": STORAGE_CLASS},
            provisioner="efs.csi.aws.com",
            # One access point per claim, each rooted in its own directory.
            parameters={
                "provisioningMode": "efs-ap",
                "fileSystemId": file_system.id,
                "directoryPerms": "700",
                "basePath": "/dynamic",
            },
            reclaim_policy="Delete",
            volume_binding_mode="Immediate",
            opts=k8s_opts,
        )
        self._claim_opts = pulumi.ResourceOptions.merge(
            k8s_opts, pulumi.ResourceOptions(depends_on=[storage_class])
        )
        self._name = name
        self.file_system_id = file_system.id
        self.register_outputs({"fileSystemId": file_system.id, "claim": CLAIM})

    def claim_in(self, namespaces: dict[str, pulumi.Resource]) -> None:
        """The shared claim in each namespace. Separate from the driver, which the namespaces
        depend on (so they go first on destroy) and so must exist before them."""
        for team, namespace in namespaces.items():
            k8s.core.v1.PersistentVolumeClaim(
                f"{self._name}-{team}",
                metadata={"name": CLAIM, "namespace": namespace.metadata.name},
                spec={
                    "accessModes": ["ReadWriteMany"],
                    "storageClassName": STORAGE_CLASS,
                    "resources": {"requests": {"storage": "100Gi"}},
                },
                opts=self._claim_opts,
            )
