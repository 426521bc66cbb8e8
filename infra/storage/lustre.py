"""LustreFileSystem: FSx for Lustre PERSISTENT_2 linked to the bucket, its CSI driver and claims.

Jobs read datasets and write checkpoints at Lustre speed. Two data repository associations link
the file system to the bucket, each importing new, changed and deleted S3 objects and exporting
the file system's changes back: /datasets with `storage.fsx.datasetPrefix`, and /checkpoints with
s3://<bucket>/fsx/checkpoints/. So no checkpoint lives only on a file system one edit can replace:
a new file system imports them again. The file system holds data (infra/core/data_holders.py):
protected. It has no backups (FSx backs up no file system linked to S3): what a deletion loses is
what was written and not yet exported.

Teams do not share it. A team's pods mount two subdirectories, never the root: /checkpoints/<its
namespace>, read-write, at /fsx/checkpoints, and /datasets, read-only, at /fsx/datasets (the CSI
driver mounts `<dns>@tcp:/<mountname>`, so a mount name with a path is a Lustre subdirectory
mount, and a read-only volume is mounted `ro`: kubernetes-sigs/aws-fsx-csi-driver
pkg/driver/node.go NodePublishVolume). Pods cannot mount anything else of it: baseline Pod
Security refuses privileged pods and hostPath, and members create no volumes.
"""

import json

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from infra.core.context import ClusterContext
from infra.core.iam import csi_driver_addon
from infra.core.versions import LUSTRE_VERSION
from infra.storage.config import FSX_EXPORT_PREFIX, FsxConfig
from infra.storage.csi_addons import FSX_ADDON, addon_configuration
from infra.storage.facts import FSX
from trainer import TRAINER_UID

# Lustre clients talk to the file system servers on 988 and 1018-1023.
LUSTRE_PORTS = [(988, 988), (1018, 1023)]
SYNC_EVENTS = ["NEW", "CHANGED", "DELETED"]
# The claims in each team namespace (workloads/manifests.py mounts them).
CHECKPOINTS_CLAIM = "fsx-checkpoints"
DATASETS_CLAIM = "fsx-datasets"
# Where on the file system, and where in the bucket they are exported to: outside the bucket's
# checkpoint retention (storage.bucket.checkpointRetentionDays), which would otherwise expire the
# copies of checkpoints the trainer keeps on FSx (its --keep-last prunes both).
CHECKPOINT_PATH = "/checkpoints"
DATASET_PATH = "/datasets"
# A team's directory there is made by importing its directory object from the bucket (a key
# ending in `/`): a Lustre subdirectory mount needs the directory, and no pod can reach the root
# to make it. FSx sets an imported object's owner, group and mode from its POSIX metadata
# (x-amz-meta-file-owner, -file-group, -file-permissions: the st_mode in octal, S_IFDIR 0040000):
# the trainer's user owns it, as every pod of the team runs as that user.
TEAM_DIRECTORY_METADATA = {
    "file-owner": str(TRAINER_UID),
    "file-group": str(TRAINER_UID),
    "file-permissions": "0040750",
}


def csi_policy() -> str:
    # Static volumes only: the driver describes file systems, it never creates or deletes them.
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {"Effect": "Allow", "Action": ["fsx:DescribeFileSystems"], "Resource": "*"}
            ],
        }
    )


