"""What the platform knows about its stores' kinds: FSx for Lustre bills by capacity and
throughput, EBS claims and quotas by size, EFS and S3 per use; which inputs replace them (a
smaller FSx file system, for one); the pods of the CSI drivers' EKS add-ons."""

from collections.abc import Sequence
from typing import Any

from infra.core.bill import CostLine, Gp3, Part, PriceBook, require_gp3, required, sized
from infra.core.catalog import HOURS_PER_MONTH, UnpricedError
from infra.core.declared import Declared, dig
from infra.core.facts import K8S, K8S_OBJECT, TF, Kind, ReplaceRule
from infra.core.pods import CRITICAL_ADDONS, EVERY_TAINT, AddonPods, Requests
from infra.vpc.facts import classic_load_balancer

# The stores as data holders (infra/core/data_holders.py), and what losing each loses.
BUCKET = "storage.bucket"
EFS = "storage.efs"
FSX = "storage.fsx"
HOLDERS = {
    BUCKET: "every dataset, checkpoint and model in the training bucket (and with its KMS key, "
    "the ability to read them)",
    EFS: "every user's /shared and every team's EFS checkpoints (AWS Backup recovery points stay)",
    FSX: "every file on FSx for Lustre not yet exported to the bucket (FSx backs up no file "
    "system linked to S3); what the data repository associations exported stays, in "
    "s3://<bucket>/fsx/checkpoints/ and the dataset prefix, and a new file system imports it "
    "again: export what is pending first (docs: day two, FSx)",
}

LUSTRE = "aws:fsx/lustreFileSystem:LustreFileSystem"
CLAIM = "kubernetes:core/v1:PersistentVolumeClaim"
STORAGE_CLASS = "kubernetes:storage.k8s.io/v1:StorageClass"
RESOURCE_QUOTA = "kubernetes:core/v1:ResourceQuota"
LIFECYCLE = "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration"
EBS_CSI = "ebs.csi.aws.com"
# A ResourceQuota's cap on the claims of one StorageClass: `<class>` + this (kubernetes
# pkg/quota/v1/evaluator/core/persistent_volume_claims.go, V1ResourceByStorageClass). The
# DevServers component writes such a quota with devservers/api.py's own copy of this Kubernetes
# key: that module ships in the operator image, which carries no infra.
STORAGE_QUOTA_SUFFIX = ".storageclass.storage.k8s.io/requests.storage"
# On a DevServer user's ResourceQuota: how many SSH load balancers the user's servers may create
# (one per server, its pod 0's Service of type LoadBalancer), written by devservers/component.py
# when the platform allows LoadBalancer SSH (devServers.sshLoadBalancerCidrs).
SSH_LOAD_BALANCERS_ANNOTATION = "training-platform/ssh-load-balancers"
EBS_CHART = "kubernetes-sigs/aws-ebs-csi-driver v1.51.1 charts/aws-ebs-csi-driver/values.yaml"
FSX_CHART = "kubernetes-sigs/aws-fsx-csi-driver v1.7.0 charts/aws-fsx-csi-driver/values.yaml"
_SELECTOR = "spec.selector"


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


def _lustre(r: Declared, stack: Sequence[Declared], book: PriceBook) -> list[CostLine]:
    kind = dig(r.props, "deploymentType")
    if kind != "PERSISTENT_2":
        raise UnpricedError(
            f"FSx for Lustre {kind} has no price in {book.prices.file} (servicePrices price "
            "PERSISTENT_2 SSD)"
        )
    gib = int(required(r.props, "storageCapacity"))
    throughput = int(required(r.props, "perUnitStorageThroughput"))
    rate = book.usd(book.prices.fsx_key(throughput))
    return [
        CostLine(
            f"FSx for Lustre {r.name}",
            f"{gib} GiB at {throughput} MB/s/TiB",
            gib * rate / HOURS_PER_MONTH,
        )
    ]


def _storage_class(name: str, stack: Sequence[Declared], book: PriceBook) -> None:
    """The stack's StorageClass `name` must be an EBS gp3 class: the one kind priced."""
    found = [
        d for d in stack if d.type == STORAGE_CLASS and dig(d.props, "metadata", "name") == name
    ]
    if not found or dig(found[0].props, "provisioner") != EBS_CSI:
        raise UnpricedError(f"storage class {name} is not an EBS class of this stack")
    require_gp3(dig(found[0].props, "parameters", "type"), book)


