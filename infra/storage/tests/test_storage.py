"""Storage: S3 bucket, EBS, EFS and FSx for Lustre with their CSI drivers, claims and rules."""

import ipaddress
import json

import pytest

from infra.core.config import ConfigError
from infra.core.versions import DEFAULT_KUBERNETES_VERSION, KUBERNETES_VERSIONS
from infra.stack.loading import parse_stack_config
from infra.storage.bucket import prefix_access_policy
from infra.storage.facts import FSX, HOLDERS
from tests.plugin import stack_values

# The stacks run the default version.
ADDONS = KUBERNETES_VERSIONS[DEFAULT_KUBERNETES_VERSION].addons
INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
EGRESS = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"


def test_bucket_encrypted_private_tls_only_versioned(dev_plan, prod_plan):
    for plan, algorithm in ((dev_plan, "AES256"), (prod_plan, "aws:kms")):
        (rule,) = plan.one(
            "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration"
        ).inputs["rules"]
        assert rule["applyServerSideEncryptionByDefault"]["sseAlgorithm"] == algorithm
        block = plan.one("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock").inputs
        assert all(
            block[k] is True
            for k in (
                "blockPublicAcls",
                "blockPublicPolicy",
                "ignorePublicAcls",
                "restrictPublicBuckets",
            )
        )
        (deny,) = json.loads(plan.one("aws:s3/bucketPolicy:BucketPolicy").inputs["policy"])[
            "Statement"
        ]
        assert deny["Effect"] == "Deny" and deny["Condition"] == {
            "Bool": {"aws:SecureTransport": "false"}
        }
        assert plan.one("aws:s3/bucketVersioning:BucketVersioning").inputs[
            "versioningConfiguration"
        ] == {"status": "Enabled"}
    key_arn = prod_plan.one(
        "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration"
    ).inputs["rules"][0]["applyServerSideEncryptionByDefault"]["kmsMasterKeyId"]
    assert key_arn.startswith("arn:aws:kms:")
    assert (
        prod_plan.one("aws:kms/key:Key", "training-bucket-sse").inputs["enableKeyRotation"] is True
    )


def test_old_checkpoints_expire(prod_plan):
    rules = {
        r["id"]: r
        for r in prod_plan.one(
            "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration"
        ).inputs["rules"]
    }
    checkpoints = rules["expire-old-checkpoints"]
    assert checkpoints["filter"] == {"prefix": "checkpoints/"}
    assert checkpoints["expiration"] == {"days": 60}
    assert checkpoints["noncurrentVersionExpiration"]["noncurrentDays"] == 7
    # FSx's exports are overwritten in place as checkpoints change: their current objects stay
    # (they are the file system's), the versions they replace expire like the checkpoints'.
    exports = rules["expire-overwritten-fsx-exports"]
    assert exports["filter"] == {"prefix": "fsx/checkpoints/"}
    assert "expiration" not in exports
    assert exports["noncurrentVersionExpiration"] == {"noncurrentDays": 7}
    assert rules["abort-incomplete-uploads"]["abortIncompleteMultipartUpload"] == {
        "daysAfterInitiation": 3
    }


def test_prefix_policy_grants_only_that_prefix():
    policy = prefix_access_policy("arn:aws:s3:::data", "/checkpoints/team-a/")
    objects, listing = policy["Statement"]
    assert objects["Resource"] == "arn:aws:s3:::data/checkpoints/team-a/*"
    assert "s3:DeleteBucket" not in objects["Action"] and "*" not in json.dumps(objects["Action"])
    assert listing["Resource"] == "arn:aws:s3:::data"
    assert listing["Condition"] == {
        "StringLike": {"s3:prefix": ["checkpoints/team-a/", "checkpoints/team-a/*"]}
    }


def addon(plan, name):
    (found,) = [r for r in plan.of_type("aws:eks/addon:Addon") if r.inputs["addonName"] == name]
    return found.inputs


def role_of(plan, arn):
    (role,) = [
        r
        for r in plan.of_type("aws:iam/role:Role")
        if f"role/{r.name}-" in arn or arn.endswith(f"role/{r.name}")
    ]
    return role


