"""Policy pack: every rule fails a resource that breaks it and passes one that keeps it."""

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from infra.core.offline import Plan, RecordedResource
from policies.offline import check
from policies.rules import POLICIES
from tests.plugin import ROOT, plan_of, stack_values

NODEPOOL = "kubernetes:karpenter.sh/v1:NodePool"
NODECLASS = "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass"
PYTORCHJOB = "kubernetes:kubeflow.org/v1:PyTorchJob"
MPIJOB = "kubernetes:kubeflow.org/v2beta1:MPIJob"


def plan_with(*resources: tuple[str, dict], stack: str = "dev") -> Plan:
    recorded = []
    for i, (type_, inputs) in enumerate(resources):
        urn = f"urn:pulumi:{stack}::training-platform::{type_}::r{i}"
        deps = [recorded[d].urn for d in inputs.pop("_deps", [])]
        protect = inputs.pop("_protect", False)  # a resource option, not an input
        recorded.append(
            RecordedResource(urn, type_, f"r{i}", "", "", deps, inputs, True, protect=protect)
        )
    return Plan(stack=stack, resources=recorded)


def job(image="repo@sha256:" + "a" * 64, label=True, shm=True, annotate=True, gpus=0) -> dict:
    pod = {
        "nodeSelector": {"training-platform.node-restriction.kubernetes.io/pool": "p"},
        "containers": [
            {
                "name": "pytorch",
                "image": image,
                "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}] if shm else [],
                **({"resources": {"limits": {"nvidia.com/gpu": str(gpus)}}} if gpus else {}),
            }
        ],
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
    }
    template = {
        "metadata": {"annotations": {"karpenter.sh/do-not-disrupt": "true"} if annotate else {}},
        "spec": pod,
    }
    return {
        "metadata": {"labels": {"kueue.x-k8s.io/queue-name": "team-a"} if label else {}},
        "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 2, "template": template}}},
    }


def gpu_pool(limits: dict) -> dict:
    return {
        "spec": {
            "limits": limits,
            "template": {
                "spec": {
                    "taints": [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}],
                    "requirements": [
                        {
                            "key": "node.kubernetes.io/instance-type",
                            "operator": "In",
                            "values": ["p5.48xlarge"],
                        }
                    ],
                }
            },
        }
    }


def iam(statement: dict) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": [statement]})


def star(action, resource):
    return iam({"Effect": "Allow", "Action": action, "Resource": resource})


def trust(principal, condition=None) -> str:
    statement = {"Effect": "Allow", "Principal": principal, "Action": ["sts:AssumeRole"]}
    return iam({**statement, **({"Condition": condition} if condition else {})})


def pool(types: list[str], limits: dict, taints: list | None = None, name="p") -> dict:
    return {
        "metadata": {"name": name},
        "spec": {
            "limits": limits,
            "template": {
                "spec": {
                    "taints": taints or [],
                    "requirements": [
                        {
                            "key": "node.kubernetes.io/instance-type",
                            "operator": "In",
                            "values": types,
                        }
                    ],
                }
            },
        },
    }


def hardened(job_props: dict, **pod_changes) -> dict:
    for replica in job_props["spec"]["pytorchReplicaSpecs"].values():
        pod = replica["template"]["spec"]
        pod["securityContext"] = {"runAsNonRoot": True, "runAsUser": 10001}
        for container in pod["containers"]:
            container["securityContext"] = {
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
                "seccompProfile": {"type": "RuntimeDefault"},
            }
        pod.update(pod_changes)
    return job_props


def sse(algorithm: str, key: str | None = None) -> dict:
    default = {"sseAlgorithm": algorithm, **({"kmsMasterKeyId": key} if key else {})}
    return {"rules": [{"applyServerSideEncryptionByDefault": default}]}


SSE_V2 = (
    "aws:s3/bucketServerSideEncryptionConfigurationV2:BucketServerSideEncryptionConfigurationV2"
)
GPU_TAINT = [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]
CPU_LIMITS = {"nodes": "2", "cpu": "32", "memory": "128Gi"}
GPU_LIMITS = {**CPU_LIMITS, "nvidia.com/gpu": "16"}
POD_IDENTITY = {"Service": "pods.eks.amazonaws.com"}
SCOPED = {
    "StringEquals": {
        "aws:RequestTag/eks-cluster-name": "tp",
        "aws:RequestTag/kubernetes-namespace": "team-a",
        "aws:RequestTag/kubernetes-service-account": "job",
    }
}
SEND = {
    "Effect": "Allow",
    "Principal": {"Service": "events.amazonaws.com"},
    "Action": "sqs:SendMessage",
}
ALL_LOGS = ["api", "audit", "authenticator", "controllerManager", "scheduler"]
NAMESPACE = "kubernetes:core/v1:Namespace"
ROLE = "aws:iam/role:Role"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
DEPLOYMENT = "kubernetes:apps/v1:Deployment"
PERSISTENT_2 = {"deploymentType": "PERSISTENT_2"}


def deployment(**pod) -> dict:
    return {"spec": {"template": {"spec": {"containers": [{"name": "c"}], **pod}}}}


