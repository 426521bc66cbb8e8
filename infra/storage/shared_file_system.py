"""SharedFileSystem: encrypted EFS in every private subnet, its CSI driver, and one directory per
namespace that the namespace's claim reaches through an access point of its own.

The file system holds data (infra/core/data_holders.py): protected, and backed up daily by AWS
Backup.
A namespace's directory, access point and volume are static and retained: removing or renaming
the namespace deletes its claim, never the directory, which the same namespace finds again.

Tenants: every pod reaches the mount targets (NFS from the cluster security group, which pods
carry), and with no file system policy EFS grants full access to any client that connects (EFS
user guide, "Using IAM to control access to file systems": the default policy). So the file
system has a policy (file_system_policy) that admits only TLS clients signed by the nodes' role
and mounting through one of the namespaces' access points; every other client, the anonymous
NFS client a pod could run included, is denied. Tenant pods cannot sign as the node: IMDSv2 with
one hop keeps the node's credentials from them.
"""

import json

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from infra.core.config import ConfigError
from infra.core.context import ClusterContext
from infra.core.iam import csi_driver_addon
from infra.storage.csi_addons import EFS_ADDON, addon_configuration
from infra.storage.facts import EFS
from trainer import TRAINER_UID

NFS_PORT = 2049
# What clients may do: read and write (never ClientRootAccess: no root on the file system; the
# access points make every client their POSIX_USER anyway).
CLIENT_ACTIONS = ["elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite"]
# "EFS file system policies have a 20,000 character limit" (PutFileSystemPolicy, EFS API
# reference).
POLICY_LIMIT = 20_000
# The PersistentVolume's mount options: `iam` makes efs-utils sign the mount with the CSI node
# pod's credentials. Not `tls`: the driver adds it to every access point mount itself (and warns
# when it is given; aws-efs-csi-driver v2.1.13 pkg/driver/node.go NodePublishVolume), and
# volumeAttributes cannot carry either (the driver refuses unknown keys there).
MOUNT_OPTIONS = ["iam"]
CLAIM = "efs-shared"
# The claim's size: EFS has none, Kubernetes requires one.
CLAIM_SIZE = "100Gi"
# Every pod that mounts a claim acts on the file system as this user (the access point enforces
# it), the trainer image's and the DevServers' alike, so files written by a team's jobs and by its
# members' servers stay readable to each other (workloads/manifests.py TRAINER_UID).
POSIX_USER = {"uid": TRAINER_UID, "gid": TRAINER_UID}
NAMESPACES_ROOT = "/namespaces"


def file_system_policy(
    file_system_arn: str, mount_roles: list[str], access_points: list[str]
) -> dict:
    """The file system policy. For everyone: TLS only (AWS's "enforce in-transit encryption"
    statement), and no client access but through one of `access_points` (a mount without an
    access point has no elasticfilesystem:AccessPointArn, and a negated condition on a missing
    key holds: IAM User Guide, condition operators), whatever the caller's own IAM policies
    grant. For `mount_roles`: read and write through a mount target. A client that does not
    sign with IAM is anonymous and matches no allow. (For clients EFS evaluates only
    aws:SecureTransport, aws:SourceIp and its own AccessPointArn and AccessedViaMountTarget
    keys: EFS user guide, "Using IAM to control access to file systems".)"""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "DenyWithoutTls",
                "Effect": "Deny",
                "Principal": {"AWS": "*"},
                "Action": "*",
                "Resource": file_system_arn,
                "Condition": {"Bool": {"aws:SecureTransport": "false"}},
            },
            {
                "Sid": "DenyButThroughTheNamespacesAccessPoints",
                "Effect": "Deny",
                "Principal": {"AWS": "*"},
                "Action": [*CLIENT_ACTIONS, "elasticfilesystem:ClientRootAccess"],
                "Resource": file_system_arn,
                "Condition": {
                    "StringNotEquals": {"elasticfilesystem:AccessPointArn": sorted(access_points)}
                },
            },
            {
                "Sid": "NodesMount",
                "Effect": "Allow",
                "Principal": {"AWS": sorted(mount_roles)},
                "Action": CLIENT_ACTIONS,
                "Resource": file_system_arn,
                "Condition": {
                    "Bool": {
                        "aws:SecureTransport": "true",
                        "elasticfilesystem:AccessedViaMountTarget": "true",
                    }
                },
            },
        ],
    }