@pytest.mark.parametrize(
    ("driver", "service_account", "managed_policy"),
    [
        ("aws-ebs-csi-driver", "ebs-csi-controller-sa", "AmazonEBSCSIDriverPolicy"),
        # Static access points only: its controller has nothing to call AWS for.
        ("aws-efs-csi-driver", "efs-csi-controller-sa", ""),
        ("aws-fsx-csi-driver", "fsx-csi-controller-sa", None),
    ],
)
def test_csi_drivers_pinned_with_their_own_pod_identity_role(
    prod_plan, driver, service_account, managed_policy
):
    inputs = addon(prod_plan, driver)
    assert inputs["addonVersion"] == ADDONS[driver]
    (association,) = inputs["podIdentityAssociations"]
    assert association["serviceAccount"] == service_account
    role = role_of(prod_plan, association["roleArn"])
    (trust,) = json.loads(role.inputs["assumeRolePolicy"])["Statement"]
    assert trust["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    attached = [
        a.inputs["policyArn"]
        for a in prod_plan.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
        if a.name.startswith(role.name + "-")
    ]
    inline = [p for p in prod_plan.of_type("aws:iam/rolePolicy:RolePolicy") if p.name == role.name]
    if managed_policy:
        assert attached == [f"arn:aws:iam::aws:policy/service-role/{managed_policy}"]
    elif managed_policy == "":
        assert attached == [] and inline == []
    else:
        (policy,) = inline
        assert json.loads(policy.inputs["policy"])["Statement"] == [
            {"Effect": "Allow", "Action": ["fsx:DescribeFileSystems"], "Resource": "*"}
        ]


def storage_class(plan, name):
    (found,) = [
        r
        for r in plan.of_type("kubernetes:storage.k8s.io/v1:StorageClass")
        if r.inputs["metadata"]["name"] == name
    ]
    return found.inputs


def test_default_gp3_storage_class(dev_plan):
    gp3 = storage_class(dev_plan, "gp3")
    assert gp3["provisioner"] == "ebs.csi.aws.com"
    assert gp3["parameters"]["type"] == "gp3" and gp3["parameters"]["encrypted"] == "true"
    assert (
        gp3["volumeBindingMode"] == "WaitForFirstConsumer" and gp3["allowVolumeExpansion"] is True
    )
    assert gp3["metadata"]["annotations"] == {"storageclass.kubernetes.io/is-default-class": "true"}


@pytest.mark.parametrize("name", ["gp3", "gp3-home"])
def test_every_volume_is_tagged_with_its_cluster_and_namespace(dev_plan, name):
    """What finds the volumes a destroyed cluster left (docs: upgrades, destroy cleanly)."""
    parameters = storage_class(dev_plan, name)["parameters"]
    assert parameters["tagSpecification_1"] == "training-platform:cluster=tp-dev"
    assert parameters["tagSpecification_2"] == "training-platform:namespace={{ .PVCNamespace }}"


def cluster_sg(plan):
    return plan.one("aws:ec2/tag:Tag", "cluster-cluster-sg-discovery").inputs["resourceId"]


@pytest.mark.parametrize(("stack", "azs"), [("dev", 2), ("prod", 3)])
def test_efs_encrypted_with_a_mount_target_per_private_subnet_and_nfs_from_nodes_only(
    stack, azs, request
):
    plan = request.getfixturevalue(f"{stack}_plan")
    assert plan.one("aws:efs/fileSystem:FileSystem").inputs["encrypted"] is True
    private = {s.urn for s in plan.of_type("aws:ec2/subnet:Subnet") if "-private-" in s.name}
    targets = plan.of_type("aws:efs/mountTarget:MountTarget")
    assert len(targets) == azs == len(private)
    assert [len(private & set(t.dependencies)) for t in targets] == [1] * azs
    assert len({t.inputs["subnetId"] for t in targets}) == azs
    (rule,) = [r for r in plan.of_type(INGRESS) if r.name == "efs-nfs"]
    assert (rule.inputs["ipProtocol"], rule.inputs["fromPort"], rule.inputs["toPort"]) == (
        "tcp",
        2049,
        2049,
    )
    assert rule.inputs["referencedSecurityGroupId"] == cluster_sg(plan)
    # Backed up daily by AWS Backup; recovery points outlive the file system.
    (backup,) = plan.of_type("aws:efs/backupPolicy:BackupPolicy")
    assert backup.inputs["backupPolicy"] == {"status": "ENABLED"}