# rule -> (breaking resource, keeping resource); stack rules and production-only rules run on
# the stack named in PROD_RULES.
FSX_HOLDER = {"tags": {"training-platform:data": "storage.fsx"}}
CASES = {
    "data-holders-protected": (
        ("aws:fsx/lustreFileSystem:LustreFileSystem", dict(FSX_HOLDER)),
        ("aws:fsx/lustreFileSystem:LustreFileSystem", {**FSX_HOLDER, "_protect": True}),
    ),
    "storage-encrypted": (
        ("aws:efs/fileSystem:FileSystem", {"encrypted": False}),
        ("aws:efs/fileSystem:FileSystem", {"encrypted": True}),
    ),
    "bucket-kms-in-production": ((SSE_V2, sse("AES256")), (SSE_V2, sse("aws:kms", "key-arn"))),
    "no-world-ingress": (
        (
            "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule",
            {"cidrIpv4": "0.0.0.0/0", "fromPort": 22},
        ),
        (
            "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule",
            {"referencedSecurityGroupId": "sg-1"},
        ),
    ),
    "eks-endpoint-not-public-in-production": (
        (
            "eks:index:Cluster",
            {
                "endpointPublicAccess": True,
                "publicAccessCidrs": ["0.0.0.0/0"],
                "enabledClusterLogTypes": ALL_LOGS,
                "encryptionConfigKeyArn": "k",
            },
        ),
        (
            "eks:index:Cluster",
            {
                "endpointPublicAccess": True,
                "publicAccessCidrs": ["203.0.113.0/24"],
                "enabledClusterLogTypes": ALL_LOGS,
                "encryptionConfigKeyArn": "k",
            },
        ),
    ),
    "eks-control-plane-logging": (
        ("eks:index:Cluster", {"enabledClusterLogTypes": ["api"], "encryptionConfigKeyArn": "k"}),
        ("eks:index:Cluster", {"enabledClusterLogTypes": ALL_LOGS, "encryptionConfigKeyArn": "k"}),
    ),
    "imdsv2-only": (
        (
            NODECLASS,
            {"spec": {"metadataOptions": {"httpTokens": "optional", "httpPutResponseHopLimit": 2}}},
        ),
        (
            NODECLASS,
            {"spec": {"metadataOptions": {"httpTokens": "required", "httpPutResponseHopLimit": 1}}},
        ),
    ),
    "nodepool-limits": (
        (NODEPOOL, pool(["m6i.2xlarge"], {"cpu": "100"})),
        (NODEPOOL, pool(["m6i.2xlarge"], CPU_LIMITS)),
    ),
    "gpu-nodepool-taint": (
        (NODEPOOL, pool(["p4d.24xlarge"], GPU_LIMITS)),
        (NODEPOOL, pool(["p4d.24xlarge"], GPU_LIMITS, GPU_TAINT)),
    ),
    "kueue-queue-label": ((PYTORCHJOB, job(label=False)), (PYTORCHJOB, job())),
    "training-pod-hygiene": ((PYTORCHJOB, job(shm=False, annotate=False)), (PYTORCHJOB, job())),
    "images-pinned": ((PYTORCHJOB, job(image="trainer:latest")), (PYTORCHJOB, job())),
    "no-iam-star-on-star": (
        (ROLE_POLICY, {"policy": star("*", "*")}),
        (ROLE_POLICY, {"policy": star("s3:GetObject", "*")}),
    ),
    "iam-no-service-wildcards": (
        (ROLE_POLICY, {"policy": star("s3:*", "arn:aws:s3:::b/*")}),
        (ROLE_POLICY, {"policy": star("s3:GetObject", "arn:aws:s3:::b/*")}),
    ),
    "iam-no-write-on-any-resource": (
        (ROLE_POLICY, {"policy": star(["ec2:DescribeInstances", "ec2:TerminateInstances"], "*")}),
        (ROLE_POLICY, {"policy": star(["ec2:DescribeInstances", "pricing:GetProducts"], "*")}),
    ),
    "iam-no-not-action": (
        (ROLE_POLICY, {"policy": iam({"Effect": "Allow", "NotAction": "iam:*", "Resource": "x"})}),
        (ROLE_POLICY, {"policy": iam({"Effect": "Deny", "NotAction": "s3:*", "Resource": "x"})}),
    ),
    "iam-no-broad-managed-policies": (
        (
            "aws:iam/rolePolicyAttachment:RolePolicyAttachment",
            {"policyArn": "arn:aws:iam::aws:policy/AdministratorAccess"},
        ),
        (
            "aws:iam/rolePolicyAttachment:RolePolicyAttachment",
            {"policyArn": "arn:aws:iam::aws:policy/AmazonEKSWorkerNodePolicy"},
        ),
    ),
    "iam-trust-no-wildcard-principal": (
        (ROLE, {"assumeRolePolicy": trust({"AWS": "*"})}),
        (ROLE, {"assumeRolePolicy": trust({"AWS": "arn:aws:iam::123456789012:root"})}),
    ),
    "pod-identity-trust-scoped": (
        (ROLE, {"assumeRolePolicy": trust(POD_IDENTITY)}),
        (ROLE, {"assumeRolePolicy": trust(POD_IDENTITY, SCOPED)}),
    ),
    "sqs-policy-source-scoped": (
        ("aws:sqs/queuePolicy:QueuePolicy", {"policy": iam(SEND)}),
        (
            "aws:sqs/queuePolicy:QueuePolicy",
            {"policy": iam({**SEND, "Condition": {"ArnEquals": {"aws:SourceArn": ["arn:r"]}}})},
        ),
    ),
    "no-public-buckets": (
        ("aws:s3/bucketAclV2:BucketAclV2", {"acl": "public-read"}),
        ("aws:s3/bucketAclV2:BucketAclV2", {"acl": "private"}),
    ),
    "pods-no-host-access": (
        (DEPLOYMENT, deployment(hostNetwork=True)),
        (DEPLOYMENT, deployment()),
    ),
    "pods-restricted": ((PYTORCHJOB, job()), (PYTORCHJOB, hardened(job()))),
    "team-namespaces-pod-security": (
        (NAMESPACE, {"metadata": {"labels": {"training-platform/team": "a"}}}),
        (
            NAMESPACE,
            {
                "metadata": {
                    "labels": {
                        "training-platform/team": "a",
                        "pod-security.kubernetes.io/enforce": "baseline",
                    }
                }
            },
        ),
    ),
    "ecr-scan-on-push": (
        ("aws:ecr/repository:Repository", {"imageScanningConfiguration": {"scanOnPush": False}}),
        ("aws:ecr/repository:Repository", {"imageScanningConfiguration": {"scanOnPush": True}}),
    ),
    "ecr-immutable-tags": (
        ("aws:ecr/repository:Repository", {"imageTagMutability": "MUTABLE"}),
        ("aws:ecr/repository:Repository", {"imageTagMutability": "IMMUTABLE"}),
    ),
    "s3-private-and-tls-only": (
        ("aws:s3/bucketV2:BucketV2", {}),
        ("aws:ecr/repository:Repository", {}),
    ),
    "job-gpus-fit-node": (
        (PYTORCHJOB, job(gpus=16)),
        (PYTORCHJOB, job(gpus=8)),
    ),
    "mpi-ssh-isolated": (
        (MPIJOB, {"metadata": {"name": "j", "namespace": "ns"}}),
        (PYTORCHJOB, job()),
    ),
    "cost-budget": (
        (
            "aws:fsx/lustreFileSystem:LustreFileSystem",
            {"storageCapacity": 2_400_000, "perUnitStorageThroughput": 1000, **PERSISTENT_2},
        ),
        (
            "aws:fsx/lustreFileSystem:LustreFileSystem",
            {"storageCapacity": 2400, "perUnitStorageThroughput": 1000, **PERSISTENT_2},
        ),
    ),
}
PROD_RULES = {"eks-endpoint-not-public-in-production", "bucket-kms-in-production"}
# Stack rules judge a resource against others in the plan: these come along with both cases.
CONTEXT = {"job-gpus-fit-node": [(NODEPOOL, pool(["p4d.24xlarge"], GPU_LIMITS, GPU_TAINT))]}


