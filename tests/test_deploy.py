"""What a real `pulumi up` / `pulumi destroy` does with the program, checked on the offline plan.

Each test is a class of deploy failure found upstream (pulumi engine, Karpenter, Kueue, EKS):
working directory, create/destroy ordering, finalizers, quotas that block undeclared resources,
IAM a call really needs, partitions.
"""

import json
import os
import re
from pathlib import Path

import pytest
import yaml

from infra.components.iam import CSI_CONTROLLER_NODE_SELECTOR
from infra.components.kueue import EXCLUDED_RESOURCE_PREFIXES
from infra.components.node_pools import EFA_NODE_LABELS
from infra.components.queues import COVERED_RESOURCES
from infra.components.system_nodes import SYSTEM_NODE_LABEL, SYSTEM_PLACEMENT, SYSTEM_TOLERATION
from infra.config import parse_stack_config
from infra.offline import run_offline
from infra.paths import PROGRAM_DIR
from infra.program import build_platform
from infra.versions import EFA_DEVICE_PLUGIN_CHART, KARPENTER_CHART, KARPENTER_CRD_CHART
from tests.conftest import NO_DEV_SERVERS, ROOT, STACKS, plan_of, stack_values
from workloads.manifests import TRAINER_UID

RELEASE = "kubernetes:helm.sh/v3:Release"
NODEPOOL = "kubernetes:karpenter.sh/v1:NodePool"
NODECLASS = "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass"
JOBS = ("kubernetes:kubeflow.org/v1:PyTorchJob", "kubernetes:kubeflow.org/v2beta1:MPIJob")


def depends_on(plan, resource) -> set[str]:
    """URNs `resource` depends on, directly or through others: the engine deletes it first."""
    seen, todo = set(), list(resource.dependencies)
    while todo:
        urn = todo.pop()
        if urn not in seen:
            seen.add(urn)
            found = [r for r in plan.resources if r.urn == urn]
            todo += found[0].dependencies if found else []
    return seen


def pod_templates(job: dict) -> list[dict]:
    replicas = job["spec"].get("pytorchReplicaSpecs") or job["spec"]["mpiReplicaSpecs"]
    return [r["template"] for r in replicas.values()]


# --- working directory ------------------------------------------------------------------------


def test_offline_plan_runs_the_program_where_pulumi_does():
    main = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())["main"]
    seen = []
    run_offline(lambda: seen.append(os.getcwd()), "dev", stack_values("dev"))
    assert seen == [str((ROOT / main).resolve())] == [str(PROGRAM_DIR)]
    assert os.getcwd() != str(PROGRAM_DIR)  # restored for the caller


@pytest.mark.parametrize("stack", STACKS)
def test_every_local_path_a_provider_reads_exists_from_the_programs_directory(stack, request):
    plan = request.getfixturevalue(f"{stack}_plan")
    paths = []

    def collect(value, key=""):
        if isinstance(value, dict):
            for k, v in value.items():
                collect(v, k)
        elif isinstance(value, list):
            for v in value:
                collect(v, key)
        elif key in {"directory", "location", "file", "files", "path"} and isinstance(value, str):
            if not re.match(r"^[a-z]+://", value):
                paths.append(value)

    # Resources whose provider reads local files (Helm values and pod specs name in-cluster paths).
    readers = ("kubernetes:kustomize/", "kubernetes:yaml/", "docker-build:")
    for resource in plan.resources:
        if resource.type.startswith(readers):
            collect(resource.inputs)
    assert len(paths) >= 3  # kustomize directories, image context and Dockerfile
    for path in paths:
        assert not Path(path).is_absolute(), f"{path}: absolute paths differ per checkout"
        assert (PROGRAM_DIR / path).exists(), f"{path} does not exist from {PROGRAM_DIR}"
    for directory in plan.of_type("kubernetes:kustomize/v2:Directory"):
        assert (PROGRAM_DIR / directory.inputs["directory"] / "kustomization.yaml").is_file()


# --- create and destroy order -----------------------------------------------------------------


