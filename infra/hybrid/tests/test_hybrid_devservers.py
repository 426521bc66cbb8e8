"""DevServers on the hybrid machines (flavors naming `nodePool: hybrid`): placement from
placement.py, homes in directories of each machine's own disk made by the local-path provisioner
(infra/hybrid/homes.py), no /shared. Through the offline plan, and the operator on the
local Kubernetes API. The provisioner cannot run here (no kubelet, no hostPath): its overlay is
checked against upstream's rules, written down below from its sources at the pinned tag, never
against copies of its manifests."""

import copy

import kubernetes_validate
import pytest
import yaml

from deploy.program import OVERLAYS, build_platform
from infra.core.nodes import MACHINE_LABEL, POOL_LABEL
from infra.core.offline import run_offline
from infra.core.tests.crd_schema import conformance_errors
from infra.core.versions import LOCAL_PATH_HELPER_IMAGE, LOCAL_PATH_PROVISIONER_VERSION
from infra.hybrid.homes import NAMESPACE, OVERLAY, PROVISIONER, STORAGE_CLASS
from infra.hybrid.machines import HYBRID_TAINT, MACHINE_TOLERATION, machine_taint
from infra.hybrid.placement import node_selector, tolerations
from infra.hybrid.tests.test_hybrid_jobs import error_of, flavors, hybrid_values, kueue_may_assign
from infra.kueue.config import SYSTEM_NAMESPACES
from infra.stack.loading import parse_stack_config
from policies.offline import check
from tests.e2e.test_policies import plan_with
from tests.plugin import local_cluster, stack_values

FLAVOR = "kubernetes:dev.training-platform.io/v1alpha1:DevServerFlavor"
STORAGE_CLASSES = "kubernetes:storage.k8s.io/v1:StorageClass"
# One RTX 4090 with most of alice-4090's room (pod_room: 14 vCPU, 54 GiB).
RTX_FLAVOR = {
    "name": "rtx-1",
    "nodePool": "hybrid",
    "machine": "alice-4090",
    "gpus": 1,
    "cpu": 12,
    "memoryGib": 48,
}


def hybrid_dev_servers() -> dict:
    """dev's devServers section with RTX_FLAVOR beside its EC2 flavors."""
    section = stack_values("dev")["training-platform:devServers"]
    return {**section, "flavors": [*section["flavors"], RTX_FLAVOR]}


def plan_of_values(values: dict):
    config = parse_stack_config(values, "Pulumi.dev.yaml")
    return run_offline(lambda: build_platform(config), "dev", values)


@pytest.fixture(scope="module")
def plan():
    return plan_of_values(hybrid_values(devServers=hybrid_dev_servers()))


def rtx_pool():
    values = hybrid_values(devServers=hybrid_dev_servers())
    config = parse_stack_config(values, "Pulumi.dev.yaml")
    (flavor,) = [f for f in config.dev_servers.flavors if f.name == "rtx-1"]
    return config.flavor_pool(flavor)


# Its servers' pods: alice-4090 alone, which they select and whose taint they tolerate.
RTX_SELECTOR = {POOL_LABEL: "hybrid", MACHINE_LABEL: "alice-4090"}
RTX_TOLERATIONS = [
    {**HYBRID_TAINT, "operator": "Equal"},
    {**machine_taint("alice-4090"), "operator": "Equal"},
]


def flavor_specs(plan) -> dict[str, dict]:
    return {r.inputs["metadata"]["name"]: r.inputs["spec"] for r in plan.of_type(FLAVOR)}


# --- the flavor ----------------------------------------------------------------------------------


def test_a_hybrid_flavor_goes_to_the_machines_with_its_homes_on_their_disks(plan):
    specs = flavor_specs(plan)
    rtx = specs["rtx-1"]
    pool = rtx_pool()
    assert rtx["nodeSelector"] == node_selector(pool) == RTX_SELECTOR
    assert rtx["tolerations"] == tolerations(pool) == RTX_TOLERATIONS
    assert rtx["homeStorageClass"] == STORAGE_CLASS and rtx["sharedFileSystem"] is False
    assert rtx["resources"]["limits"] == {"cpu": "12", "memory": "48Gi", "nvidia.com/gpu": "1"}
    flavor = next(r.inputs for r in plan.of_type(FLAVOR) if r.name == "dev-servers-flavor-rtx-1")
    assert conformance_errors(flavor) == []
    # EC2 pools keep gp3 homes and /shared.
    assert (specs["gpu-1"]["homeStorageClass"], specs["gpu-1"]["sharedFileSystem"]) == (
        "gp3-home",
        True,
    )


