"""LustreFileSystem: FSx for Lustre PERSISTENT_2 linked to the bucket, its CSI driver and claims.

Jobs read datasets and write checkpoints at Lustre speed. Two data repository associations link
it to the bucket, each importing new, changed and deleted S3 objects and exporting the file
system's changes back: the datasets (`storage.fsx.datasetPrefix`) and the checkpoints (/checkpoints
with s3://<bucket>/checkpoints/_fsx/), so that no checkpoint lives only on a file system one edit
can replace: a new file system imports them again. The file system holds data
(infra/data_holders.py): protected, backed up daily, and backed up once more when deleted.
"""

import json

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from infra.components.context import ClusterContext
from infra.components.iam import csi_driver_addon
from infra.config import CHECKPOINT_PREFIX, FsxConfig
from infra.data_holders import FSX
from infra.versions import LUSTRE_VERSION

# Lustre clients talk to the file system servers on 988 and 1018-1023.
LUSTRE_PORTS = [(988, 988), (1018, 1023)]
SYNC_EVENTS = ["NEW", "CHANGED", "DELETED"]
CLAIM = "fsx-training-data"
# Where jobs' checkpoints go on the file system (workloads/manifests.py mounts it at /fsx), and
# where in the bucket they are exported to: under the bucket's checkpoint retention, beside the S3
# jobs' checkpoints/<namespace>/<job>; no namespace name has a `_`, so none collides.
CHECKPOINT_PATH = "/checkpoints"
CHECKPOINT_EXPORT_PREFIX = f"{CHECKPOINT_PREFIX}_fsx"


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
            # Daily backups, kept `backupRetentionDays`; and one on deletion (the provider's
            # default skips it: terraform-provider-aws aws_fsx_lustre_file_system,
            # skip_final_backup Default true). copy_tags_to_backups is left at its default: a
            # change to it replaces the file system.
            automatic_backup_retention_days=config.backup_retention_days,
            skip_final_backup=False,
            final_backup_tags={**cluster.tags, "training-platform:final-backup": "true"},
            tags=cluster.data.tags(FSX, cluster.tags),
            # FSx refuses to create a file system whose security group does not yet open 988.
            opts=pulumi.ResourceOptions(
                parent=self, depends_on=rules, protect=cluster.data.protect(FSX).protect
            ),
        )
        for suffix, path, prefix in (
            ("", f"/{config.dataset_prefix}", config.dataset_prefix),
            ("-checkpoints", CHECKPOINT_PATH, CHECKPOINT_EXPORT_PREFIX),
        ):
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
                opts=child,
            )
        addon = csi_driver_addon(
            f"{name}-csi",
            cluster,
            "aws-fsx-csi-driver",
            addon_version,
            "fsx-csi-controller-sa",
            child,
            inline_policy=csi_policy(),
        )
        self.driver = [addon, file_system]
        self._k8s_opts = cluster.in_cluster(self, addon)
        self._name = name
        self._file_system = file_system
        self._capacity = f"{config.storage_capacity_gib}Gi"
        self.register_outputs({"fileSystemId": file_system.id, "claim": CLAIM})

    def claim_in(self, namespaces: dict[str, pulumi.Resource]) -> None:
        """A volume and claim per namespace (a PersistentVolume binds one claim). Separate from
        the driver, which the namespaces depend on and so must exist before them."""
        for team, namespace in namespaces.items():
            volume = k8s.core.v1.PersistentVolume(
                f"{self._name}-{team}",
                metadata={"name": f"fsx-{team}"},
                spec={
                    "capacity": {"storage": self._capacity},
                    "accessModes": ["ReadWriteMany"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": "",
                    "mountOptions": ["flock"],
                    "csi": {
                        "driver": "fsx.csi.aws.com",
                        "volumeHandle": self._file_system.id,
                        "volumeAttributes": {
                            "dnsname": self._file_system.dns_name,
                            "mountname": self._file_system.mount_name,
                        },
                    },
                },
                opts=self._k8s_opts,
            )
            k8s.core.v1.PersistentVolumeClaim(
                f"{self._name}-{team}",
                metadata={"name": CLAIM, "namespace": namespace.metadata.name},
                spec={
                    "accessModes": ["ReadWriteMany"],
                    "storageClassName": "",
                    "volumeName": volume.metadata.name,
                    "resources": {"requests": {"storage": self._capacity}},
                },
                opts=self._k8s_opts,
            )