def _resource_quota(r: Declared, stack: Sequence[Declared], book: PriceBook) -> list[CostLine]:
    """What a namespace's quota lets exist: gp3 claims up to `<class>` + STORAGE_QUOTA_SUFFIX, and
    DevServer SSH load balancers (SSH_LOAD_BALANCERS_ANNOTATION). Without an annotation the
    in-tree service controller makes a Service of type LoadBalancer a Classic Load Balancer
    across the public subnets, each AZ with its own public IPv4 address."""
    hard = dig(r.props, "spec", "hard") or {}
    meta = dig(r.props, "metadata")
    where = f"{dig(meta, 'namespace')}/{dig(meta, 'name')}"
    lines = []
    storage = {
        key.removesuffix(STORAGE_QUOTA_SUFFIX): amount
        for key, amount in hard.items()
        if key.endswith(STORAGE_QUOTA_SUFFIX)
    }
    if storage:
        for class_name in storage:
            _storage_class(class_name, stack, book)
        gib = sum(sized(amount) / 1024**3 for amount in storage.values())
        lines.append(
            CostLine(
                f"storage quota {where}",
                f"up to {gib:g} GiB of {', '.join(storage)} claims, in use or kept",
                Gp3(gib).per_hour(book),
                Part.QUOTA,
            )
        )
    balancers = dig(meta, "annotations", SSH_LOAD_BALANCERS_ANNOTATION)
    if balancers:
        count = int(balancers)
        azs, each = classic_load_balancer(stack, book)
        lines.append(
            CostLine(
                f"SSH load balancers {where}",
                f"up to {count} Classic LBs (one a server) in {azs} AZs, "
                f"+ ${book.usd('classicLoadBalancerPerGb')}/GB",
                count * each,
                Part.QUOTA,
            )
        )
    return lines


def _claim(r: Declared, stack: Sequence[Declared], book: PriceBook) -> list[CostLine]:
    """A claim the program declares: a gp3 class provisions an EBS volume of its size; a claim
    bound to a declared volume or of an EFS class adds nothing (that store is priced itself)."""
    spec = dig(r.props, "spec")
    class_name = dig(spec, "storageClassName")
    if dig(spec, "volumeName") or class_name == "":
        return []
    provisioner = next(
        (
            dig(d.props, "provisioner")
            for d in stack
            if d.type == STORAGE_CLASS and dig(d.props, "metadata", "name") == class_name
        ),
        None,
    )
    if provisioner != EBS_CSI:
        if provisioner is None:
            raise UnpricedError(f"its storage class {class_name} is not one of this stack")
        return []
    _storage_class(class_name, stack, book)
    gib = sized(required(spec, "resources", "requests", "storage")) / 1024**3
    return [CostLine(f"volume {r.name}", f"{gib:g} GiB gp3", Gp3(gib).per_hour(book))]