def test_the_operator_starts_after_the_flavors_whose_home_class_it_reads(plan):
    """A flavor stored before spec.homeStorageClass existed lacks it until `pulumi up` updates
    it: the operator that reads it rolls out after."""
    operator = plan.one("kubernetes:apps/v1:Deployment", "dev-servers-operator")
    assert {f.urn for f in plan.of_type(FLAVOR)} <= set(operator.dependencies)


def test_kueue_gives_a_hybrid_servers_pods_the_hybrid_flavor_and_no_other(plan):
    """The server's pods carry the flavor's selector and toleration (devservers/render.py): of
    the ResourceFlavors, Kueue may assign them the machines' alone
    (infra.hybrid.tests.test_hybrid_jobs restates Kueue's rule), and an EC2 flavor's pods never
    get it."""
    specs, resource_flavors = flavor_specs(plan), flavors(plan)
    assert "hybrid" in resource_flavors
    for name, spec in specs.items():
        pod = {"nodeSelector": spec["nodeSelector"], "tolerations": spec["tolerations"]}
        assignable = {f for f, s in resource_flavors.items() if kueue_may_assign(s, pod)}
        assert assignable == {spec["nodePool"]}, name


# --- stack config ----------------------------------------------------------------------------


def flavor_on(machine: str, **size) -> dict:
    return {"name": "f", "nodePool": "hybrid", "machine": machine, **size}


@pytest.mark.parametrize(
    ("flavor", "error"),
    [
        (RTX_FLAVOR, None),
        (flavor_on("bob-cpu", cpu=7, memoryGib=27), None),
        (
            flavor_on("alice-4090", gpus=1, cpu=15, memoryGib=48),
            "devServers.flavors[f]: 1 GPUs, 15 vCPU, 48 GiB does not fit machine alice-4090; "
            "allowed: at most 1 GPUs, 14 vCPU, 54 GiB",
        ),
        (
            flavor_on("bob-cpu", gpus=1, cpu=4, memoryGib=8),
            "devServers.flavors[f]: 1 GPUs, 4 vCPU, 8 GiB does not fit machine bob-cpu; "
            "allowed: at most 0 GPUs, 7 vCPU, 27 GiB",
        ),
        # Its servers run on the one machine their homes are on: it names it.
        (
            {"name": "f", "nodePool": "hybrid", "cpu": 4, "memoryGib": 8},
            "devServers.flavors[f].machine: none: a hybrid flavor names the machine its servers "
            "run on; allowed: alice-4090, bob-cpu",
        ),
        (
            flavor_on("bob-cpuu", cpu=4, memoryGib=8),
            "devServers.flavors[f].machine: 'bob-cpuu': a hybrid flavor names the machine its "
            "servers run on; did you mean 'bob-cpu'? allowed: alice-4090, bob-cpu",
        ),
        (
            {"name": "f", "nodePool": "cpu", "machine": "bob-cpu", "cpu": 1, "memoryGib": 1},
            "devServers.flavors[f].machine: 'bob-cpu' on pool cpu: a machine goes with nodePool "
            "hybrid only; allowed: none",
        ),
    ],
)
def test_a_hybrid_flavor_names_its_machine_and_fits_it(flavor, error):
    values = hybrid_values(devServers={**hybrid_dev_servers(), "flavors": [flavor]})
    if error is None:
        parse_stack_config(values, "Pulumi.dev.yaml")
        return
    assert error in error_of(values)


# --- the home StorageClass and the provisioner -------------------------------------------------