def policy_text(policy: dict) -> str:
    return json.dumps(policy, separators=(",", ":"), sort_keys=True)


def largest_policy(namespaces: int, mount_roles: int) -> int:
    """The length of the policy text for that many namespaces and roles at the longest ARNs
    AWS makes (partition aws-us-gov, a 14-character region, role names of 64)."""
    prefix = "arn:aws-us-gov:elasticfilesystem:ap-southeast-4:123456789012"
    access_point = f"{prefix}:access-point/fsap-0123456789abcdef0"
    role = "arn:aws-us-gov:iam::123456789012:role/" + "r" * 64
    policy = file_system_policy(
        f"{prefix}:file-system/fs-0123456789abcdef0",
        [role] * mount_roles,
        [access_point] * namespaces,
    )
    return len(policy_text(policy))


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
        # The roles that mount: the nodes' instance role. With `iam` among the mount options,
        # efs-utils signs with the first credentials it finds: an ECS credentials URI, a profile,
        # EKS Pod Identity's variables, IRSA's, else the instance role through IMDS (efs-utils
        # v2.3.3 src/mount_efs/__init__.py get_aws_security_credentials; the node pod runs on the
        # host network, aws-efs-csi-driver chart node-daemonset.yaml). The EKS add-on associates a
        # Pod Identity role with the controller's service account only (aws-efs-csi-driver issue
        # #1759), so the node pod signs as the node.
        mount_roles: list[pulumi.Input[str]],
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
        # The controller calls AWS only to create and delete access points for dynamic
        # provisioning (CreateVolume, DeleteVolume: aws-efs-csi-driver v2.1.13
        # pkg/driver/controller.go), which the platform does not use: its access points are
        # static, made here, and the file system policy names them. So its role grants nothing
        # (kept, with its association, so the add-on does not change).
        addon = csi_driver_addon(
            f"{name}-csi",
            cluster,
            EFS_ADDON,
            addon_version,
            "efs-csi-controller-sa",
            child,
            configuration=addon_configuration(EFS_ADDON, addon_version),
        )
        self.driver = [addon, *targets, nfs]
        self._k8s_opts = cluster.in_cluster(self, *self.driver)
        self._name = name
        self._file_system = file_system
        self._mount_roles = mount_roles
        self._tags = cluster.tags
        self.file_system_id = file_system.id
        self.register_outputs({"fileSystemId": file_system.id, "claim": CLAIM})

    def claim_in(self, namespaces: dict[str, k8s.core.v1.Namespace]) -> None:
        """The shared claim in each namespace, bound to a volume of its own: an access point
        rooted in /namespaces/<namespace>. Separate from the driver, which the namespaces depend
        on (so they go first on destroy) and so must exist before them. Then the file system
        policy naming those access points."""
        largest = largest_policy(len(namespaces), len(self._mount_roles))
        if largest > POLICY_LIMIT:
            raise ConfigError(
                f"Invalid stack config:\n  {len(namespaces)} namespaces (training-platform:"
                "queues.teams and devServers.users) get EFS claims, and the EFS file system "
                f"policy naming their access points could reach {largest} characters; allowed: "
                f"at most {POLICY_LIMIT}, fewer teams and users, or storage.efs.enabled false"
            )
        access_points = []
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
            access_points.append(access_point)
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
                    # Mutable: an existing volume gets them in place, and pods mounting it
                    # afterwards mount with IAM (running ones keep their mount).
                    "mountOptions": MOUNT_OPTIONS,
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
        aws.efs.FileSystemPolicy(
            self._name,
            file_system_id=self._file_system.id,
            policy=pulumi.Output.all(
                self._file_system.arn,
                pulumi.Output.all(*self._mount_roles),
                pulumi.Output.all(*[a.arn for a in access_points]),
            ).apply(lambda v: policy_text(file_system_policy(v[0], list(v[1]), list(v[2])))),
            opts=pulumi.ResourceOptions(parent=self),
        )
