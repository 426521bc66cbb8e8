"""Policy pack: every rule fails a resource that breaks it and passes one that keeps it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from infra.offline import Plan, RecordedResource
from policies.offline import check
from policies.rules import POLICIES
from tests.conftest import ROOT

NODEPOOL = "kubernetes:karpenter.sh/v1:NodePool"
NODECLASS = "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass"
PYTORCHJOB = "kubernetes:kubeflow.org/v1:PyTorchJob"


def plan_with(*resources: tuple[str, dict], stack: str = "dev") -> Plan:
    recorded = []
    for i, (type_, inputs) in enumerate(resources):
        urn = f"urn:pulumi:{stack}::training-platform::{type_}::r{i}"
        deps = [recorded[d].urn for d in inputs.pop("_deps", [])]
        recorded.append(RecordedResource(urn, type_, f"r{i}", "", "", deps, inputs, True))
    return Plan(stack=stack, resources=recorded)


def job(image="repo@sha256:" + "a" * 64, label=True, shm=True, annotate=True) -> dict:
    pod = {
        "containers": [
            {
                "name": "pytorch",
                "image": image,
                "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}] if shm else [],
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


def star(action, resource):
    return json.dumps({"Statement": [{"Effect": "Allow", "Action": action, "Resource": resource}]})


ALL_LOGS = ["api", "audit", "authenticator", "controllerManager", "scheduler"]
CASES = {
    "storage-encrypted": (
        ("aws:efs/fileSystem:FileSystem", {"encrypted": False}),
        ("aws:efs/fileSystem:FileSystem", {"encrypted": True}),
    ),
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
    "karpenter-imdsv2": (
        (
            NODECLASS,
            {"spec": {"metadataOptions": {"httpTokens": "optional", "httpPutResponseHopLimit": 2}}},
        ),
        (
            NODECLASS,
            {"spec": {"metadataOptions": {"httpTokens": "required", "httpPutResponseHopLimit": 1}}},
        ),
    ),
    "gpu-nodepool-limits": (
        (NODEPOOL, gpu_pool({"cpu": "100"})),
        (NODEPOOL, gpu_pool({"nodes": "1", "nvidia.com/gpu": "8"})),
    ),
    "kueue-queue-label": ((PYTORCHJOB, job(label=False)), (PYTORCHJOB, job())),
    "training-pod-hygiene": ((PYTORCHJOB, job(shm=False, annotate=False)), (PYTORCHJOB, job())),
    "images-pinned": ((PYTORCHJOB, job(image="trainer:latest")), (PYTORCHJOB, job())),
    "no-iam-star-on-star": (
        ("aws:iam/rolePolicy:RolePolicy", {"policy": star("*", "*")}),
        ("aws:iam/rolePolicy:RolePolicy", {"policy": star("s3:GetObject", "*")}),
    ),
    "ecr-scan-on-push": (
        ("aws:ecr/repository:Repository", {"imageScanningConfiguration": {"scanOnPush": False}}),
        ("aws:ecr/repository:Repository", {"imageScanningConfiguration": {"scanOnPush": True}}),
    ),
}


def violations_of(plan: Plan, rule: str, config=None) -> list:
    return [v for v in check(plan, config) if v.policy == rule]


def test_every_rule_has_cases_and_is_mandatory():
    names = {p.name for p in POLICIES}
    assert set(CASES) | {"s3-private-and-tls-only", "cost-budget"} == names
    assert {p.enforcement_level.value for p in POLICIES} == {"mandatory"}


@pytest.mark.parametrize("rule", sorted(CASES))
def test_rule_fails_the_breaking_resource_and_passes_the_good_one(rule):
    bad, good = CASES[rule]
    stack = "prod" if rule == "eks-endpoint-not-public-in-production" else "dev"
    assert violations_of(plan_with((bad[0], dict(bad[1])), stack=stack), rule)
    assert violations_of(plan_with((good[0], dict(good[1])), stack=stack), rule) == []


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
    tls = json.dumps({"Statement": [{"Condition": {"Bool": {"aws:SecureTransport": "false"}}}]})
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
    assert "$440.32/hour exceeds the budget $300.00/hour" in violation.message


def test_cost_budget_prices_in_the_stack_region_and_names_what_it_cannot_price():
    eight = (NODEPOOL, gpu_pool({"nodes": "8", "nvidia.com/gpu": "64"}))  # 8 x p5.48xlarge
    provider = ("pulumi:providers:aws", {"region": "eu-west-1"})
    (violation,) = violations_of(plan_with(eight, provider), "cost-budget")
    assert "p5.48xlarge has no eu-west-1 price in infra/catalog/prices/eu-west-1.yaml" in (
        violation.message
    )
    subnet = ("aws:ec2/subnet:Subnet", {"availabilityZone": "eu-central-1a"})
    (violation,) = violations_of(plan_with(eight, subnet), "cost-budget")
    assert "p5.48xlarge has no eu-central-1 price" in violation.message
    (violation,) = violations_of(plan_with(eight), "cost-budget")
    assert 'set "region" in the policy pack config' in violation.message


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_both_stacks_are_clean(stack, request):
    assert check(request.getfixturevalue(f"{stack}_plan")) == []


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

    from tests.conftest import stack_values

    values = stack_values("prod", **sections)
    (tmp_path / "Pulumi.prod.yaml").write_text(yaml.safe_dump({"config": values}))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "infra.plan",
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
