"""The Cluster boundary over the real Kubernetes API (the kubernetes Python client)."""

import os
import urllib.request

from kubernetes import client, config, dynamic
from kubernetes.config.config_exception import ConfigException
from kubernetes.dynamic.exceptions import DynamicApiError, ForbiddenError, NotFoundError
from kubernetes.stream import stream

from devservers.activity import gpu_utilization
from devservers.api import GROUP, SERVERS, VERSION
from devservers.render import Settings

DCGM_PORT = 9400
DCGM_LABELS = {"app.kubernetes.io/name": "dcgm-exporter"}


def settings_from_env() -> Settings:
    """The platform's choices, passed to the operator's Deployment by the DevServers component."""
    cidrs = os.environ.get("DEVSERVERS_SSH_CIDRS", "")
    return Settings(
        home_storage_class=os.environ.get("DEVSERVERS_HOME_STORAGE_CLASS", "gp3"),
        ssh_cidrs=tuple(c for c in cidrs.split(",") if c),
    )


class _Denied:
    """A dynamic resource whose refusals are OSErrors with the API server's message: a 403 is
    PermissionError (the boundary's one error for RBAC), a 404 stays NotFoundError for `get`."""

    def __init__(self, resource):
        self._resource = resource

    def __getattr__(self, verb):
        method = getattr(self._resource, verb)

        def call(**kwargs):
            try:
                return method(**kwargs)
            except NotFoundError:
                raise
            except ForbiddenError as e:
                raise PermissionError(e.summary()) from None
            except DynamicApiError as e:
                raise OSError(f"the API server refused: {e.summary()}") from None

        return call


def _selector(labels: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


class KubeCluster:
    """controller.Cluster for a real cluster: in-cluster credentials, or the local kubeconfig."""

    def __init__(self, api_client: client.ApiClient | None = None):
        if api_client is None:
            try:
                config.load_config()
            except ConfigException as e:
                raise OSError(f"no cluster credentials: {e}") from None
            api_client = client.ApiClient()
        self.dynamic = dynamic.DynamicClient(api_client)
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.dcgm_namespace = os.environ.get("DEVSERVERS_DCGM_NAMESPACE", "monitoring")

    def _api(self, api_version: str, kind: str):
        return _Denied(self.dynamic.resources.get(api_version=api_version, kind=kind))

    def get(self, api_version, kind, name, namespace):
        try:
            return self._api(api_version, kind).get(name=name, namespace=namespace).to_dict()
        except NotFoundError:
            return None

    def list(self, api_version, kind, namespace, labels):
        found = self._api(api_version, kind).get(
            namespace=namespace, label_selector=_selector(labels)
        )
        return found.to_dict()["items"]

    def create(self, manifest):
        api = self._api(manifest["apiVersion"], manifest["kind"])
        return api.create(body=manifest, namespace=manifest["metadata"].get("namespace")).to_dict()

    def patch(self, api_version, kind, name, namespace, patch):
        api = self._api(api_version, kind)
        return api.patch(
            body=patch,
            name=name,
            namespace=namespace,
            content_type="application/merge-patch+json",
        ).to_dict()

    def delete(self, api_version, kind, name, namespace):
        try:
            self._api(api_version, kind).delete(
                name=name, namespace=namespace, body={"propagationPolicy": "Foreground"}
            )
        except NotFoundError:
            pass

    def patch_status(self, name, namespace, status):
        self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, SERVERS, name, {"status": status}
        )

    def exec(self, namespace, pod, container, command):
        return stream(
            self.core.connect_get_namespaced_pod_exec,
            pod,
            namespace,
            container=container,
            command=command,
            stderr=False,
            stdin=False,
            stdout=True,
            tty=False,
        )

    def gpu_utilization(self, namespace, pods):
        """Ask the DCGM exporter on each pod's node (it reports per pod); None without one."""
        exporters = {
            p["spec"].get("nodeName"): (p.get("status") or {}).get("podIP")
            for p in self.list("v1", "Pod", self.dcgm_namespace, DCGM_LABELS)
        }
        names = {p["metadata"]["name"] for p in pods}
        found = []
        for node in {p["spec"].get("nodeName") for p in pods}:
            address = exporters.get(node)
            if not address:
                continue
            url = f"http://{address}:{DCGM_PORT}/metrics"
            with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 (cluster-internal)
                value = gpu_utilization(response.read().decode(), namespace, names)
            if value is not None:
                found.append(value)
        return max(found) if found else None