# rancher/local-path-provisioner v0.0.37 (commit 49b2be8e), written down from its sources:
# - main.go: the provisioner's name (DefaultProvisionerName) and namespace (DefaultNamespace;
#   deploy/local-path-storage.yaml sets POD_NAMESPACE from the pod's own namespace), which is
#   where provisioner.go createHelperPod puts every helper pod (`helperPod.Namespace =
#   p.namespace`), with spec.nodeName the home's node, a hostPath volume `data` of the home's
#   parent directory (DirectoryOrCreate) mounted at that path, and the ConfigMap's setup or
#   teardown script at /script;
UPSTREAM_PROVISIONER, UPSTREAM_NAMESPACE = "rancher.io/local-path", "local-path-storage"
# - deploy/local-path-storage.yaml: the controller's Deployment and container, the ConfigMap
#   holding helperPod.yaml, the StorageClass it ships, and the directory homes go under;
UPSTREAM_DEPLOYMENT = UPSTREAM_CONTAINER = "local-path-provisioner"
UPSTREAM_CONFIG_MAP, UPSTREAM_STORAGE_CLASS = "local-path-config", "local-path"
UPSTREAM_BASE = "/opt/local-path-provisioner"
# - provisioner.go provisionFor: no selected node, no volume ("configuration error, no node was
#   specified"), so the class must bind on first consumer; createPersistentVolumeSource: the
#   StorageClass annotation defaultVolumeType picks `local` or `hostPath` (the default, of type
#   DirectoryOrCreate); deleteFor: the directory is removed only when reclaimPolicy is not
#   Retain; saveHelperPodLogs reads the container named HELPER_CONTAINER; createHelperPod adds
#   DISK_PRESSURE_TOLERATION only to a template without tolerations of its own.
VOLUME_TYPE_ANNOTATION, VOLUME_TYPES = "defaultVolumeType", ("local", "hostPath")
HELPER_CONTAINER = "helper-pod"
DISK_PRESSURE_TOLERATION = {
    "key": "node.kubernetes.io/disk-pressure",
    "operator": "Exists",
    "effect": "NoSchedule",
}


def helper_template_refusals(pod: dict) -> list[str]:
    """What the provisioner refuses in a helper pod template unless
    --allow-unsafe-helper-pod-template is set: util.go validateHelperPodTemplate at v0.0.37."""
    spec = pod["spec"]
    containers = spec.get("containers") or []
    if len(containers) != 1:
        return ["exactly one container"]
    container, pod_context = containers[0], spec.get("securityContext") or {}
    context = container.get("securityContext") or {}
    refused = {
        "initContainers": bool(spec.get("initContainers")),
        "ephemeralContainers": bool(spec.get("ephemeralContainers")),
        "volumes": bool(spec.get("volumes")),
        "host namespaces": any(spec.get(k) for k in ("hostNetwork", "hostPID", "hostIPC")),
        "nodeName": bool(spec.get("nodeName")),
        "serviceAccountName": bool(spec.get("serviceAccountName")),
        "volumeMounts": bool(container.get("volumeMounts")),
        "envFrom": bool(container.get("envFrom")),
        "lifecycle": "lifecycle" in container,
        "probes": any(f"{p}Probe" in container for p in ("liveness", "readiness", "startup")),
        "env valueFrom": any("valueFrom" in e for e in container.get("env") or []),
        "root user": pod_context.get("runAsUser") == 0 or pod_context.get("runAsGroup") == 0,
        "sysctls": bool(pod_context.get("sysctls")),
        "privileged": context.get("privileged") is True,
        "added capabilities": bool((context.get("capabilities") or {}).get("add")),
        "privilege escalation": context.get("allowPrivilegeEscalation") is True,
    }
    return [what for what, bad in refused.items() if bad]


def helper_pod(template: dict, node: str, home: str) -> dict:
    """The pod createHelperPod makes from `template` to set up `home` on `node`."""
    pod = copy.deepcopy(template)
    parent = home.rsplit("/", 1)[0] + "/"
    pod["metadata"] |= {"namespace": UPSTREAM_NAMESPACE}
    pod["spec"] |= {
        "nodeName": node,
        "restartPolicy": "Never",
        "serviceAccountName": "local-path-provisioner-service-account",
        "volumes": [
            {"name": "data", "hostPath": {"path": parent, "type": "DirectoryOrCreate"}},
            {"name": "script", "configMap": {"name": UPSTREAM_CONFIG_MAP}},
        ],
    }
    (container,) = pod["spec"]["containers"]
    container |= {
        "command": ["/bin/sh", "/script/setup"],
        "env": [{"name": "VOL_DIR", "value": home}],
        "volumeMounts": [
            {"name": "script", "mountPath": "/script"},
            {"name": "data", "mountPath": parent},
        ],
    }
    return pod


def overlay() -> dict:
    return yaml.safe_load((OVERLAYS / OVERLAY / "kustomization.yaml").read_text())


def patch_of(kind: str) -> dict:
    (patch,) = [p for p in overlay()["patches"] if p["target"]["kind"] == kind]
    return patch


def helper_template() -> dict:
    config_map = yaml.safe_load(patch_of("ConfigMap")["patch"])
    return yaml.safe_load(config_map["data"]["helperPod.yaml"])


