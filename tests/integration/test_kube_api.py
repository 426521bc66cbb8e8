"""The local Kubernetes API's own rules against upstream's: request verbs as in
staging/src/k8s.io/apiserver/pkg/endpoints/request/requestinfo_test.go, RBAC decisions on the
examples of the Kubernetes RBAC documentation (kubernetes.io/docs/reference/access-authn-authz/
rbac/), the exec upgrade's get-and-create check of pkg/registry/core/pod/rest/authorize.go,
deletion with finalizers, the system namespaces and where an Event may live, as kube-apiserver
does them."""

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from kubernetes import client, config, dynamic
from kubernetes.stream import stream

from tests.kube_api import ADMIN, KubeAPI, Kubelet, service_account, user
from tests.kube_api.rbac import Authorizer, forbidden, request_info


@pytest.mark.parametrize(
    ("method", "url", "verb", "group", "namespace", "resource", "subresource", "name"),
    [
        ("GET", "/api/v1/namespaces", "list", "", "", "namespaces", "", ""),
        ("GET", "/api/v1/namespaces/other", "get", "", "other", "namespaces", "", "other"),
        ("GET", "/api/v1/namespaces/other/pods", "list", "", "other", "pods", "", ""),
        ("GET", "/api/v1/namespaces/other/pods/foo", "get", "", "other", "pods", "", "foo"),
        ("HEAD", "/api/v1/namespaces/other/pods/foo", "get", "", "other", "pods", "", "foo"),
        ("GET", "/api/v1/pods", "list", "", "", "pods", "", ""),
        ("GET", "/api/v1/namespaces/other/pods/foo/status", "get", "", "other", "pods", "status",
         "foo"),
        ("GET", "/api/v1/watch/pods", "watch", "", "", "pods", "", ""),
        ("GET", "/api/v1/pods?watch=true", "watch", "", "", "pods", "", ""),
        ("GET", "/api/v1/pods?watch=false", "list", "", "", "pods", "", ""),
        ("GET", "/api/v1/watch/namespaces/other/pods", "watch", "", "other", "pods", "", ""),
        ("GET", "/api/v1/namespaces/other/pods?fieldSelector=metadata.name%3Dfoo", "list", "",
         "other", "pods", "", "foo"),
        ("POST", "/api/v1/namespaces/other/pods", "create", "", "other", "pods", "", ""),
        ("PUT", "/api/v1/namespaces/other/pods/foo", "update", "", "other", "pods", "", "foo"),
        ("PATCH", "/api/v1/namespaces/other/pods/foo", "patch", "", "other", "pods", "", "foo"),
        ("DELETE", "/api/v1/namespaces/other/pods/foo", "delete", "", "other", "pods", "", "foo"),
        ("DELETE", "/api/v1/namespaces/other/pods", "deletecollection", "", "other", "pods", "",
         ""),
        ("GET", "/api/v1/namespaces/other/pods/foo/exec?command=ls", "get", "", "other", "pods",
         "exec", "foo"),
        ("POST", "/api/v1/namespaces/other/pods/foo/exec", "create", "", "other", "pods", "exec",
         "foo"),
        ("GET", "/apis/extensions/v1beta1/namespaces/other/extensions", "list", "extensions",
         "other", "extensions", "", ""),
        ("GET", "/apis/extensions/v1beta1/extensions/foo", "get", "extensions", "", "extensions",
         "", "foo"),
    ],
)  # fmt: skip
def test_resource_requests_get_upstreams_verbs(
    method, url, verb, group, namespace, resource, subresource, name
):
    path, _, query = url.partition("?")
    info = request_info(method, path, query)
    assert info.is_resource
    assert (info.verb, info.api_group, info.namespace) == (verb, group, namespace)
    assert (info.resource, info.subresource, info.name) == (resource, subresource, name)


@pytest.mark.parametrize("path", ["/api", "/api/v1", "/apis", "/apis/apps", "/apis/apps/v1",
                                  "/healthz", "/version", "/"])  # fmt: skip
def test_discovery_and_health_paths_are_non_resource_requests(path):
    info = request_info("GET", path)
    assert not info.is_resource and info.verb == "get"


def role(name, rules, namespace=None, kind="Role") -> dict:
    meta = {"name": name} | ({"namespace": namespace} if namespace else {})
    return {"kind": kind, "metadata": meta, "rules": rules}


def binding(name, role_kind, role_name, subjects, namespace=None) -> dict:
    meta = {"name": name} | ({"namespace": namespace} if namespace else {})
    return {
        "kind": "RoleBinding" if namespace else "ClusterRoleBinding",
        "metadata": meta,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role_name},
        "subjects": subjects,
    }