KINDS = (
    Kind(
        LUSTRE,
        price=_lustre,
        replace=ReplaceRule(
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
    ),
    Kind(RESOURCE_QUOTA, price=_resource_quota, replace=ReplaceRule(("spec.scopes",), K8S)),
    Kind(
        CLAIM,
        price=_claim,
        replace=ReplaceRule(
            (
                "spec.accessModes",
                "spec.storageClassName",
                "spec.volumeName",
                _SELECTOR,
            ),
            K8S,
        ),
    ),
    Kind(
        "aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation",
        free="FSx: the link is free; its imports and exports are S3 requests (usage)",
        replace=ReplaceRule(
            ("dataRepositoryPath", "fileSystemId", "fileSystemPath"),
            f"{TF}/fsx/data_repository_association.go",
        ),
    ),
    Kind(
        "aws:efs/fileSystem:FileSystem",
        usage="EFS storage per GB-month, Elastic Throughput per GB",
        replace=ReplaceRule(
            (
                "availabilityZoneName",
                "creationToken",
                "encrypted",
                "kmsKeyId",
                "performanceMode",
            ),
            f"{TF}/efs/file_system.go",
        ),
    ),
    Kind(
        "aws:efs/mountTarget:MountTarget",
        free="EFS bills storage and throughput, not mount targets",
        replace=ReplaceRule(
            ("fileSystemId", "subnetId", "ipAddress", "ipAddressType", "ipv6Address"),
            f"{TF}/efs/mount_target.go",
        ),
    ),
    Kind(
        "aws:efs/accessPoint:AccessPoint",
        free="EFS bills storage and throughput, not access points",
        replace=ReplaceRule(
            ("fileSystemId", "posixUser", "rootDirectory"), f"{TF}/efs/access_point.go"
        ),
    ),
    Kind(
        "aws:efs/fileSystemPolicy:FileSystemPolicy",
        free="EFS bills storage and throughput, not its file system policy",
        replace=ReplaceRule(("fileSystemId",), f"{TF}/efs/file_system_policy.go"),
    ),
    Kind(
        "aws:efs/backupPolicy:BackupPolicy",
        usage="AWS Backup storage of the EFS recovery points per GB-month (AWS Backup pricing)",
        replace=ReplaceRule(("fileSystemId",), f"{TF}/efs/backup_policy.go"),
    ),
    Kind(
        "aws:s3/bucket:Bucket",
        usage="S3 storage per GB-month and requests",
        replace=ReplaceRule(
            (
                "bucket",
                "bucketPrefix",
                "objectLockEnabled",
                "objectLockConfiguration.objectLockEnabled",
            ),
            f"{TF}/s3/bucket.go",
        ),
    ),
    Kind(
        LIFECYCLE,
        free="bucket configuration (the bucket's storage and requests are usage)",
    ),
    Kind("aws:s3/bucketOwnershipControls:BucketOwnershipControls", free="bucket configuration"),
    Kind("aws:s3/bucketPolicy:BucketPolicy", free="bucket configuration"),
    Kind(
        "aws:s3/bucketObjectv2:BucketObjectv2",
        free="an empty object (FSx's team marker): its PUT and storage are too small to price",
        replace=ReplaceRule(("bucket", "key"), f"{TF}/s3/object.go"),
    ),
    Kind("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock", free="bucket configuration"),
    Kind(
        "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
        free="bucket configuration (SSE-KMS requests bill on the key's request rate, usage)",
    ),
    Kind(
        "aws:s3/bucketVersioning:BucketVersioning",
        free="bucket configuration (noncurrent versions bill as storage, usage)",
    ),
    Kind(
        "aws:ebs/volume:Volume",
        replace=ReplaceRule(
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
    ),
    Kind(
        "kubernetes:core/v1:PersistentVolume",
        free=f"{K8S_OBJECT}; it names a volume priced itself (FSx)",
        replace=ReplaceRule(
            tuple(
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
            K8S,
        ),
    ),
    Kind(STORAGE_CLASS, free=K8S_OBJECT, replace=ReplaceRule(("parameters", "provisioner"), K8S)),
)


ADDONS = {
    "aws-ebs-csi-driver": [
        AddonPods(
            "controller",
            2,
            False,
            # ebs-plugin, provisioner, attacher, snapshotter, resizer, liveness-probe.
            Requests(0.01, 40) * 6,
            CRITICAL_ADDONS,
            f"{EBS_CHART}: controller.replicaCount 2, 10m and 40Mi in each of 6 containers",
            selector_values="controller.nodeSelector",
        ),
        AddonPods(
            "node",
            1,
            True,
            Requests(0.01, 40) * 3,
            EVERY_TAINT,
            f"{EBS_CHART}: node.tolerateAllTaints, 10m and 40Mi in each of 3 containers",
        ),
    ],
    "aws-efs-csi-driver": [
        AddonPods(
            "controller",
            2,
            False,
            Requests(),
            CRITICAL_ADDONS,
            "kubernetes-sigs/aws-efs-csi-driver v2.1.13 values.yaml: replicaCount 2, resources {}",
            selector_values="controller.nodeSelector",
        ),
        AddonPods(
            "node",
            1,
            True,
            Requests(),
            EVERY_TAINT,
            "kubernetes-sigs/aws-efs-csi-driver v2.1.13 values.yaml: resources {}",
        ),
    ],
    "aws-fsx-csi-driver": [
        AddonPods(
            "controller",
            2,
            False,
            Requests(0.01, 40) + Requests(0.01, 32) * 3,
            CRITICAL_ADDONS,
            f"{FSX_CHART}: replicaCount 2; plugin 10m/40Mi, 3 sidecars 10m/32Mi",
            selector_values="controller.nodeSelector",
        ),
        AddonPods(
            "node",
            1,
            True,
            Requests(0.01, 40) + Requests(0.01, 32) * 2,
            EVERY_TAINT,
            f"{FSX_CHART}: tolerateAllTaints; plugin 10m/40Mi, 2 sidecars 10m/32Mi",
        ),
    ],
}