def violations_of(plan: Plan, rule: str, config=None) -> list:
    return [v for v in check(plan, config) if v.policy == rule]


def test_every_rule_has_cases_and_is_mandatory():
    assert len(POLICIES) >= 25
    assert set(CASES) == {p.name for p in POLICIES}
    assert {p.enforcement_level.value for p in POLICIES} == {"mandatory"}


@pytest.mark.parametrize("rule", sorted(CASES))
def test_rule_fails_the_breaking_resource_and_passes_the_good_one(rule):
    bad, good = CASES[rule]
    stack = "prod" if rule in PROD_RULES else "dev"
    context = [(t, copy.deepcopy(p)) for t, p in CONTEXT.get(rule, [])]
    config = {"budgetUsdPerHour": 100, "region": "us-east-1"}
    assert violations_of(
        plan_with(*context, (bad[0], copy.deepcopy(bad[1])), stack=stack), rule, config
    )
    good_plan = plan_with(*context, (good[0], copy.deepcopy(good[1])), stack=stack)
    assert violations_of(good_plan, rule, config) == []


def test_a_data_holder_is_named_and_unprotected_only_when_acknowledged():
    bucket = "aws:s3/bucket:Bucket"
    assert violations_of(plan_with((bucket, {"_protect": True})), "data-holders-protected")
    fsx = CASES["data-holders-protected"][0]
    acknowledged = {"acknowledgedDataLoss": ["storage.fsx"]}
    plan = plan_with((fsx[0], copy.deepcopy(fsx[1])))
    assert violations_of(plan, "data-holders-protected", acknowledged) == []
    team = {"metadata": {"name": "t", "labels": {"training-platform/team": "t"}}, "_protect": True}
    namespace = plan_with(("kubernetes:core/v1:Namespace", team))
    assert violations_of(namespace, "data-holders-protected")


def test_public_endpoint_is_fine_outside_production():
    bad = CASES["eks-endpoint-not-public-in-production"][0]
    assert (
        violations_of(
            plan_with((bad[0], dict(bad[1])), stack="dev"), "eks-endpoint-not-public-in-production"
        )
        == []
    )


def test_public_ingress_allowed_by_name():
    bad = CASES["no-world-ingress"][0]
    plan = plan_with((bad[0], dict(bad[1])))
    assert violations_of(plan, "no-world-ingress", {"allowedPublicIngress": ["r0"]}) == []


def test_bucket_needs_public_access_block_and_tls_policy():
    block = {
        "blockPublicAcls": True,
        "blockPublicPolicy": True,
        "ignorePublicAcls": True,
        "restrictPublicBuckets": True,
    }
    tls = iam({"Effect": "Deny", "Condition": {"Bool": {"aws:SecureTransport": "false"}}})
    guarded = plan_with(
        ("aws:s3/bucket:Bucket", {}),
        ("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock", {**block, "_deps": [0]}),
        ("aws:s3/bucketPolicy:BucketPolicy", {"policy": tls, "_deps": [0]}),
    )
    assert violations_of(guarded, "s3-private-and-tls-only") == []
    bare = plan_with(
        ("aws:s3/bucket:Bucket", {}),
        (
            "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock",
            {**block, "blockPublicAcls": False, "_deps": [0]},
        ),
    )
    (violation,) = violations_of(bare, "s3-private-and-tls-only")
    assert "public-access-block, tls-only" in violation.message