def test_the_home_class_is_the_provisioners_binding_on_first_use_and_deleting_with_its_claim(
    plan,
):
    (home_class,) = [
        r for r in plan.of_type(STORAGE_CLASSES) if r.inputs["metadata"]["name"] == STORAGE_CLASS
    ]
    inputs = home_class.inputs
    kubernetes_validate.validate(inputs, "1.34", strict=True)
    assert PROVISIONER == inputs["provisioner"] == UPSTREAM_PROVISIONER
    assert inputs["volumeBindingMode"] == "WaitForFirstConsumer"
    # Homes outlive servers as gp3 ones do, by their retained claims: deleting the claim deletes
    # the home (reclaim Delete, like the gp3 class), else its directory would stay behind.
    (gp3,) = [r for r in plan.of_type(STORAGE_CLASSES) if r.inputs["metadata"]["name"] == "gp3"]
    assert inputs["reclaimPolicy"] == gp3.inputs["reclaimPolicy"] == "Delete"
    # A local volume: a missing directory fails the mount instead of becoming an empty home.
    assert inputs["metadata"]["annotations"][VOLUME_TYPE_ANNOTATION] == "local" in VOLUME_TYPES
    install = plan.one("kubernetes:kustomize/v2:Directory", "local-path-provisioner")
    assert install.urn in home_class.dependencies
    # The controller, like every other, waits for the system nodes.
    assert plan.one("aws:eks/nodeGroup:NodeGroup", "cluster-system").urn in install.dependencies


def test_the_provisioner_is_upstreams_overlay_at_the_pinned_tag_on_the_system_nodes():
    (resource,) = overlay()["resources"]
    assert resource == (
        "https://github.com/rancher/local-path-provisioner//deploy"
        f"?ref={LOCAL_PATH_PROVISIONER_VERSION}"
    )
    assert overlay()["components"] == ["../system-nodes"]  # every Deployment (test_services)
    # Upstream's own class is not installed: only hybrid-local names the provisioner.
    storage_class = patch_of("StorageClass")
    assert storage_class["target"]["name"] == UPSTREAM_STORAGE_CLASS
    assert yaml.safe_load(storage_class["patch"])["$patch"] == "delete"


