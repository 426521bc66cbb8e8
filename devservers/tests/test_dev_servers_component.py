"""The DevServers component in the offline plan: CRDs, operator, least-privilege RBAC, flavors,
user namespaces with queue, quota, shared claim and an EKS access entry."""

import json
import re
from dataclasses import replace

import kubernetes_validate
import pytest
import yaml

from deploy.plan import cost_rows
from devservers.api import crds
from devservers.cli import parse_args, server_manifest
from devservers.render import stateful_set
from infra.core.catalog import HOURS_PER_MONTH, load_prices
from infra.core.declared import declared_in
from infra.core.tests.crd_schema import conformance_errors
from infra.integrations import plan_cost, stack_cost
from infra.operators.tests.test_services import kueue_config
from infra.storage.facts import STORAGE_CLASS
from tests.plugin import ROOT, hadolint, plan_of, stack_values

RBAC = "kubernetes:rbac.authorization.k8s.io/v1"
DEV_SERVERS = "training-platform:devServers"


def named(plan, type_: str) -> dict[str, dict]:
    return {r.name: r.inputs for r in plan.of_type(type_)}


def test_the_crds_are_installed_as_written_in_devservers_crds(dev_plan):
    installed = named(dev_plan, "kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition")
    mine = {n: i for n, i in installed.items() if n.startswith("dev-servers-crd-")}
    assert {i["metadata"]["name"] for i in mine.values()} == {c["metadata"]["name"] for c in crds()}
    for crd in crds():
        inputs = installed[f"dev-servers-crd-{crd['spec']['names']['plural']}"]
        assert inputs["spec"]["versions"][0]["schema"] == crd["spec"]["versions"][0]["schema"]


def test_flavors_come_from_stack_config_with_their_pools_placement(dev_plan):
    flavors = named(dev_plan, "kubernetes:dev.training-platform.io/v1alpha1:DevServerFlavor")
    gpu4 = flavors["dev-servers-flavor-gpu-4"]
    assert conformance_errors(gpu4) == []
    assert gpu4["spec"]["nodeSelector"] == {
        "training-platform.node-restriction.kubernetes.io/pool": "gpu-small"
    }
    assert gpu4["spec"]["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert gpu4["spec"]["resources"]["limits"] == {
        "cpu": "43",
        "memory": "163Gi",
        "nvidia.com/gpu": "4",
    }
    assert flavors["dev-servers-flavor-cpu-small"]["spec"]["tolerations"] == []


