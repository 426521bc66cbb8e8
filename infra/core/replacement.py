"""Which input changes make the providers replace a resource, written down from their source.

The offline plan has no provider to ask, so it applies these rules to the inputs two plans
record (infra/core/steps.py). A real `pulumi preview` asks the providers themselves; the
pull-request gate reads its steps instead (deploy/preview_gate.py).

Sources (read 2026-11; the pinned releases are pulumi 3.272.0, pulumi-aws 7.51.1, pulumi-eks
4.4.0, pulumi-kubernetes 4.34.2):
- pulumi-aws bridges terraform-provider-aws v6 (pulumi/pulumi-aws PR #5665 moved to v6; the
  exact tag behind 7.51.1 is at or after v6.66.0, whose new resources, such as aws_msk_channel,
  its SDK has). A `ForceNew: true` argument, or a
  CustomizeDiff that calls `d.ForceNew`, is a replacement. Files: internal/service/<svc>/<res>.go
  of hashicorp/terraform-provider-aws; where the newest revision that could be read predates v6
  (FSx for Lustre, EKS node group, S3 bucket, EC2 instance), arguments added since are not here.
- pulumi-kubernetes: provider/pkg/provider/diff.go forceNewProperties (identical at v4.32.0 and
  at master 94977969, 2026-07): `.metadata.name`, `.metadata.namespace`, and a table per kind.
  Custom resources have no entry: only a name, namespace or provider change replaces them.
- pulumi-eks: nodejs/eks/cluster/cluster.ts (master 7bf0c1b1) maps the component's inputs onto an
  aws:eks/cluster:Cluster; offline, the component stands for it.
Input paths are the camelCase names the plan records; a rule path covers everything below it.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

TF = "hashicorp/terraform-provider-aws internal/service"
K8S = "pulumi/pulumi-kubernetes provider/pkg/provider/diff.go"


def _lustre_decreases(old: dict, new: dict) -> list[str]:
    """FSx for Lustre: a smaller storage capacity is a new file system
    (resourceLustreFileSystemStorageCapacityCustomizeDiff), so are fewer metadata IOPS
    (resourceLustreFileSystemMetadataConfigCustomizeDiff) and an older Lustre version (a newer
    one upgrades in place: pulumi-aws 7.51.1's docs of file_system_type_version)."""
    found = []
    for path in ("storageCapacity", "metadataConfiguration.iops"):
        before, after = _at(old, path), _at(new, path)
        if isinstance(before, int) and isinstance(after, int) and after < before:
            found.append(path)
    before, after = old.get("fileSystemTypeVersion"), new.get("fileSystemTypeVersion")
    if before and after and _version(str(after)) < _version(str(before)):
        found.append("fileSystemTypeVersion")
    return found


def _at(inputs: dict, path: str) -> Any:
    for key in path.split("."):
        inputs = inputs.get(key) if isinstance(inputs, dict) else None
    return inputs


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".") if part.isdigit())


def _encryption_removed(old: dict, new: dict) -> list[str]:
    """EKS: envelope encryption cannot be turned off (customdiff.ForceNewIf("encryption_config"),
    "You cannot disable envelope encryption after enabling it")."""
    for key in ("encryptionConfigKeyArn", "encryptionConfig"):
        if old.get(key) and not new.get(key):
            return [key]
    return []


@dataclass(frozen=True)
class ReplaceRule:
    force_new: tuple[str, ...]
    source: str
    custom: Callable[[dict, dict], list[str]] | None = None


EKS_CLUSTER_RULE = ReplaceRule(
    (
        "name",
        "roleArn",
        "serviceRole",
        "bootstrapSelfManagedAddons",
        "kubernetesServiceIpAddressRange",
        "kubernetesNetworkConfig.serviceIpv4Cidr",
        "kubernetesNetworkConfig.ipFamily",
        "ipFamily",
        "accessConfig.bootstrapClusterCreatorAdminPermissions",
    ),
    f"{TF}/eks/cluster.go; pulumi/pulumi-eks nodejs/eks/cluster/cluster.ts",
    _encryption_removed,
)

