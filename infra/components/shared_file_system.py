"""SharedFileSystem: encrypted EFS in every private subnet, its CSI driver, and one directory per
namespace that the namespace's claim reaches through an access point of its own.

The file system holds data (infra/data_holders.py): protected, and backed up daily by AWS Backup.
A namespace's directory, access point and volume are static and retained: removing or renaming
the namespace deletes its claim, never the directory, which the same namespace finds again.
"""

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from infra.components.context import ClusterContext
from infra.components.iam import csi_driver_addon
from infra.data_holders import EFS

EFS_CSI_POLICY = "service-role/AmazonEFSCSIDriverPolicy"
NFS_PORT = 2049
CLAIM = "efs-shared"
# The claim's size: EFS has none, Kubernetes requires one.
CLAIM_SIZE = "100Gi"
# Every pod that mounts a claim acts on the file system as this user (the access point enforces
# it), the trainer image's and the DevServers' alike, so files written by a team's jobs and by its
# members' servers stay readable to each other (workloads/manifests.py TRAINER_UID).
POSIX_USER = {"uid": 10001, "gid": 10001}
NAMESPACES_ROOT = "/namespaces"


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
            tags=cluster.data.tags(EFS, cluster.tags),
            opts=pulumi.ResourceOptions.merge(child, cluster.data.protect(EFS)),
        )
        # AWS Backup's daily plan for EFS (35 days); recovery points outlive the file system.
        aws.efs.BackupPolicy(
            name,
            file_system_id=file_system.id,
            backup_policy={"status": "ENABLED"},
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
        self._k8s_opts = cluster.in_cluster(self, *self.driver)
        self._name = name
        self._file_system = file_system
        self._tags = cluster.tags
        self.file_system_id = file_system.id
        self.register_outputs({"fileSystemId": file_system.id, "claim": CLAIM})

    def claim_in(self, namespaces: dict[str, k8s.core.v1.Namespace]) -> None:
        """The shared claim in each namespace, bound to a volume of its own: an access point
        rooted in /namespaces/<namespace>. Separate from the driver, which the namespaces depend
        on (so they go first on destroy) and so must exist before them."""
        for key, namespace in namespaces.items():
            namespace_name = namespace.metadata.name
            access_point = aws.efs.AccessPoint(
                f"{self._name}-{key}",
                file_system_id=self._file_system.id,
                posix_user=POSIX_USER,
                root_directory={
                    "path": namespace_name.apply(lambda ns: f"{NAMESPACES_ROOT}/{ns}"),
                    "creation_info": {
                        "owner_uid": POSIX_USER["uid"],
                        "owner_gid": POSIX_USER["gid"],
                        "permissions": "750",
                    },
                },
                tags=self._tags,
                opts=pulumi.ResourceOptions(parent=self),
            )
            volume = k8s.core.v1.PersistentVolume(
                f"{self._name}-{key}",
                metadata={"name": namespace_name.apply(lambda ns: f"efs-{ns}")},
                spec={
                    "capacity": {"storage": CLAIM_SIZE},
                    "accessModes": ["ReadWriteMany"],
                    # Deleting the claim (its namespace gone) leaves the volume Released and the
                    # directory untouched; the EFS CSI driver never deletes a static volume.
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": "",
                    "csi": {
                        "driver": "efs.csi.aws.com",
                        "volumeHandle": pulumi.Output.concat(
                            self._file_system.id, "::", access_point.id
                        ),
                    },
                    # Only this namespace's claim may bind it.
                    "claimRef": {"namespace": namespace_name, "name": CLAIM},
                },
                opts=self._k8s_opts,
            )
            k8s.core.v1.PersistentVolumeClaim(
                f"{self._name}-{key}",
                metadata={"name": CLAIM, "namespace": namespace_name},
                spec={
                    "accessModes": ["ReadWriteMany"],
                    "storageClassName": "",
                    "volumeName": volume.metadata.name,
                    "resources": {"requests": {"storage": CLAIM_SIZE}},
                },
                opts=self._k8s_opts,
            )