# The RBAC documentation's examples, as they are written there.
DOCS = Authorizer(
    [
        role("pod-reader", [{"apiGroups": [""], "resources": ["pods"],
                             "verbs": ["get", "watch", "list"]}], "default"),
        binding("read-pods", "Role", "pod-reader", [{"kind": "User", "name": "jane"}], "default"),
        role("secret-reader", [{"apiGroups": [""], "resources": ["secrets"],
                                "verbs": ["get", "watch", "list"]}], kind="ClusterRole"),
        binding("read-secrets", "ClusterRole", "secret-reader",
                [{"kind": "User", "name": "dave"}], "development"),
        binding("read-secrets-global", "ClusterRole", "secret-reader",
                [{"kind": "Group", "name": "manager"}]),
        role("pod-and-pod-logs-reader", [{"apiGroups": [""], "resources": ["pods", "pods/log"],
                                          "verbs": ["get", "list"]}], "default"),
        role("configmap-updater", [{"apiGroups": [""], "resources": ["configmaps"],
                                    "resourceNames": ["my-configmap"],
                                    "verbs": ["update", "get"]}], "default"),
        binding("logs", "Role", "pod-and-pod-logs-reader", [{"kind": "User", "name": "lou"}],
                "default"),
        binding("cm", "Role", "configmap-updater", [{"kind": "User", "name": "cam"}], "default"),
        role("health", [{"nonResourceURLs": ["/healthz", "/healthz/*"], "verbs": ["get", "post"]}],
             kind="ClusterRole"),
        binding("health", "ClusterRole", "health", [{"kind": "Group", "name": "probes"}]),
        role("scaler", [{"apiGroups": ["*"], "resources": ["*/scale"], "verbs": ["patch"]}],
             kind="ClusterRole"),
        binding("scaler", "ClusterRole", "scaler",
                [{"kind": "ServiceAccount", "name": "default", "namespace": "kube-system"},
                 {"kind": "Group", "name": "system:serviceaccounts:qa"}]),
        binding("local-sa", "Role", "pod-reader", [{"kind": "ServiceAccount", "name": "bot"}],
                "default"),
    ]
)  # fmt: skip


def allowed(who, method, url) -> bool:
    path, _, query = url.partition("?")
    return DOCS.allows(who, request_info(method, path, query))


@pytest.mark.parametrize(
    ("who", "method", "url", "expected"),
    [
        (user("jane"), "GET", "/api/v1/namespaces/default/pods/web", True),
        (user("jane"), "GET", "/api/v1/namespaces/default/pods?watch=1", True),
        (user("jane"), "DELETE", "/api/v1/namespaces/default/pods/web", False),
        (user("jane"), "GET", "/api/v1/namespaces/kube-system/pods", False),
        (user("jane"), "GET", "/api/v1/pods", False),  # all namespaces is cluster scope
        (user("jane"), "GET", "/api/v1/namespaces/default/pods/web/log", False),
        (user("dave"), "GET", "/api/v1/namespaces/development/secrets/s", True),
        (user("dave"), "GET", "/api/v1/namespaces/default/secrets/s", False),
        (user("mia", ["manager"]), "GET", "/api/v1/secrets", True),
        (user("lou"), "GET", "/api/v1/namespaces/default/pods/web/log", True),
        (user("cam"), "PUT", "/api/v1/namespaces/default/configmaps/my-configmap", True),
        (user("cam"), "PUT", "/api/v1/namespaces/default/configmaps/other", False),
        (user("cam"), "GET", "/api/v1/namespaces/default/configmaps", False),  # no name to match
        (user("p", ["probes"]), "GET", "/healthz/etcd", True),
        (user("p", ["probes"]), "GET", "/metrics", False),
        (user("anyone"), "GET", "/apis/apps/v1", True),  # system:discovery
        (user("anyone"), "GET", "/metrics", False),
        (service_account("kube-system", "default"), "PATCH",
         "/apis/apps/v1/namespaces/a/deployments/d/scale", True),
        (service_account("qa", "x"), "PATCH", "/apis/apps/v1/namespaces/a/statefulsets/s/scale",
         True),
        (service_account("qa", "x"), "PATCH", "/apis/apps/v1/namespaces/a/statefulsets/s", False),
        (service_account("default", "bot"), "GET", "/api/v1/namespaces/default/pods/p", True),
        (service_account("other", "bot"), "GET", "/api/v1/namespaces/default/pods/p", False),
    ],
)  # fmt: skip
def test_rbac_decides_the_docs_examples_as_kubernetes_does(who, method, url, expected):
    assert allowed(who, method, url) is expected