AWS_RULES: dict[str, ReplaceRule] = {
    "aws:fsx/lustreFileSystem:LustreFileSystem": ReplaceRule(
        (
            "backupId",
            "copyTagsToBackups",
            "deploymentType",
            "driveCacheType",
            "exportPath",
            "importPath",
            "importedFileChunkSize",
            "kmsKeyId",
            "securityGroupIds",
            "storageType",
            "subnetIds",
        ),
        f"{TF}/fsx/lustre_file_system.go",
        _lustre_decreases,
    ),
    "aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation": ReplaceRule(
        ("dataRepositoryPath", "fileSystemId", "fileSystemPath"),
        f"{TF}/fsx/data_repository_association.go",
    ),
    "aws:efs/fileSystem:FileSystem": ReplaceRule(
        ("availabilityZoneName", "creationToken", "encrypted", "kmsKeyId", "performanceMode"),
        f"{TF}/efs/file_system.go",
    ),
    "aws:efs/mountTarget:MountTarget": ReplaceRule(
        ("fileSystemId", "subnetId", "ipAddress", "ipAddressType", "ipv6Address"),
        f"{TF}/efs/mount_target.go",
    ),
    "aws:efs/accessPoint:AccessPoint": ReplaceRule(
        ("fileSystemId", "posixUser", "rootDirectory"), f"{TF}/efs/access_point.go"
    ),
    "aws:efs/fileSystemPolicy:FileSystemPolicy": ReplaceRule(
        ("fileSystemId",), f"{TF}/efs/file_system_policy.go"
    ),
    "aws:efs/backupPolicy:BackupPolicy": ReplaceRule(
        ("fileSystemId",), f"{TF}/efs/backup_policy.go"
    ),
    "aws:s3/bucket:Bucket": ReplaceRule(
        (
            "bucket",
            "bucketPrefix",
            "objectLockEnabled",
            "objectLockConfiguration.objectLockEnabled",
        ),
        f"{TF}/s3/bucket.go",
    ),
    "aws:kms/key:Key": ReplaceRule(
        ("customKeyStoreId", "customerMasterKeySpec", "keyUsage", "multiRegion", "xksKeyId"),
        f"{TF}/kms/key.go",
    ),
    "aws:kms/alias:Alias": ReplaceRule(("name", "namePrefix"), f"{TF}/kms/alias.go"),
    "aws:ecr/repository:Repository": ReplaceRule(
        ("name", "encryptionConfigurations"), f"{TF}/ecr/repository.go"
    ),
    "aws:eks/cluster:Cluster": EKS_CLUSTER_RULE,
    "eks:index:Cluster": EKS_CLUSTER_RULE,
    "aws:eks/nodeGroup:NodeGroup": ReplaceRule(
        (
            "amiType",
            "capacityType",
            "clusterName",
            "diskSize",
            "instanceTypes",
            "launchTemplate.id",
            "launchTemplate.name",
            "nodeGroupName",
            "nodeGroupNamePrefix",
            "nodeRoleArn",
            "remoteAccess",
            "subnetIds",
        ),
        f"{TF}/eks/node_group.go",
    ),
    "aws:eks/addon:Addon": ReplaceRule(
        ("addonName", "clusterName", "namespaceConfig"), f"{TF}/eks/addon.go"
    ),
    "aws:eks/podIdentityAssociation:PodIdentityAssociation": ReplaceRule(
        ("clusterName", "namespace", "serviceAccount"), f"{TF}/eks/pod_identity_association.go"
    ),
    "aws:iam/role:Role": ReplaceRule(("name", "namePrefix", "path"), f"{TF}/iam/role.go"),
    # A member's access is gone between the delete and the create.
    "aws:eks/accessEntry:AccessEntry": ReplaceRule(
        ("clusterName", "principalArn", "type"), f"{TF}/eks/access_entry.go"
    ),
    "aws:cloudwatch/logGroup:LogGroup": ReplaceRule(
        ("name", "namePrefix", "logGroupClass"), f"{TF}/logs/group.go"
    ),
    "aws:sqs/queue:Queue": ReplaceRule(("name", "namePrefix", "fifoQueue"), f"{TF}/sqs/queue.go"),
    "aws:s3/bucketObjectv2:BucketObjectv2": ReplaceRule(("bucket", "key"), f"{TF}/s3/object.go"),
    "aws:ec2/instance:Instance": ReplaceRule(
        (
            "ami",
            "associatePublicIpAddress",
            "availabilityZone",
            "cpuOptions",
            "ebsOptimized",
            "enclaveOptions",
            "ephemeralBlockDevices",
            "hibernation",
            "hostId",
            "instanceMarketOptions",
            "ipv6Addresses",
            "keyName",
            "launchTemplate",
            "networkInterfaces",
            "placementGroup",
            "placementPartitionNumber",
            "privateDnsNameOptions",
            "privateIp",
            "securityGroups",
            "subnetId",
            "tenancy",
            "ebsBlockDevices",
            "rootBlockDevice.encrypted",
            "rootBlockDevice.kmsKeyId",
        ),
        f"{TF}/ec2/ec2_instance.go",
    ),
    "aws:ebs/volume:Volume": ReplaceRule(
        (
            "availabilityZone",
            "encrypted",
            "kmsKeyId",
            "multiAttachEnabled",
            "outpostArn",
            "snapshotId",
        ),
        f"{TF}/ec2/ebs_volume.go",
    ),
    "aws:ec2/securityGroup:SecurityGroup": ReplaceRule(
        ("description", "name", "namePrefix", "vpcId"), f"{TF}/ec2/vpc_security_group.go"
    ),
    "aws:ec2/launchTemplate:LaunchTemplate": ReplaceRule(
        ("name", "namePrefix"), f"{TF}/ec2/ec2_launch_template.go (other changes: a new version)"
    ),
    "aws:ec2/vpc:Vpc": ReplaceRule(
        ("cidrBlock", "ipv4IpamPoolId", "ipv4NetmaskLength"), f"{TF}/ec2/vpc_.go"
    ),
    "aws:ec2/subnet:Subnet": ReplaceRule(
        (
            "availabilityZone",
            "availabilityZoneId",
            "cidrBlock",
            "ipv6Native",
            "outpostArn",
            "vpcId",
        ),
        f"{TF}/ec2/vpc_subnet.go",
    ),
}