def test_the_provisioner_runs_as_a_restricted_pod():
    """It only calls the API server; the pods-restricted rule (Pod Security restricted) holds
    for its container as upstream declares it with the overlay's settings merged in."""
    patch = patch_of("Deployment")
    assert patch["target"]["name"] == UPSTREAM_DEPLOYMENT
    pod = yaml.safe_load(patch["patch"])["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["name"] == UPSTREAM_CONTAINER  # merged by name into upstream's container
    image = f"docker.io/rancher/local-path-provisioner:{LOCAL_PATH_PROVISIONER_VERSION}"
    merged = {**pod, "containers": [{**container, "image": image}]}
    deployment = {"spec": {"template": {"spec": merged}}}
    rules = {"pods-restricted", "pods-no-host-access"}
    violations = check(plan_with(("kubernetes:apps/v1:Deployment", deployment)))
    assert [v for v in violations if v.policy in rules] == []
    # As upstream ships it, without the overlay's settings, it would not pass.
    upstream = {"spec": {"template": {"spec": {"containers": [{"name": "c", "image": image}]}}}}
    violations = check(plan_with(("kubernetes:apps/v1:Deployment", upstream)))
    assert any(v.policy == "pods-restricted" for v in violations)


def test_helper_pods_are_a_valid_template_run_on_the_machines_only_with_the_pinned_image():
    template = helper_template()
    assert helper_template_refusals(template) == []
    (container,) = template["spec"]["containers"]
    assert container["name"] == HELPER_CONTAINER
    assert container["image"] == LOCAL_PATH_HELPER_IMAGE and "@" not in LOCAL_PATH_HELPER_IMAGE
    assert ":" in LOCAL_PATH_HELPER_IMAGE.rsplit("/", 1)[1]  # a tag, not upstream's bare name
    # On any machine (the node the claim's pod went to: the provisioner sets nodeName), and the
    # disk-pressure toleration upstream adds only when a template has none.
    spec = template["spec"]
    assert spec["nodeSelector"] == {POOL_LABEL: "hybrid"}
    assert spec["tolerations"] == [
        DISK_PRESSURE_TOLERATION,
        {**HYBRID_TAINT, "operator": "Equal"},
        MACHINE_TOLERATION,
    ]
    # The rules are upstream's: what createHelperPod adds itself, a template may not set.
    made = helper_pod(template, "mi-0123456789abcdef0", f"{UPSTREAM_BASE}/pvc-1_dev-alice_home")
    assert helper_template_refusals(made) == [
        "volumes",
        "nodeName",
        "serviceAccountName",
        "volumeMounts",
    ]


def test_the_provisioners_namespace_admits_no_connection(plan):
    """Its controller and helper pods only call the API server: a default-deny and nothing else
    (infra/core/network_policies.py platform_namespace)."""
    policies = [
        p.inputs
        for p in plan.of_type("kubernetes:networking.k8s.io/v1:NetworkPolicy")
        if p.inputs["metadata"]["namespace"] == NAMESPACE
    ]
    assert [(p["metadata"]["name"], p["spec"]) for p in policies] == [
        ("default-deny-ingress", {"podSelector": {}, "policyTypes": ["Ingress"]})
    ]


def test_helper_pods_need_a_privileged_namespace_which_is_the_provisioners_alone(plan):
    """A helper pod mounts a hostPath volume, which Pod Security baseline forbids (the
    pods-no-host-access rule restates it): it runs in the provisioner's namespace, labelled
    privileged by the overlay, never in a user namespace, which stays restricted."""
    made = helper_pod(helper_template(), "mi-1", f"{UPSTREAM_BASE}/pvc-1_dev-alice_home-box-0")
    violations = check(plan_with(("kubernetes:core/v1:Pod", made)))
    assert [v.message for v in violations if v.policy == "pods-no-host-access"] == [
        "pod mounts hostPath volume data"
    ]
    namespace = patch_of("Namespace")
    assert namespace["target"]["name"] == made["metadata"]["namespace"] == NAMESPACE
    labels = yaml.safe_load(namespace["patch"])["metadata"]["labels"]
    assert labels == {"pod-security.kubernetes.io/enforce": "privileged"}
    assert NAMESPACE == UPSTREAM_NAMESPACE and NAMESPACE in SYSTEM_NAMESPACES  # no team's
    users = [
        n.inputs["metadata"]
        for n in plan.of_type("kubernetes:core/v1:Namespace")
        if n.name.startswith("dev-servers-ns-")
    ]
    assert {u["name"] for u in users} == {"dev-alice", "dev-bob"}
    for user in users:
        assert user["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_no_provisioner_without_a_hybrid_flavor():
    plain = plan_of_values(hybrid_values())
    assert not plain.of_type("training-platform:infra:HybridHomes")
    assert not [
        r for r in plain.of_type(STORAGE_CLASSES) if r.inputs["metadata"]["name"] == STORAGE_CLASS
    ]


# --- the operator on the local Kubernetes API --------------------------------------------------


@pytest.fixture
def hybrid_cluster(plan, tmp_path, monkeypatch):
    yield from local_cluster(plan, tmp_path, monkeypatch)


def test_the_operator_gives_a_hybrid_server_a_home_on_its_machine_and_keeps_it_there(
    hybrid_cluster, monkeypatch
):
    from devservers.tests.test_devservers_operator import World

    world = World(hybrid_cluster, monkeypatch)
    # It asks for /shared, which the machines cannot mount: it runs without.
    created = world.create(flavor="rtx-1", shared={"enabled": True})
    assert created["status"]["phase"] == "Running"
    sts = world.api.read("statefulsets", "dev-alice", "box", group="apps")
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["storageClassName"] == STORAGE_CLASS
    pod = world.api.read("pods", "dev-alice", "box-0")["spec"]
    assert pod["nodeSelector"] == RTX_SELECTOR
    assert pod["tolerations"] == RTX_TOLERATIONS
    assert "shared" not in {v["name"] for v in pod["volumes"]}
    home = world.api.read("persistentvolumeclaims", "dev-alice", "home-box-0")
    assert home["spec"]["storageClassName"] == STORAGE_CLASS
    # Its home is on a machine: a flavor whose homes are gp3 (EC2 nodes) cannot take it over.
    world.patch("DevServer", "box", {"spec": {"flavor": "gpu-1"}}, namespace="dev-alice")
    world.refresh()
    status = world.status()
    assert (status["phase"], status["reason"]) == ("Failed", "HomeElsewhere")
    assert (
        "keeps homes in gp3-home, and this server's are in hybrid-local (home-box-0)"
        in (status["message"])
    )
    after = world.api.read("statefulsets", "dev-alice", "box", group="apps")
    assert after["metadata"]["uid"] == sts["metadata"]["uid"]  # left as it was
    # A refused spec stops the server's pods (its home kept); the fixed one starts them again.
    assert after["spec"]["replicas"] == 0
    world.patch("DevServer", "box", {"spec": {"flavor": "rtx-1"}}, namespace="dev-alice")
    world.refresh()
    world.refresh()  # once the pods run
    assert world.status()["phase"] == "Running"
    assert world.api.refusals == []