@pytest.mark.parametrize("stack", STACKS)
def test_destroy_removes_nodepools_before_karpenter_and_karpenter_before_its_nodes(stack, request):
    """Reverse dependency order: NodePools/EC2NodeClasses (whose finalizers terminate the GPU
    instances) go while the controller still runs, with its credentials and its nodes."""
    plan = request.getfixturevalue(f"{stack}_plan")
    karpenter = plan.one(RELEASE, "karpenter")
    for custom in plan.of_type(NODEPOOL) + plan.of_type(NODECLASS):
        assert karpenter.urn in depends_on(plan, custom), custom.name
    needed = depends_on(plan, karpenter)
    for type_, name in [
        ("aws:eks/nodeGroup:NodeGroup", "cluster-system"),
        ("aws:eks/addon:Addon", "cluster-eks-pod-identity-agent"),
        ("aws:eks/podIdentityAssociation:PodIdentityAssociation", "karpenter-controller"),
        ("aws:iam/rolePolicy:RolePolicy", "karpenter-controller"),
        ("aws:eks/accessEntry:AccessEntry", "karpenter-node"),
        ("aws:sqs/queuePolicy:QueuePolicy", "karpenter-interruption"),
        (RELEASE, "karpenter-crd"),
    ]:
        assert plan.one(type_, name).urn in needed, name
    # Node roles lose their policies only after the nodes (and Karpenter) are gone.
    for attachment in plan.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment"):
        if attachment.name.startswith("karpenter-node-"):
            assert attachment.urn in needed


@pytest.mark.parametrize("stack", STACKS)
def test_every_controller_with_finalizers_outlives_what_it_finalizes(stack, request):
    plan = request.getfixturevalue(f"{stack}_plan")
    prerequisites = {
        plan.one("aws:eks/nodeGroup:NodeGroup", "cluster-system").urn,
        plan.one("aws:eks/addon:Addon", "cluster-eks-pod-identity-agent").urn,
    }
    controllers = [
        plan.one(RELEASE, "karpenter"),
        plan.one(RELEASE, "kueue"),
        *plan.of_type("kubernetes:kustomize/v2:Directory"),
        *[a for a in plan.of_type("aws:eks/addon:Addon") if a.name.endswith("-csi")],
    ]
    assert len(controllers) >= 6
    for controller in controllers:
        assert prerequisites <= depends_on(plan, controller), controller.name
    kueue = plan.one(RELEASE, "kueue")
    for resource in plan.resources:
        if resource.type.startswith("kubernetes:kueue.x-k8s.io/") or resource.type in JOBS:
            assert kueue.urn in depends_on(plan, resource), resource.name
    for job in [r for t in JOBS for r in plan.of_type(t)]:
        for operator in plan.of_type("kubernetes:kustomize/v2:Directory"):
            assert operator.urn in depends_on(plan, job)


def test_fsx_is_created_after_its_security_group_opens_lustre(prod_plan):
    file_system = prod_plan.one("aws:fsx/lustreFileSystem:LustreFileSystem")
    rules = [
        r
        for r in prod_plan.of_type("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")
        + prod_plan.of_type("aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule")
        if r.name.startswith("fsx-")
    ]
    assert {r.inputs["fromPort"] for r in rules} == {988, 1018}
    assert {r.urn for r in rules} <= set(file_system.dependencies)


# --- Kueue admits what jobs ask for -----------------------------------------------------------


@pytest.mark.parametrize("stack", STACKS)
def test_every_resource_a_job_pod_requests_is_queued_for_or_excluded(stack, request):
    """Kueue 0.19 (BlockUndeclared) never admits a pod asking for an undeclared resource."""
    plan = request.getfixturevalue(f"{stack}_plan")
    release = plan.one(RELEASE, "kueue").inputs["values"]
    config = yaml.safe_load(release["managerConfig"]["controllerManagerConfigYaml"])
    excluded = config["resources"]["excludeResourcePrefixes"]
    assert excluded == EXCLUDED_RESOURCE_PREFIXES
    requested = {
        name
        for job in [r for t in JOBS for r in plan.of_type(t)]
        for template in pod_templates(job.inputs)
        for container in template["spec"]["containers"]
        for name in container["resources"]["requests"]
    }
    assert "vpc.amazonaws.com/efa" in requested or stack != "dev"
    for name in requested:
        assert name in COVERED_RESOURCES or name.startswith(tuple(excluded)), name