class LustreFileSystem(pulumi.ComponentResource):
    # What pods mounting the file system need until they are gone: the CSI driver and the file
    # system's servers. Namespaces holding such pods depend on it.
    driver: list[pulumi.Resource]

    def __init__(
        self,
        name: str,
        config: FsxConfig,
        cluster: ClusterContext,
        addon_version: str,
        bucket_name: pulumi.Input[str],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("training-platform:infra:LustreFileSystem", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        group = aws.ec2.SecurityGroup(
            f"{name}-lustre",
            vpc_id=cluster.vpc.vpc_id,
            description="FSx for Lustre: clients and file system servers",
            tags=cluster.tags,
            opts=child,
        )
        # From the cluster's nodes and between the file system's own servers, nothing else.
        rules: list[pulumi.Resource] = []
        for source, peer in (("nodes", cluster.vpc.cluster_security_group_id), ("self", group.id)):
            for low, high in LUSTRE_PORTS:
                ingress = aws.vpc.SecurityGroupIngressRule(
                    f"{name}-{source}-{low}",
                    security_group_id=group.id,
                    referenced_security_group_id=peer,
                    ip_protocol="tcp",
                    from_port=low,
                    to_port=high,
                    description=f"Lustre from {source}",
                    opts=child,
                )
                egress = aws.vpc.SecurityGroupEgressRule(
                    f"{name}-to-{source}-{low}",
                    security_group_id=group.id,
                    referenced_security_group_id=peer,
                    ip_protocol="tcp",
                    from_port=low,
                    to_port=high,
                    description=f"Lustre to {source}",
                    opts=child,
                )
                rules += [ingress, egress]
        file_system = aws.fsx.LustreFileSystem(
            name,
            deployment_type="PERSISTENT_2",
            storage_type="SSD",
            storage_capacity=config.storage_capacity_gib,
            per_unit_storage_throughput=config.throughput_per_tib,
            # One subnet: a Lustre file system lives in one AZ.
            subnet_ids=cluster.vpc.private_subnets[0],
            security_group_ids=[group.id],
            file_system_type_version=LUSTRE_VERSION,
            data_compression_type="LZ4",
            # No backups: FSx takes none of a file system linked to S3, automatic, user-initiated
            # or final ("Backups cannot be enabled on S3-linked file systems": FSx API reference,
            # DeleteFileSystem; Lustre user guide, Protecting your data with backups). The
            # export to the bucket is what keeps its files (docs/platform/day-two.md).
            automatic_backup_retention_days=0,
            skip_final_backup=True,
            tags=cluster.data.tags(FSX, cluster.tags),
            # FSx refuses to create a file system whose security group does not yet open 988.
            opts=pulumi.ResourceOptions(
                parent=self, depends_on=rules, protect=cluster.data.protect(FSX).protect
            ),
        )
        for suffix, path, prefix in (
            ("", DATASET_PATH, config.dataset_prefix),
            ("-checkpoints", CHECKPOINT_PATH, FSX_EXPORT_PREFIX),
        ):
            # Two associations may not share a file system path: a new one (its bucket path
            # changed) can only be made once the old one is gone.
            aws.fsx.DataRepositoryAssociation(
                f"{name}{suffix}",
                file_system_id=file_system.id,
                file_system_path=path,
                data_repository_path=pulumi.Output.concat("s3://", bucket_name, "/", prefix),
                batch_import_meta_data_on_create=True,
                s3={
                    "auto_import_policy": {"events": SYNC_EVENTS},
                    "auto_export_policy": {"events": SYNC_EVENTS},
                },
                tags=cluster.tags,
                opts=pulumi.ResourceOptions(parent=self, delete_before_replace=True),
            )
        addon = csi_driver_addon(
            f"{name}-csi",
            cluster,
            FSX_ADDON,
            addon_version,
            "fsx-csi-controller-sa",
            child,
            configuration=addon_configuration(FSX_ADDON, addon_version),
            inline_policy=csi_policy(),
        )
        self.driver = [addon, file_system]
        self._k8s_opts = cluster.in_cluster(self, addon)
        self._name = name
        self._file_system = file_system
        self._bucket_name = bucket_name
        self._capacity = f"{config.storage_capacity_gib}Gi"
        self.register_outputs(
            {"fileSystemId": file_system.id, "claims": [CHECKPOINTS_CLAIM, DATASETS_CLAIM]}
        )

    def claim_in(self, namespaces: dict[str, pulumi.Resource]) -> None:
        """Each team's claims, each bound to a volume of its own (a PersistentVolume binds one
        claim): its checkpoints directory and the datasets. Separate from the driver, which the
        namespaces depend on and so must exist before them."""
        for team, namespace in namespaces.items():
            namespace_name = namespace.metadata.name
            marker = aws.s3.BucketObjectv2(
                f"{self._name}-{team}",
                bucket=self._bucket_name,
                key=pulumi.Output.concat(FSX_EXPORT_PREFIX, "/", namespace_name, "/"),
                content="",
                metadata=TEAM_DIRECTORY_METADATA,
                opts=pulumi.ResourceOptions(parent=self),
            )
            # Every volume has a handle of its own: the kubelet takes two volumes of one pod with
            # the same driver and handle for one, and mounts only one of them (kubernetes-sigs/
            # aws-fsx-csi-driver#328); the driver reads no more of a handle than a lock key.
            for claim, directory, read_only, after in (
                (
                    CHECKPOINTS_CLAIM,
                    pulumi.Output.concat(CHECKPOINT_PATH, "/", namespace_name),
                    False,
                    [marker],
                ),
                (DATASETS_CLAIM, DATASET_PATH, True, []),
            ):
                mode = "ReadOnlyMany" if read_only else "ReadWriteMany"
                volume = k8s.core.v1.PersistentVolume(
                    f"{self._name}-{claim.removeprefix('fsx-')}-{team}",
                    metadata={"name": pulumi.Output.concat(claim, "-", namespace_name)},
                    spec={
                        "capacity": {"storage": self._capacity},
                        "accessModes": [mode],
                        "persistentVolumeReclaimPolicy": "Retain",
                        "storageClassName": "",
                        "mountOptions": ["flock"],
                        "csi": {
                            "driver": "fsx.csi.aws.com",
                            "volumeHandle": pulumi.Output.concat(
                                self._file_system.id, "::", namespace_name, "/", claim
                            ),
                            "readOnly": read_only,
                            "volumeAttributes": {
                                "dnsname": self._file_system.dns_name,
                                "mountname": pulumi.Output.concat(
                                    self._file_system.mount_name, directory
                                ),
                            },
                        },
                        # Only this namespace's claim may bind it.
                        "claimRef": {"namespace": namespace_name, "name": claim},
                    },
                    opts=pulumi.ResourceOptions.merge(
                        self._k8s_opts, pulumi.ResourceOptions(depends_on=after)
                    ),
                )
                k8s.core.v1.PersistentVolumeClaim(
                    f"{self._name}-{claim.removeprefix('fsx-')}-{team}",
                    metadata={"name": claim, "namespace": namespace_name},
                    spec={
                        "accessModes": [mode],
                        "storageClassName": "",
                        "volumeName": volume.metadata.name,
                        "resources": {"requests": {"storage": self._capacity}},
                    },
                    # The API server resizes only dynamically provisioned claims (kubernetes
                    # pkg/apis/core/validation ValidatePersistentVolumeClaimUpdate): a larger
                    # file system would fail `pulumi up` at these claims. A Lustre mount is not
                    # bounded by its claim's request, so a claim keeps the size it was made with;
                    # its volume follows the file system.
                    opts=pulumi.ResourceOptions.merge(
                        self._k8s_opts, pulumi.ResourceOptions(ignore_changes=["spec.resources"])
                    ),
                )
