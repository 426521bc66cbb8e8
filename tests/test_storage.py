"""Storage: S3 bucket, EBS, EFS and FSx for Lustre with their CSI drivers, claims and rules."""

import ipaddress
import json

import pytest

from infra.components.bucket import prefix_access_policy
from infra.config import ConfigError, parse_stack_config
from infra.versions import DEFAULT_KUBERNETES_VERSION, KUBERNETES_VERSIONS
from tests.conftest import stack_values

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
        "StringLike": {"s3:prefix": ["checkpoints/team-a", "checkpoints/team-a/*"]}
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
    assert paths == {"/datasets": "datasets", "/checkpoints": "checkpoints/_fsx"}
    # Jobs checkpointing to FSx write under the exported path.
    job = prod_plan.one("kubernetes:kubeflow.org/v1:PyTorchJob").inputs
    command = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    checkpoint = command["command"][command["command"].index("--checkpoint-dir") + 1]
    assert checkpoint.startswith("/fsx/checkpoints/")


def test_fsx_is_backed_up_daily_and_on_deletion(prod_plan):
    fsx = prod_plan.one("aws:fsx/lustreFileSystem:LustreFileSystem").inputs
    assert fsx["automaticBackupRetentionDays"] == 7
    # The provider skips the final backup unless told not to.
    assert fsx["skipFinalBackup"] is False


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
        (ns, c) for ns in namespaces for c in ("fsx-training-data", "efs-shared")
    } | {("dev-carol", "efs-shared")}
    access_points = {
        a.inputs["rootDirectory"]["path"]: a
        for a in prod_plan.of_type("aws:efs/accessPoint:AccessPoint")
    }
    for (namespace, name), spec in claims.items():
        assert spec["accessModes"] == ["ReadWriteMany"]
        volume = volumes[spec["volumeName"]]
        assert volume["persistentVolumeReclaimPolicy"] == "Retain"
        if name == "efs-shared":
            # Its own access point, rooted in the namespace's own directory, as one user.
            point = access_points[f"/namespaces/{namespace}"]
            assert volume["claimRef"] == {"namespace": namespace, "name": "efs-shared"}
            assert volume["csi"]["volumeHandle"] == f"{efs_id(prod_plan)}::{point.outputs['id']}"
            assert point.inputs["posixUser"] == {"uid": 10001, "gid": 10001}
            assert point.inputs["rootDirectory"]["creationInfo"]["permissions"] == "750"
            continue
        assert spec["storageClassName"] == "" and volume["storageClassName"] == ""
        assert spec["resources"]["requests"]["storage"] == volume["capacity"]["storage"] == "4800Gi"
        assert volume["csi"]["driver"] == "fsx.csi.aws.com"
        assert (
            volume["csi"]["volumeHandle"].startswith("fs-")
            and volume["persistentVolumeReclaimPolicy"] == "Retain"
        )
        assert set(volume["csi"]["volumeAttributes"]) == {"dnsname", "mountname"}
    fsx_volumes = [v for v in volumes.values() if v["csi"]["driver"] == "fsx.csi.aws.com"]
    assert len(fsx_volumes) == 3 and len(access_points) == 4
    assert {v["csi"]["volumeHandle"] for v in fsx_volumes} == {fsx_id(prod_plan)}


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
    ],
)
def test_invalid_storage_sizes_are_config_errors(storage, key_path, message):
    with pytest.raises(ConfigError) as caught:
        parse_stack_config(stack_values("dev", storage=storage), "Pulumi.dev.yaml")
    line = next(x for x in str(caught.value).splitlines() if f"training-platform:{key_path}:" in x)
    assert message in line