def test_the_operator_runs_on_system_nodes_as_a_restricted_pod_of_its_own_image(dev_plan):
    deployment = dev_plan.one("kubernetes:apps/v1:Deployment", "dev-servers-operator").inputs
    kubernetes_validate.validate(deployment, "1.34", strict=True)
    pod = deployment["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"training-platform/node-role": "system"}
    assert {"key": "CriticalAddonsOnly", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert pod["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["containers"]
    assert "@sha256:" in container["image"] and "/devserver-operator@" in container["image"]
    assert "--namespace=dev-*" in container["args"]
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert deployment["spec"]["replicas"] == 1
    repository = dev_plan.one("aws:ecr/repository:Repository", "dev-servers-operator-image").inputs
    assert repository["imageScanningConfiguration"] == {"scanOnPush": True}
    assert repository["forceDelete"] is False
    image = dev_plan.one("docker-build:index:Image", "dev-servers-operator-image-operator").inputs
    # Paths as the engine resolves them, from the program's working directory (infra/).
    assert image["context"] == {"location": "../devservers"}
    assert image["dockerfile"] == {"location": "../devservers/Dockerfile"}
    assert image["target"] == "operator"


def operator_env(plan) -> dict[str, str]:
    deployment = plan.one("kubernetes:apps/v1:Deployment", "dev-servers-operator").inputs
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in container["env"]}


def test_the_operator_is_told_the_allowed_images_and_its_flavors_prices(dev_plan):
    env = operator_env(dev_plan)
    # The ECR repository pulumi up builds the trainer into, in the (mocked) account.
    assert env["DEVSERVERS_ALLOWED_IMAGES"] == (
        "123456789012.dkr.ecr.us-west-2.amazonaws.com/tp-dev/trainer"
    )
    assert env["DEVSERVERS_REQUIRE_IMAGE_DIGEST"] == "false"
    # Every instance type the flavors' pools (cpu, gpu-small, gpu-large) launch, priced.
    prices = load_prices("us-west-2")
    types = ["g5.12xlarge", "m6i.2xlarge", "m6i.4xlarge", "p4d.24xlarge"]
    assert json.loads(env["DEVSERVERS_PRICES"]) == {t: prices.instance(t) for t in types}
    prebuilt = "registry.example.com/ml/trainer@sha256:" + "b" * 64
    edited = operator_env(
        plan_of(
            "dev",
            image={"uri": prebuilt},
            devServers={
                "allowedImageRegistries": ["ghcr.io/my-org", "docker.io/library"],
                "requireImageDigest": True,
            },
        )
    )
    assert edited["DEVSERVERS_ALLOWED_IMAGES"] == (
        "registry.example.com/ml/trainer,ghcr.io/my-org,docker.io/library"
    )
    assert edited["DEVSERVERS_REQUIRE_IMAGE_DIGEST"] == "true"


def test_rbac_is_least_privilege(dev_plan):
    roles = named(dev_plan, f"{RBAC}:ClusterRole")
    every_rule = [
        r for name, i in roles.items() if name.startswith("dev-servers") for r in i["rules"]
    ]
    assert all("*" not in r["verbs"] and "*" not in r["resources"] for r in every_rule)
    # Cluster-wide the operator only reads; it writes through RoleBindings in dev-* namespaces.
    cluster_wide = roles["dev-servers-operator-cluster"]["rules"]
    assert {v for r in cluster_wide for v in r["verbs"]} <= {"get", "list", "watch"}
    bindings = named(dev_plan, f"{RBAC}:RoleBinding")
    operator_namespaces = {
        b["metadata"]["namespace"]
        for n, b in bindings.items()
        if n.startswith("dev-servers-") and b["roleRef"]["name"] == "devserver-operator-namespaced"
    }
    assert operator_namespaces == {"dev-alice", "dev-bob"}
    alice = bindings["dev-servers-alice-user"]
    assert alice["metadata"]["namespace"] == "dev-alice"
    assert alice["subjects"] == [
        {"kind": "Group", "name": "dev:alice", "apiGroup": "rbac.authorization.k8s.io"}
    ]
    user_rules = roles["dev-servers-user"]["rules"]
    assert {"pods/exec", "pods/portforward"} <= {res for r in user_rules for res in r["resources"]}
    # Secrets: the operator makes and reads the servers' host keys; users see only public halves.
    operator_rules = roles["dev-servers-operator-namespaced"]["rules"]
    secrets = [r for r in operator_rules + cluster_wide if "secrets" in r["resources"]]
    assert [(r["resources"], r["verbs"]) for r in secrets] == [(["secrets"], ["get", "create"])]
    assert not any("secrets" in r["resources"] for r in user_rules)
    # Users' only cluster-wide right: reading the flavor catalog.
    cluster_bindings = named(dev_plan, f"{RBAC}:ClusterRoleBinding")
    for_users = [
        b for b in cluster_bindings.values() if any(s["kind"] == "Group" for s in b["subjects"])
    ]
    assert [
        b["roleRef"]["name"] for b in for_users if b["metadata"]["name"].startswith("devserver")
    ] == ["devserver-flavor-reader"]
    assert roles["dev-servers-flavor-reader"]["rules"][0]["verbs"] == ["get", "list"]


def test_each_user_gets_a_restricted_namespace_queue_quota_claim_and_access_entry(dev_plan):
    namespaces = named(dev_plan, "kubernetes:core/v1:Namespace")
    alice = namespaces["dev-servers-ns-alice"]["metadata"]
    assert alice["name"] == "dev-alice"
    assert alice["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert alice["labels"]["training-platform/team"] == "team-a"
    assert alice["labels"]["training-platform/queue-access"] == "true"
    # bob's team has its own ClusterQueue, which selects the team's namespaces by label.
    assert (
        namespaces["dev-servers-ns-bob"]["metadata"]["labels"]["training-platform/queue-access"]
        == "false"
    )
    queues = named(dev_plan, "kubernetes:kueue.x-k8s.io/v1beta2:LocalQueue")
    assert queues["dev-servers-lq-alice"]["spec"] == {"clusterQueue": "platform"}
    assert queues["dev-servers-lq-bob"]["spec"] == {"clusterQueue": "team-research"}
    quota = dev_plan.one("kubernetes:core/v1:ResourceQuota", "dev-servers-quota-bob").inputs
    assert quota["spec"]["hard"] == {
        "count/devservers.dev.training-platform.io": "2",
        "requests.nvidia.com/gpu": "16",
        # The storage of gp3 claims (homes), by kubernetes' quota key for a storage class
        # (pkg/quota/v1/evaluator/core/persistent_volume_claims.go, V1ResourceByStorageClass).
        "gp3-home.storageclass.storage.k8s.io/requests.storage": "500Gi",
        # Derived: two servers within 16 GPUs ask for most as two a100-8 (86 vCPU, 979 GiB).
        "requests.cpu": "172",
        "limits.cpu": "172",
        "requests.memory": "1958Gi",
        "limits.memory": "1958Gi",
    }
    claims = named(dev_plan, "kubernetes:core/v1:PersistentVolumeClaim")
    assert claims["efs-dev-alice"]["metadata"]["name"] == "efs-shared"
    entries = named(dev_plan, "aws:eks/accessEntry:AccessEntry")
    entry = entries["dev-servers-access-bob"]
    assert entry["principalArn"] == "arn:aws:iam::123456789012:user/bob"
    assert entry["kubernetesGroups"] == ["dev:bob", "dev:users"] and entry["type"] == "STANDARD"
    associations = dev_plan.of_type("aws:eks/accessPolicyAssociation:AccessPolicyAssociation")
    assert not [a for a in associations if "dev-servers" in a.name]


def cpu_and_memory(plan, user: str) -> tuple[str, str]:
    hard = plan.one("kubernetes:core/v1:ResourceQuota", f"dev-servers-quota-{user}").inputs
    hard = hard["spec"]["hard"]
    assert (hard["requests.cpu"], hard["requests.memory"]) == (
        hard["limits.cpu"],
        hard["limits.memory"],
    )
    return hard["requests.cpu"], hard["requests.memory"]


def test_a_users_cpu_and_memory_quota_admits_what_their_servers_and_gpus_allow(dev_plan):
    """alice: three servers within 8 GPUs. By hand, from the dev flavors (GPUs, vCPU, GiB):
    cpu-small (0, 4, 16), gpu-1 (1, 8, 40), gpu-4 (4, 43, 163), a100-8 (8, 86, 979). Most vCPU:
    a100-8 and two cpu-small, 86 + 4 + 4 = 94 (two gpu-4 and a cpu-small make 90); most memory:
    the same three, 979 + 16 + 16 = 1011 GiB. Without a GPU quota: three cpu-small."""
    assert cpu_and_memory(dev_plan, "alice") == ("94", "1011Gi")
    no_gpus = plan_of(
        "dev",
        devServers={
            "users": [
                {
                    "name": "alice",
                    "email": "alice@example.com",
                    "team": "team-a",
                    "quota": {"servers": 3, "gpus": 0},
                    "iamPrincipalArn": "arn:aws:iam::123456789012:role/dev-alice",
                },
                {
                    "name": "bob",
                    "email": "bob@example.com",
                    "team": "research",
                    "quota": {"servers": 2, "gpus": 16, "cpu": 40, "memoryGib": 200},
                    "iamPrincipalArn": "arn:aws:iam::123456789012:user/bob",
                },
            ]
        },
    )
    assert cpu_and_memory(no_gpus, "alice") == ("12", "48Gi")
    assert cpu_and_memory(no_gpus, "bob") == ("40", "200Gi")  # as set


def test_kueue_admits_statefulsets_as_pod_groups(dev_plan):
    config = kueue_config(dev_plan)
    # Kueue's names (KUEUE_CHART): `statefulset` admits a StatefulSet as one pod group, gated
    # via `pod`.
    assert {"pod", "statefulset"} <= set(config["integrations"]["frameworks"])


def test_disabled_dev_servers_add_nothing():
    plan = plan_of("dev", devServers={"enabled": False})
    assert not [r for r in plan.resources if r.name.startswith("dev-servers")]


def test_the_operator_dockerfile_passes_hadolint():
    assert hadolint(ROOT / "devservers" / "Dockerfile") == ""


def test_make_demo_renders_a_devserver_for_dev(tmp_path, capsys):
    from devservers.demo import main

    out = tmp_path / "dev.yaml"
    assert main(["--stack", "dev", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "DevServer dev-alice/demo" in printed and "StatefulSet/demo: 2 pods" in printed
    assert "idle for 2h: no SSH session and GPUs at or below 5%; its users warned 10m" in printed
    server, *children = yaml.safe_load_all(out.read_text())
    assert conformance_errors(server) == []
    for child in children:
        kubernetes_validate.validate(child, "1.34", strict=True)


def test_the_plan_summary_lists_flavors_and_users():
    from deploy.plan import dev_server_rows
    from infra.stack.loading import load_stack_file

    rows = "\n".join(dev_server_rows(load_stack_file("dev")))
    assert "a100-8     gpu-large     8    86         979" in rows
    assert "bob    dev-bob    team-research            2        16" in rows


def test_every_built_in_object_of_the_component_validates_against_kubernetes(dev_plan):
    component = dev_plan.one("training-platform:infra:DevServers").urn
    built_in = [
        r.inputs
        for r in dev_plan.resources
        if r.parent == component
        and r.type.startswith("kubernetes:")
        and not r.type.startswith(("kubernetes:dev.", "kubernetes:kueue."))
    ]
    assert len(built_in) >= 15
    for manifest in built_in:
        kubernetes_validate.validate(manifest, "1.34", strict=True)


def test_the_operator_gets_the_platforms_idle_floors(dev_plan):
    deployment = dev_plan.one("kubernetes:apps/v1:Deployment", "dev-servers-operator").inputs
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert (env["DEVSERVERS_IDLE_GPU_PERCENT"], env["DEVSERVERS_IDLE_CPU_PERCENT"]) == ("5", "10")
    plan = plan_of(
        "dev", devServers={**stack_values("dev")[DEV_SERVERS], "idle": {"gpuPercent": 15}}
    )
    deployment = plan.one("kubernetes:apps/v1:Deployment", "dev-servers-operator").inputs
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert {"name": "DEVSERVERS_IDLE_GPU_PERCENT", "value": "15"} in container["env"]


def test_each_users_home_storage_quota_is_a_line_of_the_cost_table(dev_plan):
    """The plan cannot know which homes a cluster will keep: it prices the most they may hold,
    each user's quota of gp3 claims, on the one pricing path (the budget rule adds it too)."""
    prices = load_prices("us-west-2")
    cost = plan_cost("us-west-2", dev_plan)
    quotas = {line.item: line for line in cost.quotas}
    alice = quotas["storage quota dev-alice/devservers"]
    assert alice.detail == "up to 1000 GiB of gp3-home claims, in use or kept"
    assert alice.usd_per_hour == pytest.approx(
        1000 * prices.usd("ebsGp3PerGibMonth") / HOURS_PER_MONTH
    )
    assert quotas["storage quota dev-bob/devservers"].detail.startswith("up to 500 GiB")
    assert alice not in cost.baseline  # billed only as homes exist
    assert cost.total_per_hour == pytest.approx(
        cost.baseline_per_hour
        + cost.headroom_per_hour
        + cost.pools_per_hour
        + sum(q.usd_per_hour for q in cost.quotas)
    )
    table = "\n".join(cost_rows(cost, declared_in(dev_plan)))
    assert re.search(r"storage quota dev-alice/devservers +up to 1000 GiB .* 0\.110 +80", table)


def test_a_quota_of_a_storage_class_without_a_price_is_named_not_priced(dev_plan):
    stack = [
        replace(r, props={**r.props, "parameters": {"type": "io2"}})
        if r.type == STORAGE_CLASS
        else r
        for r in declared_in(dev_plan)
    ]
    cost = stack_cost(load_prices("us-west-2"), stack)
    assert not cost.quotas
    assert any(m.startswith("dev-servers-quota-alice: EBS io2 has no price") for m in cost.unpriced)


def claims_of_missing(plan) -> set[str]:
    """`<flavor>: <namespace>/<claim>` for every claim a server of each flavor, created with
    devctl's defaults by each user, would mount (as the operator renders it) that the plan does
    not create in that user's namespace; the home claims come from the StatefulSet's own
    templates. The kubelet never starts a pod whose claim does not exist."""
    claims = {
        (r.inputs["metadata"]["namespace"], r.inputs["metadata"]["name"])
        for r in plan.of_type("kubernetes:core/v1:PersistentVolumeClaim")
    }
    users = [
        r.inputs["metadata"]["name"]
        for r in plan.of_type("kubernetes:core/v1:Namespace")
        if r.name.startswith("dev-servers-ns-")
    ]
    missing = set()
    for flavor in named(
        plan, "kubernetes:dev.training-platform.io/v1alpha1:DevServerFlavor"
    ).values():
        name = flavor["metadata"]["name"]
        args = parse_args(["create", "box", "--flavor", name, "--image", "repo/dev:1"])
        for namespace in users:
            server = server_manifest(args, namespace, ["ssh-ed25519 AAAA alice@laptop"])
            server["metadata"]["uid"] = "uid"
            pod = stateful_set(server, flavor)["spec"]["template"]["spec"]
            missing |= {
                f"{name}: {namespace}/{v['persistentVolumeClaim']['claimName']}"
                for v in pod["volumes"]
                if "persistentVolumeClaim" in v
                and (namespace, v["persistentVolumeClaim"]["claimName"]) not in claims
            }
    assert users  # there are namespaces to check
    return missing


@pytest.mark.parametrize("efs", [True, False], ids=["with EFS", "without EFS"])
def test_every_claim_a_servers_pod_mounts_exists_in_its_namespace(efs):
    """Red before: without EFS the flavors still mounted efs-shared, which no namespace had, and
    every DevServer stayed Pending."""
    # The stack's jobs keep checkpoints on EFS: none here.
    plan = plan_of("dev", storage={"efs": {"enabled": efs}}, jobs=[])
    assert claims_of_missing(plan) == set()
    flavors = named(plan, "kubernetes:dev.training-platform.io/v1alpha1:DevServerFlavor")
    assert {f["spec"]["sharedFileSystem"] for f in flavors.values()} == {efs}


def test_every_image_repository_is_named_for_the_cluster_and_needs_nothing_of_it(dev_plan):
    """The trainer's, the operator's, the watcher's and the usage recorder's ECR repositories:
    `<cluster>/<image>` from stack config, so neither they nor the builds into them wait for the
    EKS cluster."""
    repositories = {r.inputs["name"]: r for r in dev_plan.of_type("aws:ecr/repository:Repository")}
    assert set(repositories) == {
        "tp-dev/trainer",
        "tp-dev/devserver-operator",
        "tp-dev/gpu-registration-watch",
        "tp-dev/usage-recorder",
    }
    for repository in repositories.values():
        assert repository.dependencies == [], repository.name