def test_no_security_group_rule_is_open_to_the_world(stack_plan):
    """Rules name a security group, or (VPC endpoints: HTTPS from the VPC) a range inside it."""
    vpc = ipaddress.ip_network(stack_plan.one("aws:ec2/vpc:Vpc").inputs["cidrBlock"])
    for rule in stack_plan.of_type(INGRESS) + stack_plan.of_type(EGRESS):
        assert "cidrIpv6" not in rule.inputs, rule.name
        if "cidrIpv4" in rule.inputs:
            assert ipaddress.ip_network(rule.inputs["cidrIpv4"]).subnet_of(vpc), rule.name
        else:
            assert rule.inputs["referencedSecurityGroupId"], rule.name


def test_dev_has_no_fsx_and_prod_has_persistent_2(dev_plan, prod_plan):
    assert not dev_plan.of_type("aws:fsx/lustreFileSystem:LustreFileSystem")
    fsx = prod_plan.one("aws:fsx/lustreFileSystem:LustreFileSystem").inputs
    assert (fsx["deploymentType"], fsx["storageCapacity"], fsx["perUnitStorageThroughput"]) == (
        "PERSISTENT_2",
        4800,
        250,
    )
    first_private = prod_plan.one("aws:ec2/subnet:Subnet", "network-private-0")
    assert fsx["subnetIds"] == fsx["subnetIds"] and isinstance(fsx["subnetIds"], str)
    assert (
        first_private.urn in prod_plan.one("aws:fsx/lustreFileSystem:LustreFileSystem").dependencies
    )


def test_lustre_ports_between_nodes_and_the_file_system_only(prod_plan):
    group = prod_plan.one("aws:ec2/securityGroup:SecurityGroup", "fsx-lustre")
    fsx = prod_plan.one("aws:fsx/lustreFileSystem:LustreFileSystem")
    assert group.urn in fsx.dependencies
    for kind in (INGRESS, EGRESS):
        rules = [r.inputs for r in prod_plan.of_type(kind) if r.name.startswith("fsx-")]
        ports = sorted((r["fromPort"], r["toPort"]) for r in rules)
        assert ports == [(988, 988), (988, 988), (1018, 1023), (1018, 1023)]
        sources = {r["referencedSecurityGroupId"] for r in rules}
        assert (
            cluster_sg(prod_plan) in sources and len(sources) == 2
        )  # the nodes and the group itself
        assert all(r["ipProtocol"] == "tcp" for r in rules)


DRA = "aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation"


def test_datasets_and_checkpoints_sync_both_ways_with_the_bucket(prod_plan):
    """No checkpoint lives only on the file system: /checkpoints is exported to the bucket (and
    imported again by a new file system), as the datasets are."""
    bucket = prod_plan.one("aws:s3/bucket:Bucket")
    paths = {}
    for dra in prod_plan.of_type(DRA):
        inputs = dra.inputs
        assert inputs["dataRepositoryPath"].startswith("s3://training-bucket-")
        paths[inputs["fileSystemPath"]] = inputs["dataRepositoryPath"].split("/", 3)[3]
        assert inputs["s3"]["autoImportPolicy"]["events"] == ["NEW", "CHANGED", "DELETED"]
        assert inputs["s3"]["autoExportPolicy"]["events"] == ["NEW", "CHANGED", "DELETED"]
        assert inputs["batchImportMetaDataOnCreate"] is True
        assert bucket.urn in dra.dependencies
    assert paths == {"/datasets": "datasets", "/checkpoints": "fsx/checkpoints"}
    # Jobs checkpointing to FSx write under the exported path.
    job = prod_plan.one("kubernetes:kubeflow.org/v1:PyTorchJob").inputs
    command = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    checkpoint = command["command"][command["command"].index("--checkpoint-dir") + 1]
    assert checkpoint.startswith("/fsx/checkpoints/")