def test_cost_budget():
    budget = {"budgetUsdPerHour": 300, "region": "us-east-1"}
    pool = (NODEPOOL, gpu_pool({"nodes": "4", "nvidia.com/gpu": "32"}))  # 4 x p5.48xlarge
    assert violations_of(plan_with(pool), "cost-budget", budget) == []
    (violation,) = violations_of(
        plan_with((pool[0], gpu_pool({"nodes": "8", "nvidia.com/gpu": "64"}))),
        "cost-budget",
        budget,
    )
    assert "cost ceiling $440.32/hour exceeds the budget $300.00/hour" in violation.message


def test_cost_budget_prices_in_the_stack_region_and_names_what_it_cannot_price():
    eight = (NODEPOOL, gpu_pool({"nodes": "8", "nvidia.com/gpu": "64"}))  # 8 x p5.48xlarge
    provider = ("pulumi:providers:aws", {"region": "eu-west-1"})
    (violation,) = violations_of(plan_with(eight, provider), "cost-budget")
    assert "p5.48xlarge is not offered in eu-west-1: not sold in eu-west-1" in violation.message
    subnet = ("aws:ec2/subnet:Subnet", {"availabilityZone": "eu-central-1a"})
    (violation,) = violations_of(plan_with(eight, subnet), "cost-budget")
    assert "p5.48xlarge is not offered in eu-central-1" in violation.message
    (violation,) = violations_of(plan_with(eight), "cost-budget")
    assert 'set "region" in the policy pack config' in violation.message


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_both_stacks_are_clean(stack, request):
    assert check(request.getfixturevalue(f"{stack}_plan")) == []


def test_the_static_pool_the_prod_stack_file_offers_passes_the_policies():
    """Pulumi.prod.yaml and fleet-health.md offer `staticNodes: true` on gpu-large (with no
    DevServer flavor on it): a static NodePool may limit only `nodes`, which the policy takes."""
    values = stack_values("prod")
    pools = [
        {**p, "staticNodes": True} if p["name"] == "gpu-large" else p
        for p in values["training-platform:nodePools"]
    ]
    dev_servers = values["training-platform:devServers"]
    flavors = [f for f in dev_servers["flavors"] if f["nodePool"] != "gpu-large"]
    plan = plan_of("prod", nodePools=pools, devServers={**dev_servers, "flavors": flavors})
    (static,) = [p for p in plan.of_type(NODEPOOL) if p.inputs["metadata"]["name"] == "gpu-large"]
    assert static.inputs["spec"]["limits"] == {"nodes": "16"}
    assert check(plan) == []