@pytest.mark.parametrize("stack", STACKS)
def test_job_pods_are_never_best_effort_and_fit_their_node_and_quota(stack, request):
    plan = request.getfixturevalue(f"{stack}_plan")
    config = parse_stack_config(stack_values(stack), stack)
    pools = {p.name: p for p in config.node_pools}
    for job in config.jobs:
        pool = pools[job.node_pool]
        (resource,) = [
            r for t in JOBS for r in plan.of_type(t) if r.inputs["metadata"]["name"] == job.name
        ]
        worker = pod_templates(resource.inputs)[-1]["spec"]["containers"][0]["resources"]
        cpu = int(worker["requests"]["cpu"])
        memory = int(worker["requests"]["memory"].removesuffix("Gi"))
        smallest_cpu = min(t.vcpu for t in pool.types)
        smallest_memory = min(t.memory_gib for t in pool.types)
        assert 0 < cpu < smallest_cpu and 0 < memory < smallest_memory, job.name
        assert worker["limits"]["memory"] == worker["requests"]["memory"]
        ceiling = pool.ceiling()
        assert cpu * job.max_nodes <= ceiling.vcpu - 1  # room for an MPI launcher
        assert memory * job.max_nodes <= ceiling.memory_gib - 2


# --- controllers on the system nodes ----------------------------------------------------------


def test_controllers_run_on_the_tainted_system_nodes(dev_plan):
    karpenter = dev_plan.one(RELEASE, "karpenter").inputs["values"]
    assert karpenter["nodeSelector"] == SYSTEM_NODE_LABEL
    assert karpenter["tolerations"] == [SYSTEM_TOLERATION]
    kueue = dev_plan.one(RELEASE, "kueue").inputs["values"]["controllerManager"]
    assert {k: kueue[k] for k in SYSTEM_PLACEMENT} == SYSTEM_PLACEMENT
    # Leader election with a spare and a PDB: draining a system node never stops admission.
    assert kueue["replicas"] == 2
    assert kueue["podDisruptionBudget"] == {"enabled": True, "minAvailable": 1}
    csi = {
        a.inputs["addonName"]: a.inputs
        for a in dev_plan.of_type("aws:eks/addon:Addon")
        if a.name.endswith("-csi")
    }
    assert set(csi) == {"aws-ebs-csi-driver", "aws-efs-csi-driver"}
    # Pinned to the system nodes where the add-on's configuration schema has the key (a key
    # outside it fails CreateAddon); the others tolerate the system taint by default.
    for name, addon in csi.items():
        if name in CSI_CONTROLLER_NODE_SELECTOR:
            values = json.loads(addon["configurationValues"])
            assert values == {"controller": {"nodeSelector": SYSTEM_NODE_LABEL}}
        else:
            assert "configurationValues" not in addon


# --- Karpenter: complete policy, upgradable CRDs, bounded drains, EFA placement ----------------


def test_karpenter_crds_come_from_the_crd_chart_at_the_controller_version(dev_plan):
    crds = dev_plan.one(RELEASE, "karpenter-crd").inputs
    controller = dev_plan.one(RELEASE, "karpenter").inputs
    assert (crds["chart"], crds["version"]) == (KARPENTER_CRD_CHART.chart, KARPENTER_CHART.version)
    assert controller["skipCrds"] is True and crds.get("skipCrds") is not True


def test_karpenter_controller_policy_has_what_v1_14_calls(dev_plan):
    policy = json.loads(
        dev_plan.one("aws:iam/rolePolicy:RolePolicy", "karpenter-controller").inputs["policy"]
    )
    actions = {
        a
        for s in policy["Statement"]
        for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])
    }
    assert {
        "ec2:DescribeInstanceStatus",
        "ec2:DescribePlacementGroups",
        "iam:ListInstanceProfiles",
        "iam:GetInstanceProfile",
        "arc-zonal-shift:GetManagedResource",
    } <= actions
    (launch,) = [
        s for s in policy["Statement"] if s["Sid"] == "AllowScopedEC2InstanceAccessActions"
    ]
    assert any(r.endswith(":placement-group/*") for r in launch["Resource"])