def test_a_refusal_reads_like_the_api_servers():
    info = request_info("GET", "/api/v1/namespaces/dev-bob/pods/box-0/exec")
    status = forbidden(service_account("ops", "op"), info)
    assert status["code"] == 403 and status["reason"] == "Forbidden"
    assert status["message"] == (
        'pods "box-0" is forbidden: User "system:serviceaccount:ops:op" cannot get resource '
        '"pods/exec" in API group "" in the namespace "dev-bob"'
    )
    flavors = request_info("PATCH", "/apis/dev.training-platform.io/v1alpha1/devserverflavors/f")
    assert forbidden(user("u"), flavors)["message"].startswith(
        'devserverflavors.dev.training-platform.io "f" is forbidden: User "u" cannot patch '
        'resource "devserverflavors" in API group "dev.training-platform.io" at the cluster scope'
    )


@pytest.fixture
def api(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))  # the client's discovery cache
    pods = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]
    exec_verbs = {"get-only": ["get"], "create-only": ["create"], "both": ["get", "create"]}
    policy = []
    for name, verbs in exec_verbs.items():
        rules = [*pods, {"apiGroups": [""], "resources": ["pods/exec"], "verbs": verbs}]
        policy += [
            role(name, rules, "team"),
            binding(name, "Role", name, [{"kind": "Group", "name": name}], "team"),
        ]
    found = KubeAPI(Authorizer(policy)).start()
    found.runtime = Kubelet()
    yield found
    found.stop()


def kube_client(api: KubeAPI, who, directory) -> client.ApiClient:
    path = directory / f"kubeconfig-{len(api.tokens)}"
    path.write_text(yaml.safe_dump(api.kubeconfig(api.add_token(who))))
    return config.new_client_from_config(str(path))


PROCESSES = ["sh", "-c", "cat /proc/[0-9]*/comm"]