def test_an_association_is_replaced_old_one_first(prod_plan):
    """Two associations may not share a file system path (FSx API reference,
    DataRepositoryAssociation FileSystemPath): one whose bucket path changes is replaced, and
    the new one can only be made once the old one is gone."""
    for dra in prod_plan.of_type(DRA):
        assert dra.delete_before_replace, dra.name


def test_fsx_asks_for_no_backup_aws_refuses_and_its_export_is_outside_the_retention(prod_plan):
    """FSx backs up no file system linked to S3 ("Backups cannot be enabled on S3-linked file
    systems": FSx API reference, DeleteFileSystem; Lustre user guide, Protecting your data with
    backups): what keeps its files is their export, which the bucket's checkpoint expiry must not
    reach (the trainer's --keep-last prunes the FSx copies, and the export with them)."""
    fsx = prod_plan.one("aws:fsx/lustreFileSystem:LustreFileSystem").inputs
    assert fsx["automaticBackupRetentionDays"] == 0 and fsx["skipFinalBackup"] is True
    (lifecycle,) = prod_plan.of_type(
        "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration"
    )
    expiring = [r["filter"]["prefix"] for r in lifecycle.inputs["rules"] if "expiration" in r]
    (export,) = [
        d.inputs["dataRepositoryPath"]
        for d in prod_plan.of_type(DRA)
        if d.inputs["fileSystemPath"] == "/checkpoints"
    ]
    assert expiring == ["checkpoints/"]
    assert not export.split("/", 3)[3].startswith("checkpoints/")
    # What the plan tells an engineer about to lose it: the export, not a backup.
    assert "not yet exported" in HOLDERS[FSX] and "s3://<bucket>/fsx/checkpoints/" in HOLDERS[FSX]


def fsx_id(plan):
    return plan.of_type(DRA)[0].inputs["fileSystemId"]


def test_each_team_namespace_gets_fsx_and_efs_claims_wired_to_their_volumes(prod_plan):
    volumes = {
        r.inputs["metadata"]["name"]: r.inputs["spec"]
        for r in prod_plan.of_type("kubernetes:core/v1:PersistentVolume")
    }
    claims = {
        (r.inputs["metadata"]["namespace"], r.inputs["metadata"]["name"]): r.inputs["spec"]
        for r in prod_plan.of_type("kubernetes:core/v1:PersistentVolumeClaim")
    }
    namespaces = {"team-a", "team-b", "research-jobs"}
    # DevServer users (dev-<user>) share the EFS claim too.
    assert set(claims) == {
        (ns, c) for ns in namespaces for c in ("fsx-checkpoints", "fsx-datasets", "efs-shared")
    } | {("dev-carol", "efs-shared")}
    access_points = {
        a.inputs["rootDirectory"]["path"]: a
        for a in prod_plan.of_type("aws:efs/accessPoint:AccessPoint")
    }
    mount_name = prod_plan.one("aws:fsx/lustreFileSystem:LustreFileSystem").outputs["mountName"]
    for (namespace, name), spec in claims.items():
        volume = volumes[spec["volumeName"]]
        assert volume["persistentVolumeReclaimPolicy"] == "Retain"
        # Only this namespace's claim may bind it.
        assert volume["claimRef"] == {"namespace": namespace, "name": name}
        if name == "efs-shared":
            assert spec["accessModes"] == ["ReadWriteMany"]
            # Its own access point, rooted in the namespace's own directory, as one user.
            point = access_points[f"/namespaces/{namespace}"]
            assert volume["csi"]["volumeHandle"] == f"{efs_id(prod_plan)}::{point.outputs['id']}"
            assert point.inputs["posixUser"] == {"uid": 10001, "gid": 10001}
            assert point.inputs["rootDirectory"]["creationInfo"]["permissions"] == "750"
            continue
        assert spec["storageClassName"] == "" and volume["storageClassName"] == ""
        assert spec["resources"]["requests"]["storage"] == volume["capacity"]["storage"] == "4800Gi"
        assert volume["csi"]["driver"] == "fsx.csi.aws.com"
        # A Lustre subdirectory mount of the team's own directory, or of the datasets read-only:
        # never the file system's root.
        attributes = volume["csi"]["volumeAttributes"]
        assert set(attributes) == {"dnsname", "mountname"}
        # One handle per volume: a pod mounts both, and the kubelet takes two volumes of one
        # driver and handle for one (kubernetes-sigs/aws-fsx-csi-driver#328).
        assert volume["csi"]["volumeHandle"] == f"{fsx_id(prod_plan)}::{namespace}/{name}"
        if name == "fsx-checkpoints":
            assert attributes["mountname"] == f"{mount_name}/checkpoints/{namespace}"
            assert spec["accessModes"] == volume["accessModes"] == ["ReadWriteMany"]
            assert volume["csi"]["readOnly"] is False
        else:
            assert attributes["mountname"] == f"{mount_name}/datasets"
            assert spec["accessModes"] == volume["accessModes"] == ["ReadOnlyMany"]
            assert volume["csi"]["readOnly"] is True
    fsx_volumes = [v for v in volumes.values() if v["csi"]["driver"] == "fsx.csi.aws.com"]
    assert len(fsx_volumes) == 6 and len(access_points) == 4
    assert len({v["csi"]["volumeHandle"] for v in fsx_volumes}) == 6