@pytest.mark.parametrize(
    ("sections", "rule"),
    [
        (
            {"cluster": {"endpoint": {"publicAccessCidrs": ["0.0.0.0/0"]}}},
            "eks-endpoint-not-public-in-production",
        ),
        (
            {"karpenter": {"amiAlias": "al2023@v20261020"}, "policy": {"budgetUsdPerHour": 100}},
            "cost-budget",
        ),
    ],
)
def test_flipping_a_guarded_prod_setting_fails_the_plan_naming_the_rule(tmp_path, sections, rule):
    import yaml

    from tests.plugin import stack_values

    values = stack_values("prod", **sections)
    (tmp_path / "Pulumi.prod.yaml").write_text(yaml.safe_dump({"config": values}))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "deploy.plan",
            "--stack",
            "prod",
            "--project-dir",
            str(tmp_path),
            "--out",
            str(tmp_path / "out"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    assert f"[mandatory] {rule}:" in result.stdout


def test_policy_pack_entry_point_builds_from_the_rules():
    source = (ROOT / "policies" / "__main__.py").read_text()
    assert "PolicyPack(" in source and "POLICIES" in source
    assert Path(ROOT / "policies" / "PulumiPolicy.yaml").is_file()


@pytest.mark.parametrize(
    "cidrs",
    [
        {"cidrIpv4": "0.0.0.0/1"},
        {"cidrIpv6": "::/1"},
        {"cidrIpv6": "::/0"},
    ],
)
def test_world_open_ingress_in_any_spelling(cidrs):
    rule = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
    assert violations_of(plan_with((rule, dict(cidrs))), "no-world-ingress")


def test_split_world_ranges_in_one_rule_are_merged():
    group = "aws:ec2/securityGroup:SecurityGroup"
    split = {"ingress": [{"cidrBlocks": ["0.0.0.0/1", "128.0.0.0/1"]}]}
    (violation,) = violations_of(plan_with((group, split)), "no-world-ingress")
    assert "0.0.0.0/0" in violation.message
    narrow = {"ingress": [{"cidrBlocks": ["10.0.0.0/8", "203.0.113.0/24"]}]}
    assert violations_of(plan_with((group, narrow)), "no-world-ingress") == []


def test_production_endpoint_open_through_split_ranges_fails():
    cluster = {
        "endpointPublicAccess": True,
        "publicAccessCidrs": ["0.0.0.0/1", "128.0.0.0/1"],
    }
    plan = plan_with(("eks:index:Cluster", cluster), stack="prod")
    assert violations_of(plan, "eks-endpoint-not-public-in-production")


def test_allowed_public_ingress_does_not_apply_in_production():
    bad = CASES["no-world-ingress"][0]
    config = {"allowedPublicIngress": ["r0"]}
    assert violations_of(
        plan_with((bad[0], dict(bad[1])), stack="prod"), "no-world-ingress", config
    )


def test_policy_config_cannot_drop_a_mandatory_production_stack():
    bad = CASES["eks-endpoint-not-public-in-production"][0]
    plan = plan_with((bad[0], dict(bad[1])), stack="prod")
    rule = "eks-endpoint-not-public-in-production"
    assert violations_of(plan, rule, {"productionStacks": []})


@pytest.mark.parametrize(
    ("resource_type", "props"),
    [
        ("aws:sqs/queue:Queue", {"sqsManagedSseEnabled": False}),
        ("aws:ebs/volume:Volume", {"encrypted": False}),
        ("aws:fsx/lustreFileSystem:LustreFileSystem", {"deploymentType": "SCRATCH_1"}),
        (SSE_V2, {"rules": [{"applyServerSideEncryptionByDefault": {"sseAlgorithm": "none"}}]}),
        ("kubernetes:storage.k8s.io/v1:StorageClass", {"provisioner": "ebs.csi.aws.com"}),
    ],
)
def test_encryption_off_on_any_storage_or_queue_type(resource_type, props):
    assert violations_of(plan_with((resource_type, props)), "storage-encrypted")


@pytest.mark.parametrize(
    ("resource_type", "props"),
    [
        ("aws:s3/bucketAcl:BucketAcl", {"acl": "public-read-write"}),
        ("aws:s3/bucketV2:BucketV2", {"acl": "public-read"}),
        (
            "aws:s3/bucketAclV2:BucketAclV2",
            {
                "accessControlPolicy": {
                    "grants": [
                        {
                            "permission": "READ",
                            "grantee": {"uri": "http://acs.amazonaws.com/groups/global/AllUsers"},
                        }
                    ]
                }
            },
        ),
        (
            "aws:s3/bucketPolicy:BucketPolicy",
            {
                "policy": star("s3:GetObject", "x")
                and iam(
                    {"Effect": "Allow", "Principal": "*", "Action": "s3:GetObject", "Resource": "x"}
                )
            },
        ),
        ("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock", {"blockPublicAcls": False}),
    ],
)
def test_public_bucket_through_any_bucket_resource(resource_type, props):
    assert violations_of(plan_with((resource_type, props)), "no-public-buckets")


@pytest.mark.parametrize(
    "change",
    [{"hostPID": True}, {"hostIPC": True}, {"volumes": [{"name": "h", "hostPath": {"path": "/"}}]}],
)
def test_host_access_in_any_form(change):
    assert violations_of(plan_with((DEPLOYMENT, deployment(**change))), "pods-no-host-access")


def test_capabilities_beyond_baseline_fail_baseline_ones_pass():
    def adding(*caps):
        pod = deployment()
        container = pod["spec"]["template"]["spec"]["containers"][0]
        container["securityContext"] = {"capabilities": {"add": list(caps)}}
        return plan_with((DEPLOYMENT, pod))

    (violation,) = violations_of(adding("CHOWN", "SYS_ADMIN"), "pods-no-host-access")
    assert "['SYS_ADMIN']" in violation.message
    assert violations_of(adding("CHOWN", "DAC_OVERRIDE"), "pods-no-host-access") == []


def test_privileged_and_root_containers_fail():
    privileged = deployment()
    privileged["spec"]["template"]["spec"]["containers"][0]["securityContext"] = {
        "privileged": True
    }
    assert violations_of(plan_with((DEPLOYMENT, privileged)), "pods-no-host-access")
    root = hardened(job())
    root["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["securityContext"] = {
        "runAsNonRoot": True,
        "runAsUser": 0,
    }
    (violation,) = violations_of(plan_with((PYTORCHJOB, root)), "pods-restricted")
    assert "non-root" in violation.message


def test_imdsv1_on_launch_templates_and_node_groups_fails():
    template = (
        "aws:ec2/launchTemplate:LaunchTemplate",
        {"metadataOptions": {"httpTokens": "optional"}},
    )
    group = ("aws:eks/nodeGroup:NodeGroup", {"instanceTypes": ["m6i.large"]})
    default_group = ("eks:index:Cluster", {"skipDefaultNodeGroup": False})
    assert len(violations_of(plan_with(template, group, default_group), "imdsv2-only")) == 3


def test_broad_managed_policies_by_any_attachment():
    role = (ROLE, {"managedPolicyArns": ["arn:aws:iam::aws:policy/AmazonS3FullAccess"]})
    assert violations_of(plan_with(role), "iam-no-broad-managed-policies")


def test_cost_budget_counts_fsx_and_node_groups():
    fsx = (
        "aws:fsx/lustreFileSystem:LustreFileSystem",
        {"storageCapacity": 48000, "perUnitStorageThroughput": 1000, **PERSISTENT_2},
    )  # $0.60/GiB-month
    group = (
        "aws:eks/nodeGroup:NodeGroup",
        {"instanceTypes": ["m6i.4xlarge"], "scalingConfig": {"desiredSize": 2, "maxSize": 10}},
    )
    budget = {"budgetUsdPerHour": 40, "region": "us-east-1"}
    (violation,) = violations_of(plan_with(fsx, group), "cost-budget", budget)
    # 48000 x 0.60 / 730 = 39.45, plus the ceiling's 10 x 0.768 = 7.68 (2 in the floor, 8 above)
    assert "$47.13/hour" in violation.message


def test_unknown_values_in_a_preview_are_violations_not_passes():
    from pulumi_policy.proxy import UNKNOWN_STRING_VALUE

    unknown_policy = (ROLE_POLICY, {"policy": UNKNOWN_STRING_VALUE})
    found = {v.policy for v in check(plan_with(unknown_policy))}
    assert {"no-iam-star-on-star", "iam-no-service-wildcards", "iam-no-not-action"} <= found
    unknown_cidr = (
        "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule",
        {"cidrIpv4": UNKNOWN_STRING_VALUE},
    )
    (violation,) = violations_of(plan_with(unknown_cidr), "no-world-ingress")
    assert "can't be known during preview" in violation.message
    bucket = plan_with(
        ("aws:s3/bucket:Bucket", {}),
        ("aws:s3/bucketPolicy:BucketPolicy", {"policy": UNKNOWN_STRING_VALUE, "_deps": [0]}),
    )
    assert any(
        "can't be known" in v.message for v in violations_of(bucket, "s3-private-and-tls-only")
    )


def test_a_key_arn_unknown_in_preview_still_counts_as_set():
    from pulumi_policy.proxy import UNKNOWN_STRING_VALUE

    cluster = {
        "encryptionConfigKeyArn": UNKNOWN_STRING_VALUE,
        "enabledClusterLogTypes": ALL_LOGS,
        "skipDefaultNodeGroup": True,
        "clusterTags": {"training-platform:data": "cluster"},
        "version": "1.35",  # the control plane is priced by its version's support tier
        "_protect": True,
    }
    assert check(plan_with(("eks:index:Cluster", cluster)), {"region": "us-east-1"}) == []
    prod_sse = (SSE_V2, sse("aws:kms", UNKNOWN_STRING_VALUE))
    assert violations_of(plan_with(prod_sse, stack="prod"), "bucket-kms-in-production") == []


def test_a_job_whose_image_this_update_builds_is_judged_on_everything_else():
    from pulumi_policy.proxy import UNKNOWN_STRING_VALUE

    building = hardened(job(image=UNKNOWN_STRING_VALUE))
    assert violations_of(plan_with((PYTORCHJOB, building)), "images-pinned") == []
    unlabelled = hardened(job(image=UNKNOWN_STRING_VALUE, label=False))
    assert {v.policy for v in check(plan_with((PYTORCHJOB, unlabelled)))} == {"kueue-queue-label"}


def test_unknown_values_the_rule_does_not_read_do_not_matter():
    from pulumi_policy.proxy import UNKNOWN_STRING_VALUE

    rule = (
        "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule",
        {
            "securityGroupId": UNKNOWN_STRING_VALUE,
            "referencedSecurityGroupId": UNKNOWN_STRING_VALUE,
        },
    )
    assert check(plan_with(rule)) == []


# --- the cost ceiling: one pricing path for the plan's table and the budget rule -------------


@pytest.fixture(scope="module")
def hybrid_stack():
    """The dev stack with hybrid nodes: its config and offline plan."""
    from deploy.program import build_platform
    from infra.core.offline import run_offline
    from infra.hybrid.tests.test_hybrid import HYBRID, PRIVATE_ENDPOINT_OFF
    from infra.stack.loading import parse_stack_config
    from tests.plugin import stack_values

    values = stack_values("dev", cluster=PRIVATE_ENDPOINT_OFF)
    values["training-platform:hybrid"] = HYBRID
    config = parse_stack_config(values, "Pulumi.dev.yaml")
    return config, run_offline(lambda: build_platform(config), "dev", values)


def budget_total(plan: Plan) -> float:
    """What the cost-budget rule adds up, read from its message under a budget of a cent."""
    (violation,) = violations_of(
        plan, "cost-budget", {"budgetUsdPerHour": 0.01, "region": "us-west-2"}
    )
    return float(re.search(r"cost ceiling \$([\d,.]+)/hour", violation.message)[1].replace(",", ""))


@pytest.mark.parametrize("stack", ["dev", "prod", "hybrid"])
def test_the_budget_rule_adds_up_what_the_plans_cost_table_does(stack, request, hybrid_stack):
    from infra.integrations import plan_cost

    plan = hybrid_stack[1] if stack == "hybrid" else request.getfixturevalue(f"{stack}_plan")
    assert budget_total(plan) == round(plan_cost("us-west-2", plan).total_per_hour, 2)


def test_the_budget_rule_counts_the_hybrid_lines(hybrid_stack, dev_plan):
    """The hybrid section adds the gateway, its address and the machines' vCPUs to the table;
    the budget rule's total moves by exactly those lines."""
    from infra.integrations import plan_cost

    dev = {line.item for line in plan_cost("us-west-2", dev_plan).lines}
    added = [line for line in plan_cost("us-west-2", hybrid_stack[1]).lines if line.item not in dev]
    assert {line.item for line in added} == {
        "EC2 instance hybrid-gateway",
        "Elastic IP hybrid-gateway",
        "EKS hybrid nodes",
    }
    moved = budget_total(hybrid_stack[1]) - budget_total(dev_plan)
    assert moved == pytest.approx(sum(line.usd_per_hour for line in added), abs=0.01)


PROD_INTERFACE_ENDPOINTS = (
    "ec2",
    "ecr-api",
    "ecr-dkr",
    "eks",
    "eks-auth",
    "elasticfilesystem",
    "sqs",
    "ssm",
)


def test_every_priced_resource_is_costed_at_its_ceiling(prod_plan):
    """prod's lines, figured from the price file (us-west-2) by hand: nodes with their gp3 disks
    (the cpu pool's at 600 MiB/s, 475 above gp3's included 125), the system node group at
    desiredSize in the floor and up to maxSize above it, FSx per GiB-month, NAT gateways and their
    addresses, KMS keys, the control plane, and the gp3 quota and SSH load balancers of carol's
    DevServers."""
    from infra.core.catalog import HOURS_PER_MONTH, load_prices
    from infra.integrations import plan_cost

    prices = load_prices("us-west-2")

    def nodes(count, instance_type, disk_gib, mibps=125):
        gp3 = disk_gib * prices.usd("ebsGp3PerGibMonth") / HOURS_PER_MONTH
        gp3 += (mibps - 125) * prices.usd("ebsGp3PerMibpsMonth") / HOURS_PER_MONTH
        return count * (prices.instance(instance_type) + gp3)

    expected = {
        "EKS control plane cluster": 0.10,
        **{f"NAT gateway network-{i}": 0.045 for i in range(3)},
        # Every public IPv4 address bills per hour since 2024-02-01: each NAT's Elastic IP.
        **{f"Elastic IP network-nat-{i}": 0.005 for i in range(3)},
        # PrivateLink: an interface endpoint bills per AZ-hour, $0.01 here; the S3 gateway is free.
        **{f"VPC endpoint network-{service}": 3 * 0.01 for service in PROD_INTERFACE_ENDPOINTS},
        "VPC endpoint network-s3": 0.0,
        "node group cluster-system": nodes(3, "m6i.xlarge", 50),
        "node group cluster-system to maxSize": nodes(6 - 3, "m6i.xlarge", 50),
        "FSx for Lustre fsx": 4800 * 0.210 / HOURS_PER_MONTH,
        # $1 a month each: the cluster's secrets key and the bucket's SSE-KMS key.
        "KMS key cluster-secrets": 1 / HOURS_PER_MONTH,
        "KMS key training-bucket-sse": 1 / HOURS_PER_MONTH,
        "EC2 instance hybrid-gateway": None,  # prod has no hybrid section
        "gpu-small": nodes(4, "g5.12xlarge", 200),
        "gpu-large": nodes(16, "p4d.24xlarge", 200),
        "cpu": nodes(20, "m6i.4xlarge", 100, mibps=600),
        # carol's DevServer homes at her quota (devServers.users[].quota.homeGib, default 500).
        "storage quota dev-carol/devservers": 500
        * prices.usd("ebsGp3PerGibMonth")
        / HOURS_PER_MONTH,
        # Her 2 servers may each have a Classic LB in prod's 3 public subnets, an address in each.
        "SSH load balancers dev-carol/devservers": 2 * (0.025 + 3 * 0.005),
    }
    cost = plan_cost("us-west-2", prod_plan)
    assert cost.unpriced == [] and cost.unpriced_types == []
    assert {line.item: pytest.approx(line.usd_per_hour) for line in cost.lines} == {
        item: usd for item, usd in expected.items() if usd is not None
    }


def test_the_hybrid_gateway_is_costed_and_its_type_priced_in_config(hybrid_stack, tmp_path):
    """Figured by hand from us-west-2's price file: the gateway (c6i.large, 8 GiB gp3 root
    volume), its Elastic IP, and EKS's per-vCPU-hour charge for HYBRID's 16 + 8 vCPUs."""
    from infra.core.catalog import HOURS_PER_MONTH, load_prices
    from infra.core.config import ConfigError
    from infra.core.declared import declared_in
    from infra.integrations import plan_cost
    from infra.jobs.usage import usage_lines
    from infra.stack.loading import load_stack_file

    config, plan = hybrid_stack
    prices = load_prices("us-west-2")
    cost = plan_cost("us-west-2", plan)
    lines = {line.item: (line.detail, line.usd_per_hour) for line in cost.lines}
    hybrid = ("EC2 instance hybrid-gateway", "Elastic IP hybrid-gateway", "EKS hybrid nodes")
    assert {item: lines[item] for item in hybrid} == {
        "EC2 instance hybrid-gateway": (
            "c6i.large, 8 GiB gp3",
            pytest.approx(0.085 + 8 * 0.08 / HOURS_PER_MONTH),
        ),
        "Elastic IP hybrid-gateway": ("public IPv4 address", 0.005),
        "EKS hybrid nodes": ("2 machines, 24 vCPU at $0.02/vCPU-hour (first tier)", 24 * 0.020),
    }
    assert prices.instance("c6i.large") == 0.085 and prices.usd("ebsGp3PerGibMonth") == 0.08
    usage = {u.item: u.formula for u in usage_lines(cost, declared_in(plan))}
    assert usage["hybrid traffic out of the gateway"] == "$0.09/GB"
    import yaml

    from infra.hybrid.tests.test_hybrid import HYBRID, PRIVATE_ENDPOINT_OFF
    from tests.plugin import stack_values

    pools = [  # Ireland prices only the types the two stacks use: no c6i
        {**p, "availabilityZone": "eu-west-1a"} if p.get("efa") else p
        for p in stack_values("dev")["training-platform:nodePools"]
    ]
    values = {
        **stack_values("dev", nodePools=pools, cluster=PRIVATE_ENDPOINT_OFF),
        "aws:region": "eu-west-1",
    }
    values["training-platform:hybrid"] = HYBRID
    (tmp_path / "Pulumi.ireland.yaml").write_text(yaml.safe_dump({"config": values}))
    with pytest.raises(ConfigError) as refused:
        load_stack_file("ireland", tmp_path)
    assert "training-platform:hybrid.gatewayInstanceType: c6i.large has no eu-west-1 price" in str(
        refused.value
    )


def test_a_node_pool_without_a_node_limit_has_no_cost_ceiling():
    unlimited = pool(["p5.48xlarge"], {"cpu": "192"}, GPU_TAINT, name="big")
    (violation,) = violations_of(
        plan_with((NODEPOOL, unlimited)), "cost-budget", {"region": "us-east-1"}
    )
    assert violation.message == "the cost has no ceiling: big (no limits.nodes)"


def test_storage_growth_past_the_budget_fails_the_plan_naming_the_storage():
    from tests.plugin import plan_of

    budget = {"budgetUsdPerHour": 450, "region": "us-west-2"}  # prod costs about $392/hour
    assert violations_of(plan_of("prod"), "cost-budget", budget) == []
    grown = plan_of("prod", storage={"fsx": {"storageCapacityGib": 480_000}})  # 100x
    (violation,) = violations_of(grown, "cost-budget", budget)
    assert "exceeds the budget $450.00/hour" in violation.message
    assert "FSx for Lustre fsx $138.08" in violation.message, violation.message


def test_allowed_public_ingress_names_are_what_the_program_opens(hybrid_stack):
    """public_ingress_resources (what stack config lets policy.allowedPublicIngress name) is
    what no-world-ingress flags in the program's own plan."""
    from infra.stack.cross_references import public_ingress_resources

    config, plan = hybrid_stack
    flagged = {v.urn.rsplit("::", 1)[-1] for v in violations_of(plan, "no-world-ingress")}
    assert flagged == set(public_ingress_resources(config)) == {"hybrid-gateway"}
    assert (
        violations_of(plan, "no-world-ingress", {"allowedPublicIngress": ["hybrid-gateway"]}) == []
    )


# --- program edits that make training containers privileged or root -------------------------


def job_inputs(plan: Plan, name: str) -> tuple[str, dict]:
    job = next(r for r in plan.resources if r.type in (PYTORCHJOB, MPIJOB) and r.name == name)
    return job.type, copy.deepcopy(job.inputs)


def pods(inputs: dict) -> list[dict]:
    spec = inputs["spec"]
    replicas = spec.get("pytorchReplicaSpecs") or spec["mpiReplicaSpecs"]
    return [replica["template"]["spec"] for replica in replicas.values()]


def init_context(pod: dict) -> dict:
    return pod["initContainers"][0]["securityContext"]


def main_context(pod: dict) -> dict:
    return pod["containers"][0]["securityContext"]


# Upstream's rules: kubernetes/pod-security-admission policy/check_runAsNonRoot.go,
# check_runAsUser.go, check_allowPrivilegeEscalation.go and check_capabilities_restricted.go
# (restricted: drop ALL, add only NET_BIND_SERVICE) hold containers AND initContainers to them.
PROGRAM_EDITS = {
    "init container escalates": (
        lambda pod: init_context(pod).update(allowPrivilegeEscalation=True),
        "checkpoint-dir must set allowPrivilegeEscalation: false",
    ),
    "init container keeps the runtime's default capabilities": (
        lambda pod: init_context(pod).pop("capabilities"),
        "checkpoint-dir must drop ALL capabilities",
    ),
    "root init container adds SETUID": (
        lambda pod: init_context(pod)["capabilities"]["add"].append("SETUID"),
        "checkpoint-dir runs as root",
    ),
    "a second root init container": (
        lambda pod: pod["initContainers"].append(
            {"name": "setup", "image": "x", "securityContext": {"runAsUser": 0}}
        ),
        "container setup must drop ALL capabilities",  # root, as the exception's shape allows
    ),
    "trainer adds capabilities": (
        lambda pod: main_context(pod)["capabilities"].update(add=["CHOWN", "SETUID"]),
        "container pytorch adds capabilities ['CHOWN', 'SETUID']",
    ),
    "trainer runs as root": (
        lambda pod: pod["securityContext"].update(runAsUser=0),
        "container pytorch must run as non-root",
    ),
    "trainer is privileged": (
        lambda pod: main_context(pod).update(privileged=True),
        "container pytorch is privileged",
    ),
}


@pytest.mark.parametrize("edit", sorted(PROGRAM_EDITS))
def test_a_program_edit_making_training_containers_root_or_privileged_fails(prod_plan, edit):
    change, expected = PROGRAM_EDITS[edit]
    kind, inputs = job_inputs(prod_plan, "job-gpt-large")  # checkpoints on FSx: its init container
    assert check(plan_with((kind, copy.deepcopy(inputs)))) == []
    for pod in pods(inputs):
        change(pod)
    messages = [v.message for v in check(plan_with((kind, inputs)))]
    assert any(expected in m for m in messages), messages


def test_mpi_workers_are_held_to_the_same_rules(prod_plan):
    kind, inputs = job_inputs(prod_plan, "job-gpt-large-mpi")
    for pod in pods(inputs):
        main_context(pod)["capabilities"]["add"] = ["SYS_CHROOT"]
    messages = {v.message for v in violations_of(plan_with((kind, inputs)), "pods-restricted")}
    assert messages == {
        "container launcher adds capabilities ['SYS_CHROOT']; allowed: NET_BIND_SERVICE",
        "container worker adds capabilities ['SYS_CHROOT']; allowed: NET_BIND_SERVICE",
    }