def test_exec_upgrades_need_get_and_create_and_run_in_the_pods_own_processes(api, tmp_path):
    admin = dynamic.DynamicClient(kube_client(api, ADMIN, tmp_path))
    admin.resources.get(api_version="v1", kind="Namespace").create(
        body={"metadata": {"name": "team"}}
    )
    pod = {"metadata": {"name": "box"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
    admin.resources.get(api_version="v1", kind="Pod").create(body=pod, namespace="team")
    api.settle()

    def run(group: str) -> str:
        core = client.CoreV1Api(kube_client(api, user("u", [group]), tmp_path))
        return stream(
            core.connect_get_namespaced_pod_exec, "box", "team", command=PROCESSES,
            stdout=True, stderr=False, stdin=False, tty=False,
        )  # fmt: skip

    assert run("both").split() == ["sleep", "sh"]  # the pod's PID namespace only
    for group in ("get-only", "create-only"):
        with pytest.raises(Exception):  # noqa: B017 (the client's own error: see devservers.kube)
            run(group)
    assert api.refusals == [
        'pods "box" is forbidden: ',  # authorize.go: the extra create check, with RBAC's reason
        'pods "box" is forbidden: User "u" cannot get resource "pods/exec" in API group "" in '
        'the namespace "team"',
    ]


def test_finalizers_hold_an_object_and_its_namespace_until_removed(api, tmp_path):
    admin = dynamic.DynamicClient(kube_client(api, ADMIN, tmp_path))
    namespaces = admin.resources.get(api_version="v1", kind="Namespace")
    maps = admin.resources.get(api_version="v1", kind="ConfigMap")
    namespaces.create(body={"metadata": {"name": "team"}})
    held = {"metadata": {"name": "held", "finalizers": ["example.com/keep"]}}
    maps.create(body=held, namespace="team")
    maps.delete(name="held", namespace="team")
    namespaces.delete(name="team")
    api.settle()
    kept = api.read("configmaps", "team", "held")
    assert kept["metadata"]["deletionTimestamp"]
    assert api.read("namespaces", "", "team")["status"]["phase"] == "Terminating"
    with pytest.raises(Exception, match="no new finalizers"):  # noqa: B017
        maps.patch(
            name="held", namespace="team", content_type="application/merge-patch+json",
            body={"metadata": {"finalizers": ["example.com/keep", "example.com/more"]}},
        )  # fmt: skip
    maps.patch(
        name="held", namespace="team", content_type="application/merge-patch+json",
        body={"metadata": {"finalizers": None}},
    )  # fmt: skip
    api.settle()
    assert api.read("configmaps", "team", "held") is None
    assert api.read("namespaces", "", "team") is None


def test_a_pod_runs_with_its_volumes_environment_hostname_and_peers_names(api, tmp_path):
    """What the kubelet gives a container: volumes at their paths (a Secret's data decoded, with
    its defaultMode), the env with fieldRefs, the pod's hostname, and /etc/hosts naming the pods
    of its headless Service; a pod whose Secret is missing waits (ContainerCreating)."""
    admin = dynamic.DynamicClient(kube_client(api, ADMIN, tmp_path))
    kinds = {k: admin.resources.get(api_version="v1", kind=k) for k in ("Namespace", "Pod")}
    kinds["Namespace"].create(body={"metadata": {"name": "team"}})
    container = {
        "name": "c",
        "image": "i",
        "workingDir": "/home/dev",
        "env": [
            {"name": "GREETING", "value": "hi"},
            {"name": "INDEX", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['i']"}}},
        ],
        "volumeMounts": [
            {"name": "home", "mountPath": "/home/dev"},
            {"name": "key", "mountPath": "/etc/box-key"},
        ],
    }
    volumes = [
        {"name": "home", "persistentVolumeClaim": {"claimName": "home-box-0"}},
        {"name": "key", "secret": {"secretName": "key", "defaultMode": 0o440}},
    ]
    for index in range(2):
        pod = {
            "metadata": {"name": f"box-{index}", "labels": {"i": str(index)}},
            "spec": {
                "hostname": f"box-{index}", "subdomain": "box",
                "containers": [container], "volumes": volumes,
            },
        }  # fmt: skip
        kinds["Pod"].create(body=pod, namespace="team")
    api.settle()
    assert (api.read("pods", "team", "box-0").get("status") or {}).get("phase") is None
    secret = {"metadata": {"name": "key"}, "data": {"id": "c2VjcmV0"}}  # "secret"
    admin.resources.get(api_version="v1", kind="Secret").create(body=secret, namespace="team")
    api.settle()
    box = api.read("pods", "team", "box-1")
    assert box["status"]["phase"] == "Running"
    key = "/etc/box-key/id"
    look = f"pwd; hostname; echo $GREETING $INDEX; cat {key}; echo; stat -c %a {key}"
    seen = api.runtime.run_in(box, ["sh", "-c", look], stdout=subprocess.PIPE, text=True)
    assert seen.communicate(timeout=30)[0].split("\n")[:5] == [
        "/home/dev", "box-1", "hi 1", "secret", "440",
    ]  # fmt: skip
    hosts = api.runtime.run_in(box, ["cat", "/etc/hosts"], stdout=subprocess.PIPE, text=True)
    lines = hosts.communicate(timeout=30)[0].splitlines()
    assert "127.0.0.1\tbox-0.box.team.svc.cluster.local\tbox-0.box\tbox-0" in lines
    assert not Path("/etc/box-key").exists()  # the pod's files are its own


def test_a_cluster_starts_with_its_system_namespaces_and_keeps_events_where_upstream_does(
    api, tmp_path
):
    """pkg/controlplane/controller/systemnamespaces; legacyValidateEvent in
    pkg/apis/core/validation/events.go: an Event about a Node (no namespace) lives in `default`
    (or, with an eventTime, `kube-system`), one about a pod in the pod's namespace, and one with
    an eventTime names who reports it."""
    assert {"default", "kube-system", "kube-public", "kube-node-lease"} <= {
        n["metadata"]["name"] for n in api.objects("namespaces")
    }
    core = client.CoreV1Api(kube_client(api, ADMIN, tmp_path))
    node = {"apiVersion": "v1", "kind": "Node", "name": "n", "uid": "u"}
    event = {"involvedObject": node, "reason": "R", "message": "m", "type": "Warning"}

    def create(namespace: str, name: str, **fields) -> str:
        body = {**event, "metadata": {"name": name}, **fields}
        try:
            core.create_namespaced_event(namespace, body)
        except client.ApiException as e:
            assert e.status == 422
            return json.loads(e.body)["message"]
        return "created"

    assert create("default", "n.1") == "created"
    assert create("kube-system", "n.2") == (
        'Event "n.2" is invalid: involvedObject.namespace: Invalid value: "": does not match '
        "event.namespace"
    )
    stamped = {"eventTime": "2026-11-24T10:00:00.000000Z"}
    assert create("kube-system", "n.3", **stamped) == (
        'Event "n.3" is invalid: reportingController: Required value; reportingInstance: '
        "Required value; action: Required value"
    )
    reported = {"reportingComponent": "c", "reportingInstance": "i", "action": "A"}
    assert create("kube-system", "n.4", **stamped, **reported) == "created"
    pod = {"apiVersion": "v1", "kind": "Pod", "name": "p", "namespace": "kube-public"}
    assert create("default", "p.1", involvedObject=pod).endswith("does not match event.namespace")
    assert create("kube-public", "p.2", involvedObject=pod) == "created"


def test_a_file_written_into_a_pod_never_lands_where_the_host_and_every_pod_share_it():
    """Pods see the host's /tmp (and /dev, /sys): a checkout there, its interpreter's folder on
    every pod's PATH included, would take a program written for one pod into all of them."""
    for path in ("/tmp/ci/.venv/bin/cat", "/tmp", "/dev/shm/cat", "relative/cat"):
        with pytest.raises(ValueError, match="not in the pod's own layer"):
            Kubelet().write({"metadata": {"uid": "none"}}, path, "#!/bin/sh\n")