# pulumi-kubernetes: besides .metadata.name and .metadata.namespace of every object.
K8S_METADATA = ("metadata.name", "metadata.namespace")
_SELECTOR = "spec.selector"
K8S_RULES: dict[str, tuple[str, ...]] = {
    "kubernetes:core/v1:PersistentVolumeClaim": (
        "spec.accessModes",
        "spec.storageClassName",
        "spec.volumeName",
        _SELECTOR,
    ),
    "kubernetes:core/v1:PersistentVolume": tuple(
        f"spec.{source}"
        for source in (
            "awsElasticBlockStore",
            "azureDisk",
            "azureFile",
            "cephfs",
            "cinder",
            "csi",
            "fc",
            "flexVolume",
            "flocker",
            "gcePersistentDisk",
            "glusterfs",
            "hostPath",
            "iscsi",
            "local",
            "nfs",
            "photonPersistentDisk",
            "portworxVolume",
            "quobyte",
            "rbd",
            "scaleIO",
            "storageos",
            "vsphereVolume",
        )
    ),
    "kubernetes:storage.k8s.io/v1:StorageClass": ("parameters", "provisioner"),
    # The provider's defaults (enableSecretMutable, enableConfigMapMutable: false).
    "kubernetes:core/v1:Secret": ("type", "stringData", "data"),
    "kubernetes:core/v1:ConfigMap": ("binaryData", "data"),
    "kubernetes:core/v1:Service": ("spec.clusterIP",),
    "kubernetes:core/v1:ResourceQuota": ("spec.scopes",),
    "kubernetes:apps/v1:Deployment": (_SELECTOR,),
    "kubernetes:apps/v1:DaemonSet": (_SELECTOR,),
    "kubernetes:apps/v1:StatefulSet": (
        "spec.podManagementPolicy",
        "spec.revisionHistoryLimit",
        "spec.serviceName",
        "spec.volumeClaimTemplates",
        _SELECTOR,
    ),
    "kubernetes:batch/v1:Job": ("spec.completions", "spec.parallelism", "spec.template", _SELECTOR),
    "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding": ("roleRef",),
    "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding": ("roleRef",),
    # Not the provider's: the program's replace_on_changes (workloads/training_job.py), because the
    # Trainer v2.3 TrainJob CRD makes spec.trainer and spec.runtimeRef immutable.
    "kubernetes:trainer.kubeflow.org/v1alpha1:TrainJob": ("spec",),
}


def rule_for(resource_type: str) -> ReplaceRule | None:
    """The replacement rule of a resource type; None where no input forces one (or the type is
    not one the rules cover: components, Helm releases)."""
    if resource_type in AWS_RULES:
        return AWS_RULES[resource_type]
    if resource_type.startswith("kubernetes:") and not resource_type.startswith(
        ("kubernetes:helm.sh/", "kubernetes:kustomize/", "kubernetes:yaml/")
    ):
        return ReplaceRule((*K8S_METADATA, *K8S_RULES.get(resource_type, ())), K8S)
    return None


def replacing_paths(resource_type: str, old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The changed input paths that force a replacement of a resource of this type."""
    rule = rule_for(resource_type)
    if rule is None:
        return []
    changed = changed_paths(old, new)
    hits = [p for p in changed if any(covers(rule_path, p) for rule_path in rule.force_new)]
    if rule.custom:
        hits += [p for p in rule.custom(old, new) if p not in hits]
    return hits


def covers(rule_path: str, path: str) -> bool:
    """A change at `path` falls under `rule_path` (or contains it, a whole block replaced)."""
    plain = _without_indices(path)
    return (
        plain == rule_path or plain.startswith(f"{rule_path}.") or rule_path.startswith(f"{plain}.")
    )


def _without_indices(path: str) -> str:
    return ".".join(part.split("[", 1)[0] for part in path.split("."))


def changed_paths(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Dotted paths (list items as `[i]`) where `old` and `new` differ, down to the leaves."""
    if isinstance(old, dict) and isinstance(new, dict):
        paths = []
        for key in [*old, *(k for k in new if k not in old)]:
            path = f"{prefix}.{key}" if prefix else key
            if key not in old or key not in new:
                if old.get(key) != new.get(key):
                    paths.append(path)
            else:
                paths += changed_paths(old[key], new[key], path)
        return paths
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        pairs = enumerate(zip(old, new, strict=True))
        return [p for i, (a, b) in pairs for p in changed_paths(a, b, f"{prefix}[{i}]")]
    return [] if old == new else [prefix]