@pytest.mark.parametrize("stack", STACKS)
def test_nodepools_bound_drains_of_do_not_disrupt_pods(stack, request):
    plan = request.getfixturevalue(f"{stack}_plan")
    for pool in plan.of_type(NODEPOOL):
        assert pool.inputs["spec"]["template"]["spec"]["terminationGracePeriod"] == "24h"


def test_efa_pools_get_one_az_a_cluster_placement_group_and_the_efa_device_plugin(dev_plan):
    pools = {p.inputs["metadata"]["name"]: p.inputs["spec"] for p in dev_plan.of_type(NODEPOOL)}
    classes = {c.inputs["metadata"]["name"]: c.inputs["spec"] for c in dev_plan.of_type(NODECLASS)}
    zone = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-west-2a"]}
    assert zone in pools["gpu-large"]["template"]["spec"]["requirements"]
    assert pools["gpu-large"]["template"]["metadata"]["labels"].items() >= EFA_NODE_LABELS.items()
    (group,) = dev_plan.of_type("aws:ec2/placementGroup:PlacementGroup")
    assert group.inputs["strategy"] == "cluster"
    assert classes["gpu-large"]["placementGroupSelector"] == {"name": group.inputs["name"]}
    for other in ("gpu-small", "cpu"):
        assert "placementGroupSelector" not in classes[other]
        assert "topology.kubernetes.io/zone" not in json.dumps(pools[other])
        assert "training-platform/efa" not in pools[other]["template"]["metadata"]["labels"]
    plugin = dev_plan.one(RELEASE, "aws-efa-k8s-device-plugin").inputs
    assert (plugin["chart"], plugin["version"]) == (
        EFA_DEVICE_PLUGIN_CHART.chart,
        EFA_DEVICE_PLUGIN_CHART.version,
    )
    assert plugin["values"]["nodeSelector"] == EFA_NODE_LABELS
    without_efa = plan_of(
        "dev",
        nodePools=[
            p for p in stack_values("dev")["training-platform:nodePools"] if not p.get("efa")
        ],
        jobs=[j for j in stack_values("dev")["training-platform:jobs"] if j["kind"] != "MPIJob"],
        devServers=NO_DEV_SERVERS,
    )
    assert not [r for r in without_efa.of_type(RELEASE) if r.name == "aws-efa-k8s-device-plugin"]
    assert not without_efa.of_type("aws:ec2/placementGroup:PlacementGroup")
    # GPU pools without EFA keep their device plugin and GPU metrics.
    releases = {r.name for r in without_efa.of_type(RELEASE)}
    assert {"nvidia-device-plugin", "dcgm-exporter"} <= releases


def test_efa_image_target_ships_libfabric_and_aws_ofi_nccl():
    dockerfile = (ROOT / "trainer" / "Dockerfile").read_text()
    efa_stage = dockerfile.split("AS efa", 1)[1]
    assert "efa_installer.sh" in efa_stage and "--skip-kmod" in efa_stage
    assert re.search(r"ARG EFA_INSTALLER_VERSION=\d+\.\d+\.\d+", efa_stage)
    # The installer's Ubuntu packages put the plugin under lib/x86_64-linux-gnu; the build fails
    # if NCCL's EFA plugin is not where LD_LIBRARY_PATH points.
    assert "/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu" in efa_stage
    assert "libnccl-net" in efa_stage
    assert f"USER {TRAINER_UID}" in efa_stage.strip().splitlines()[-1]


# --- SSE-KMS, FSx permissions, partitions -----------------------------------------------------