def test_a_teams_fsx_directory_is_made_by_importing_its_marker_before_its_volume(prod_plan):
    """A subdirectory mount needs the directory, and no pod reaches the root to make it: FSx
    makes /checkpoints/<namespace> when it imports the team's directory object under the export
    prefix, owned by the trainer's user (its POSIX metadata: the user, the group, st_mode)."""
    markers = {r.name: r for r in prod_plan.of_type("aws:s3/bucketObjectv2:BucketObjectv2")}
    bucket = prod_plan.one("aws:s3/bucket:Bucket")
    for team, namespace in (
        ("team-a", "team-a"),
        ("team-b", "team-b"),
        ("research", "research-jobs"),
    ):
        marker = markers[f"fsx-{team}"]
        assert marker.inputs["key"] == f"fsx/checkpoints/{namespace}/"
        assert marker.inputs["metadata"] == {
            "file-owner": "10001",
            "file-group": "10001",
            "file-permissions": "0040750",
        }
        assert marker.inputs["bucket"] == bucket.outputs["bucket"]
        volume = prod_plan.one("kubernetes:core/v1:PersistentVolume", f"fsx-checkpoints-{team}")
        assert marker.urn in volume.dependencies


def efs_id(plan):
    return plan.one("aws:efs/fileSystem:FileSystem").outputs["id"]


@pytest.mark.parametrize(
    ("storage", "key_path", "message"),
    [
        (
            {"fsx": {"enabled": True, "storageCapacityGib": 1000}},
            "storage.fsx",
            "allowed for PERSISTENT_2 SSD: 1200 or a multiple of 2400",
        ),
        ({"fsx": {"storageCapacityGib": 3600}}, "storage.fsx", "multiple of 2400"),
        (
            {"fsx": {"throughputPerTib": 300}},
            "storage.fsx.throughputPerTib",
            "125, 250, 500 or 1000",
        ),
        (
            {"bucket": {"checkpointRetentionDays": 0}},
            "storage.bucket.checkpointRetentionDays",
            "greater than or equal to 1",
        ),
        ({"fsx": {"datasetPrefix": "/abs"}}, "storage.fsx.datasetPrefix", "does not match"),
        # FSx refuses associations whose bucket paths overlap: not over its checkpoints' export.
        ({"fsx": {"datasetPrefix": "fsx"}}, "storage.fsx", "overlaps fsx/checkpoints/"),
        ({"fsx": {"datasetPrefix": "fsx/checkpoints/x"}}, "storage.fsx", "overlaps"),
        (
            {"fsx": {"backupRetentionDays": 7}},
            "storage.fsx",
            "backupRetentionDays is gone: FSx takes no backups of a file system linked to S3",
        ),
    ],
)
def test_invalid_storage_sizes_are_config_errors(storage, key_path, message):
    with pytest.raises(ConfigError) as caught:
        parse_stack_config(stack_values("dev", storage=storage), "Pulumi.dev.yaml")
    line = next(x for x in str(caught.value).splitlines() if f"training-platform:{key_path}:" in x)
    assert message in line
