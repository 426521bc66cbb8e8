"""A local Kubernetes API for tests: real clients (kopf, the kubernetes client, devctl) talk to it
over HTTP with bearer tokens, and every request is authenticated and authorized with RBAC the
way kube-apiserver does it. Any refusal is a 403 with the real Status body, and is recorded in
`KubeAPI.refusals` so a test can assert there was none.

What it serves (tests.kube_api.server): discovery (/version, /api, /apis, /apis/<g>/<v>); get,
list and watch (resourceVersion, label and field selectors), create, update, merge and JSON
patch, status subresources, delete with finalizers and deletionTimestamp; the resources of
`server.BUILTIN` (Nodes among them) plus every CustomResourceDefinition stored in it (defaulting,
pruning and validating by its schema; cluster-scoped ones too); the system namespaces a cluster
starts with; where a core/v1 Event may live; a namespace controller, an owner-reference garbage
collector (background, foreground, orphan), pods/log as the kubelet picks the run a log comes
from (the text is the test's, per container ID), and (tests.kube_api.kubelet) a StatefulSet
controller and a kubelet that runs pods as local processes in their own PID namespace, with
pods/exec and pods/portforward over websockets. Who may do what (tests.kube_api.rbac):
Kubernetes' request verbs and RBAC rule matching written down from upstream, over the Roles,
ClusterRoles and bindings given plus the bootstrap policy every cluster has.

Admission: the plan's ValidatingAdmissionPolicies on users' creates when a test sets
`api.policies = admission_policies(plan)`; webhooks are not modelled (a test adds its own
mutating hooks to `KubeAPI.admission`, as Kueue's pod webhook adds its scheduling gate), nor Pod
Security, quotas, OwnerReferencesPermission-
Enforcement, strategic merge patch, SPDY, CEL rules of CRDs, deletion of a CRD's objects with
the CRD, graceful pod termination (a deleted pod's processes are killed at once).

Adding a resource is data: a `server.Kind` (group, version, kind, plural, namespaced,
subresources) in `KubeAPI(kinds=...)`, or a CRD object created through the API.

    api = from_plan(plan)                      # the stack's RBAC, CRDs, namespaces, flavors...
    token = api.add_token(rbac.user("alice", ["dev:alice"]))
    kubeconfig = api.kubeconfig(token, namespace="dev-alice")   # for any client
    ...
    assert api.refusals == []
    api.stop()
"""

from tests.kube_api.kubelet import Kubelet
from tests.kube_api.rbac import MASTERS, Authorizer, service_account, user
from tests.kube_api.server import BUILTIN, SYSTEM_NAMESPACES, KubeAPI

RBAC_KINDS = ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
CRD = "CustomResourceDefinition"
HELM_RELEASE = "kubernetes:helm.sh/v3:Release"
KUSTOMIZE = "kubernetes:kustomize/v2:Directory"
# The namespace each of the plan's upstream overlays (deploy/manifests) creates: the MPI
# operator's and the training operator's standalone overlays, Trainer's manager overlay,
# local-path-provisioner's deploy/.
OVERLAY_NAMESPACES = {
    "mpi-operator": "mpi-operator",
    "training-operator": "kubeflow",
    "kubeflow-trainer": "kubeflow-system",
    "local-path-provisioner": "local-path-storage",
}
ADMIN = user("admin", [MASTERS])


def _manifest(resource) -> tuple[str, dict]:
    """A Pulumi Kubernetes resource of the plan as (apiVersion, manifest)."""
    group_version, kind = resource.type.removeprefix("kubernetes:").rsplit(":", 1)
    api_version = group_version.removeprefix("core/")
    return api_version, {**resource.inputs, "apiVersion": api_version, "kind": kind}


def rbac_of(plan) -> list[dict]:
    """The Roles, ClusterRoles and bindings `plan` deploys, as an Authorizer's policy."""
    manifests = [_manifest(r)[1] for r in plan.resources if r.type.startswith("kubernetes:")]
    return [m for m in manifests if m["kind"] in RBAC_KINDS]


def admission_policies(plan) -> dict[str, dict]:
    """The ValidatingAdmissionPolicies `plan` deploys with a Deny binding: name -> spec."""
    admission = "kubernetes:admissionregistration.k8s.io/v1"
    denied = {
        b.inputs["spec"]["policyName"]
        for b in plan.of_type(f"{admission}:ValidatingAdmissionPolicyBinding")
        if b.inputs["spec"]["validationActions"] == ["Deny"]
    }
    return {
        p.inputs["metadata"]["name"]: p.inputs["spec"]
        for p in plan.of_type(f"{admission}:ValidatingAdmissionPolicy")
        if p.inputs["metadata"]["name"] in denied
    }


def from_plan(plan, crds: list[dict] = (), account=None) -> KubeAPI:
    """A started API holding what `plan` deploys to Kubernetes: its RBAC (as the authorizer's
    policy), and every object of a kind the API serves, CRDs first (with `crds`, which the
    plan's Helm charts install), then namespaces. Workloads it does not serve (Deployments, Helm
    releases) are left to the test to run as processes. Pods run as `account` (see Kubelet)."""
    manifests = [_manifest(r) for r in plan.resources if r.type.startswith("kubernetes:")]
    manifests += [(crd["apiVersion"], crd) for crd in crds]
    # The namespaces the plan's Helm releases (createNamespace) and kustomize overlays make,
    # which hold objects of the plan too (an overlay's namespaces are not in the plan offline).
    made = {m["metadata"]["name"] for _, m in manifests if m["kind"] == "Namespace"}
    by_installs = {
        r.inputs["namespace"] for r in plan.of_type(HELM_RELEASE) if r.inputs.get("createNamespace")
    } | {OVERLAY_NAMESPACES[r.name] for r in plan.of_type(KUSTOMIZE)}
    manifests += [
        ("v1", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        for namespace in sorted(by_installs - made - set(SYSTEM_NAMESPACES))
    ]
    api = KubeAPI(Authorizer(rbac_of(plan))).start()
    api.runtime = Kubelet(account)
    served = {(k.api_version, k.kind): k for k in BUILTIN}
    crds = [m for v, m in manifests if (v, m["kind"]) == ("apiextensions.k8s.io/v1", CRD)]
    for manifest in crds:
        api.call(api.create, served[("apiextensions.k8s.io/v1", CRD)], "", manifest)
    api.settle()  # the CRDs' kinds are served before their objects come
    served |= {(k.api_version, k.kind): k for k in api.call(lambda: list(api.kinds.values()))}
    rest = [(served.get((v, m["kind"])), m) for v, m in manifests if m["kind"] != CRD]
    for kind, manifest in sorted(rest, key=lambda km: km[1]["kind"] != "Namespace"):
        if kind is not None:
            api.call(api.create, kind, manifest["metadata"].get("namespace", ""), manifest)
    api.settle()
    return api


__all__ = [
    "ADMIN",
    "KubeAPI",
    "Kubelet",
    "admission_policies",
    "from_plan",
    "rbac_of",
    "service_account",
    "user",
]