def test_job_roles_may_use_the_bucket_key_when_the_bucket_is_sse_kms(prod_plan, dev_plan):
    key = prod_plan.one("aws:kms/key:Key", "training-bucket-sse")
    key_arn = next(
        r.inputs["rules"][0]["applyServerSideEncryptionByDefault"]["kmsMasterKeyId"]
        for r in prod_plan.of_type(
            "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration"
        )
    )
    job_policies = [
        json.loads(p.inputs["policy"])
        for p in prod_plan.of_type("aws:iam/rolePolicy:RolePolicy")
        if p.name.startswith("job-")
    ]
    assert job_policies
    # Named by its alias, known in a preview (the key's ARN is not): the policy pack can read it.
    alias = prod_plan.one("aws:kms/alias:Alias", "training-bucket-sse").inputs
    assert alias["name"] == "alias/tp-prod-training-bucket"
    assert alias["targetKeyId"] == key_arn.rsplit("/", 1)[1]
    for policy in job_policies:
        (grant,) = [s for s in policy["Statement"] if s["Sid"] == "BucketKey"]
        assert grant["Action"] == ["kms:GenerateDataKey", "kms:Decrypt"]
        assert grant["Resource"] == "arn:aws:kms:us-west-2:123456789012:key/*"
        assert grant["Condition"] == {
            "ForAnyValue:StringEquals": {"kms:ResourceAliases": alias["name"]}
        }
    for job in [r for t in JOBS for r in prod_plan.of_type(t)]:
        assert alias and prod_plan.one("aws:kms/alias:Alias", "training-bucket-sse").urn in (
            job.dependencies
        )
    # FSx's data repository association reads and writes S3 as its service-linked role.
    key_policy = json.loads(key.inputs["policy"])
    (fsx,) = [s for s in key_policy["Statement"] if s["Sid"] == "FsxDataRepositoryThroughS3"]
    bucket_arn = prod_plan.one("aws:s3/bucketPolicy:BucketPolicy").inputs["policy"]
    bucket_arn = json.loads(bucket_arn)["Statement"][0]["Resource"][0]
    assert fsx["Condition"] == {
        "StringEquals": {
            "kms:CallerAccount": "123456789012",
            "kms:ViaService": "s3.us-west-2.amazonaws.com",
            "kms:EncryptionContext:aws:s3:arn": bucket_arn,
        },
        "StringLike": {"aws:userid": "*:FSx"},
    }
    for policy in dev_plan.of_type("aws:iam/rolePolicy:RolePolicy"):
        assert "kms:" not in policy.inputs["policy"] or not policy.name.startswith("job-")


def test_fsx_checkpoints_are_writable_by_the_trainer_user(prod_plan):
    (job,) = [
        r for t in JOBS for r in prod_plan.of_type(t) if "/fsx/" in json.dumps(r.inputs["spec"])
    ]
    for template in pod_templates(job.inputs):
        if "initContainers" not in template["spec"]:
            continue
        (init,) = template["spec"]["initContainers"]
        directory = f"/fsx/checkpoints/{job.inputs['metadata']['name']}"
        assert init["command"][-1] == (
            f'mkdir -p "{directory}" && chown {TRAINER_UID}:{TRAINER_UID} "{directory}"'
        )
        assert init["securityContext"]["capabilities"] == {
            "drop": ["ALL"],
            "add": ["CHOWN", "DAC_OVERRIDE"],
        }
        break
    else:
        pytest.fail("no init container prepares the FSx checkpoint folder")
    assert re.search(rf"useradd .*--uid {TRAINER_UID}", (ROOT / "trainer/Dockerfile").read_text())


def test_every_arn_is_built_from_the_partition():
    values = stack_values("prod")
    config = parse_stack_config(values, "Pulumi.prod.yaml")
    plan = run_offline(lambda: build_platform(config), "prod", values, partition="aws-cn")
    text = json.dumps([r.inputs for r in plan.resources])
    # Admin and DevServer user principals come from stack config as written; everything the
    # program builds follows.
    for principal in ("role/platform-admins", "role/dev-carol"):
        text = text.replace(f"arn:aws:iam::123456789012:{principal}", "")
    assert "arn:aws-cn:" in text and "arn:aws:" not in text


# --- CI fails when the plan fails -------------------------------------------------------------


def test_every_workflow_step_with_a_pipe_fails_when_the_pipeline_does():
    for workflow in (ROOT / ".github" / "workflows").glob("*.yml"):
        document = yaml.safe_load(workflow.read_text())
        default_shell = (document.get("defaults") or {}).get("run", {}).get("shell")
        for job in document["jobs"].values():
            job_shell = (job.get("defaults") or {}).get("run", {}).get("shell", default_shell)
            for step in job["steps"]:
                run = step.get("run", "")
                if re.search(r"[^|]\|[^|]", run):
                    shell = step.get("shell", job_shell)
                    # GitHub runs `shell: bash` as `bash -eo pipefail`; its default does not.
                    assert shell == "bash" or "set -o pipefail" in run, (workflow.name, run)
