"""The bill splits as the platform's figures do: every resource that costs money carries the stack
and the cluster, and the pool or namespace it serves; the stack activates those keys as cost
allocation tags where it says it may (infra/billing)."""

import pytest

from deploy.day_two import consequences
from devservers.kube import settings_from_env
from devservers.render import LOAD_BALANCER_TAGS, children
from devservers.tests.test_dev_servers_component import operator_env
from devservers.tests.test_devservers_crds import gpu_flavor
from devservers.tests.test_devservers_render import KEY, by_kind, server
from infra.core.declared import dig
from infra.core.offline import Plan
from infra.core.tags import (
    CLUSTER_TAG,
    COST_ALLOCATION_TAGS,
    NAMESPACE_TAG,
    POOL_TAG,
    STACK_TAG,
    SYSTEM_POOL,
)
from infra.hybrid.tests.test_hybrid import HYBRID, PRIVATE_ENDPOINT_OFF
from infra.integrations import FACTS, plan_steps
from infra.stack.loading import parse_stack_config
from infra.storage.block_storage import HOME_STORAGE_CLASS
from tests.plugin import plan_of, stack_values

COST_ALLOCATION_TAG = "aws:costexplorer/costAllocationTag:CostAllocationTag"
NODE_CLASS = "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass"
NODE_POOL = "kubernetes:karpenter.sh/v1:NodePool"
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
STORAGE_CLASS = "kubernetes:storage.k8s.io/v1:StorageClass"
# Costed kinds whose bill is not theirs to tag, and where it is tagged instead.
BILLED_ELSEWHERE = {
    "kubernetes:core/v1:PersistentVolumeClaim": "bills as the EFS or FSx file system it mounts",
    "kubernetes:kueue.x-k8s.io/v1beta2:ResourceFlavor": "bills as the nodes of its pool",
    "aws:efs/backupPolicy:BackupPolicy": "bills as AWS Backup storage of EFS's automatic "
    "backups, recovery points in AWS's own vault that no stack tags (the bill shows them under "
    "AWS Backup, by file system)",
}


def costed(plan: Plan) -> list:
    return [
        r
        for r in plan.resources
        if r.custom and (kind := FACTS.kind(r.type)) and (kind.price or kind.usage)
    ]


def stack_tagged(tags: dict | None, plan: Plan) -> bool:
    return (tags or {}).get(STACK_TAG) == plan.stack and CLUSTER_TAG in (tags or {})


def untagged(resource, plan: Plan) -> str | None:
    """Why `resource`'s bill does not split by the stack's tags; None when it does."""
    inputs = resource.inputs
    if resource.type in BILLED_ELSEWHERE or resource.type == NODE_POOL:
        return None  # a pool's nodes: checked on its EC2NodeClass
    if resource.type == NODE_CLASS:
        tags = dig(inputs, "spec", "tags")
        pool = dig(inputs, "metadata", "name")
        ok = stack_tagged(tags, plan) and tags.get(POOL_TAG) == pool
        return None if ok else f"EC2NodeClass {pool}: {tags}"
    if resource.type == NODE_GROUP:
        (template,) = plan.of_type(LAUNCH_TEMPLATE)
        specs = {s["resourceType"]: s["tags"] for s in template.inputs["tagSpecifications"]}
        ok = set(specs) == {"instance", "volume"} and all(
            stack_tagged(tags, plan) and tags.get(POOL_TAG) == SYSTEM_POOL
            for tags in specs.values()
        )
        return None if ok else f"system nodes' launch template tags {specs}"
    if resource.type == "kubernetes:core/v1:ResourceQuota":  # DevServer homes
        home = next(
            r
            for r in plan.of_type(STORAGE_CLASS)
            if dig(r.inputs, "metadata", "name") == HOME_STORAGE_CLASS
        )
        tags = dict(
            value.split("=", 1)
            for key, value in home.inputs["parameters"].items()
            if key.startswith("tagSpecification_")
        )
        ok = stack_tagged(tags, plan) and tags.get(NAMESPACE_TAG) == "{{ .PVCNamespace }}"
        return None if ok else f"home volumes' tags {tags}"
    if resource.type == "kubernetes:core/v1:Service":
        kind = dig(inputs, "spec", "type") or "ClusterIP"
        return None if kind != "LoadBalancer" else f"Service {resource.name}: a load balancer"
    return None if stack_tagged(inputs.get("tags"), plan) else f"{resource.type} {resource.name}"


@pytest.fixture(
    scope="module",
    params=["dev", "prod", "hybrid"],
)
def stack(request) -> Plan:
    if request.param == "hybrid":
        return plan_of("dev", hybrid=HYBRID, cluster=PRIVATE_ENDPOINT_OFF)
    return plan_of(request.param)


def test_every_resource_that_bills_carries_the_stack_and_what_it_serves(stack):
    found = costed(stack)
    assert {NODE_CLASS, NODE_GROUP, "aws:s3/bucket:Bucket"} <= {r.type for r in found}
    assert [why for r in found if (why := untagged(r, stack))] == []


def test_the_tags_are_activated_only_where_the_stack_says_it_may():
    assert plan_of("dev").of_type(COST_ALLOCATION_TAG) == []
    plan = plan_of("dev", billing={"activateCostAllocationTags": True})
    activated = plan.of_type(COST_ALLOCATION_TAG)
    assert sorted(r.inputs["tagKey"] for r in activated) == sorted(COST_ALLOCATION_TAGS)
    # Account-wide: a stack that goes leaves them active for the others billed there.
    assert all(r.inputs["status"] == "Active" and r.retain_on_delete for r in activated)


def test_an_ssh_load_balancer_bills_under_the_stack_and_its_users_namespace():
    """The operator's SSH Service, rendered with the settings the dev plan gives the operator
    (DevServers created by users, not by pulumi: no plan lists their balancers)."""
    plan = plan_of("dev", devServers={"sshLoadBalancerCidrs": ["203.0.113.0/24"]})
    settings = settings_from_env(operator_env(plan))
    lb = server(ssh={"serviceType": "LoadBalancer", "authorizedKeys": [KEY]})
    service = by_kind(children(lb, gpu_flavor(), settings))["Service/box-ssh"]
    assert service["metadata"]["annotations"][LOAD_BALANCER_TAGS] == (
        f"{STACK_TAG}=dev,{CLUSTER_TAG}=tp-dev,{NAMESPACE_TAG}=dev-alice"
    )


def test_the_plan_says_when_activation_can_work_and_what_dropping_it_leaves():
    before = plan_of("dev")
    after = plan_of("dev", billing={"activateCostAllocationTags": True})
    config = parse_stack_config(
        stack_values("dev", billing={"activateCostAllocationTags": True}), "Pulumi.dev.yaml"
    )
    notes = consequences(plan_steps(before, after), config, "dev", None, None).notes
    (note,) = [n for n in notes if n.startswith("billing:")]
    assert "payer account" in note and "a day after the stack's first pulumi up" in note
    back = parse_stack_config(stack_values("dev"), "Pulumi.dev.yaml")
    notes = consequences(plan_steps(after, before), back, "dev", None, None).notes
    (note,) = [n for n in notes if n.startswith("billing:")]
    assert "stay active (retainOnDelete" in note
