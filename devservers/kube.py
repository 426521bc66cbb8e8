"""The Cluster boundary over the real Kubernetes API (the kubernetes Python client).

Every failure of a call (an HTTP error, a refused websocket upgrade of exec or port-forward, no
connection, no credentials) leaves this module as an OSError carrying the API server's one-line
message: PermissionError for a 403 (RBAC), OSError otherwise. `get` of an absent object is None.
"""

import contextlib
import json
import os
import urllib.request

from kubernetes import client, config, dynamic
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from kubernetes.dynamic.exceptions import ResourceNotFoundError
from kubernetes.stream import portforward, stream
from kubernetes.stream.ws_client import ERROR_CHANNEL, STDERR_CHANNEL, STDOUT_CHANNEL
from urllib3.exceptions import MaxRetryError
from websocket import WebSocketBadStatusException, WebSocketException

from devservers.activity import gpu_utilization
from devservers.api import DCGM_LABELS, DCGM_PORT, GROUP, SERVERS, VERSION
from devservers.render import Settings

NOT_FOUND, CONFLICT = 404, 409


def settings_from_env() -> Settings:
    """The platform's choices, passed to the operator's Deployment by the DevServers component."""
    cidrs = os.environ.get("DEVSERVERS_SSH_CIDRS", "")
    defaults = Settings()
    return Settings(
        ssh_cidrs=tuple(c for c in cidrs.split(",") if c),
        vpc_cidr=os.environ.get("DEVSERVERS_VPC_CIDR", ""),
        idle_gpu_percent=float(
            os.environ.get("DEVSERVERS_IDLE_GPU_PERCENT", defaults.idle_gpu_percent)
        ),
        idle_cpu_percent=float(
            os.environ.get("DEVSERVERS_IDLE_CPU_PERCENT", defaults.idle_cpu_percent)
        ),
    )


class ApiError(OSError):
    """The API server answered `status` (an HTTP code) with `message`."""

    def __init__(self, status: int, message: str):
        super().__init__(f"the API server refused: {message}")
        self.status = status


class NotServed(OSError):
    """The API server does not serve a kind (its CRD is not installed)."""


class Forbidden(ApiError, PermissionError):
    """A 403: RBAC (or an admission rule) refused the request."""

    def __init__(self, status: int, message: str):
        OSError.__init__(self, message)
        self.status = status


def _status_message(body, fallback: str) -> str:
    """The `message` of a Status body, else `fallback`."""
    try:
        return json.loads(body)["message"]
    except (TypeError, ValueError, KeyError):
        return fallback


def _failure(error: BaseException, host: str) -> OSError | None:
    """The OSError that says what `error`, or an exception it was raised while handling, means.

    A refused websocket upgrade (exec, port-forward) reaches us from kubernetes 36's stream()
    as an AttributeError: it decodes the absent body of its own ApiException(status=0), whose
    context is websocket's WebSocketBadStatusException with the server's Status.
    """
    while error is not None:
        if isinstance(error, WebSocketBadStatusException):
            status, body = error.status_code, error.resp_body
        elif isinstance(error, ApiException) and error.status:
            status, body = error.status, error.body
        elif isinstance(error, MaxRetryError | ConnectionError):
            reason = getattr(error, "reason", None) or error
            return OSError(f"cannot reach the Kubernetes API server at {host}: {reason}")
        else:
            error = error.__context__
            continue
        message = _status_message(body, f"HTTP {status}")
        return (Forbidden if status == 403 else ApiError)(status, message)
    return None


def kubeconfig_paths() -> str:
    """$KUBECONFIG (paths joined by os.pathsep), else ~/.kube/config, as kubectl reads them.
    Read at each call: the client's own default is fixed when it is imported."""
    return os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")


def _api_client() -> client.ApiClient:
    """In a pod, its ServiceAccount's credentials; elsewhere the kubeconfig's current context."""
    try:
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config()
            return client.ApiClient()
        paths = kubeconfig_paths()
        if not any(os.path.exists(p) for p in paths.split(os.pathsep) if p):
            raise OSError(
                f"no kubeconfig at {paths}: set KUBECONFIG, or run `aws eks update-kubeconfig`"
            )
        return config.new_client_from_config(config_file=paths)
    except ConfigException as e:
        raise OSError(f"no cluster credentials: {e}") from None


class KubeCluster:
    """controller.Cluster for a real cluster: in-cluster credentials, or the local kubeconfig."""

    def __init__(self, api_client: client.ApiClient | None = None):
        api_client = api_client or _api_client()
        self.host = api_client.configuration.host
        with self._translated():
            self.dynamic = dynamic.DynamicClient(api_client)
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.dcgm_namespace = os.environ.get("DEVSERVERS_DCGM_NAMESPACE", "monitoring")

    @contextlib.contextmanager
    def _translated(self):
        try:
            yield
        except (ApiException, AttributeError, MaxRetryError, ConnectionError) as e:
            failure = _failure(e, self.host)
            if failure is None:
                raise
            raise failure from None

    def _api(self, api_version: str, kind: str):
        try:
            return self.dynamic.resources.get(api_version=api_version, kind=kind)
        except ResourceNotFoundError:
            raise NotServed(f"the API server does not serve {kind} ({api_version})") from None

    def get(self, api_version, kind, name, namespace):
        try:
            with self._translated():
                found = self._api(api_version, kind).get(name=name, namespace=namespace)
        except ApiError as e:
            if e.status == NOT_FOUND:
                return None
            raise
        return found.to_dict()

    def list(self, api_version, kind, namespace, labels):
        selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        with self._translated():
            found = self._api(api_version, kind).get(namespace=namespace, label_selector=selector)
        return found.to_dict()["items"]

    def create(self, manifest):
        meta = manifest["metadata"]
        try:
            with self._translated():
                api = self._api(manifest["apiVersion"], manifest["kind"])
                return api.create(body=manifest, namespace=meta.get("namespace")).to_dict()
        except ApiError as e:
            if e.status != CONFLICT:
                raise
        # Another reconcile of the same server created it first: take what is there.
        return self.get(
            manifest["apiVersion"], manifest["kind"], meta["name"], meta.get("namespace")
        )

    def log(self, namespace: str, pod: str, container: str) -> str:
        """What the container's current run (else its last) has written. Read raw: the client
        would otherwise parse a log that is one JSON line into a dict and print that."""
        with self._translated():
            found = self.core.read_namespaced_pod_log(
                pod, namespace, container=container, _preload_content=False
            )
        return found.data.decode(errors="replace")

    def patch(self, api_version, kind, name, namespace, patch):
        with self._translated():
            api = self._api(api_version, kind)
            found = api.patch(
                body=patch,
                name=name,
                namespace=namespace,
                content_type="application/merge-patch+json",
            )
        return found.to_dict()

    def delete(self, api_version, kind, name, namespace):
        try:
            with self._translated():
                self._api(api_version, kind).delete(
                    name=name, namespace=namespace, body={"propagationPolicy": "Foreground"}
                )
        except ApiError as e:
            if e.status != NOT_FOUND:
                raise

    def patch_status(self, name, namespace, status):
        with self._translated():
            self.custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, SERVERS, name, {"status": status}
            )

    def exec(self, namespace, pod, container, command):
        """`command`'s output in `pod`. The client's exec is a websocket GET, which the API
        server authorizes as `get` on pods/exec and, from Kubernetes 1.35, also as `create`."""
        with self._translated():
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

    def start(self, namespace, pod, container, command, stdin=False):
        """`command` running in `pod`, its output streamed (a RemoteProcess)."""
        with self._translated():
            client = stream(
                self.core.connect_get_namespaced_pod_exec,
                pod,
                namespace,
                container=container,
                command=command,
                stderr=True,
                stdin=stdin,
                stdout=True,
                tty=False,
                binary=True,
                _preload_content=False,
            )
        return RemoteProcess(client)

    @contextlib.contextmanager
    def connection(self, namespace: str, pod: str, port: int):
        """A socket to `port` of `pod` through the API server (pods/portforward over a
        websocket: `get` and, from 1.35, `create`). What the pod's side reported (nothing
        listening, say) is raised when the connection ends."""
        with self._translated():
            forward = portforward(
                self.core.connect_get_namespaced_pod_portforward, pod, namespace, ports=str(port)
            )
        try:
            yield forward.socket(port)
        finally:
            forward.close()
        if forward.error(port):
            raise OSError(f"port-forward to {pod}:{port}: {forward.error(port)}")

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


class RemoteProcess:
    """A command running in a pod over an exec websocket (kubernetes.stream's WSClient)."""

    CHUNK = 1 << 20  # stdin goes in websocket frames of at most this many bytes

    def __init__(self, client):
        self._client = client

    def write(self, data: bytes) -> None:
        for start in range(0, len(data), self.CHUNK):
            self._client.write_stdin(data[start : start + self.CHUNK])

    def read(self, timeout: float) -> tuple[bytes, bytes] | None:
        """What came on stdout and stderr within `timeout` seconds; None once it has ended and
        all was read."""
        client = self._client
        if client.is_open():
            try:
                client.update(timeout=timeout)
            except WebSocketException:
                client.close()
        out, err = client.read_channel(STDOUT_CHANNEL), client.read_channel(STDERR_CHANNEL)
        if not client.is_open() and not out and not err:
            return None
        return out, err

    def exit_code(self) -> int:
        """The command's exit code, from the Status the kubelet sends when it ends."""
        text = self._client.read_channel(ERROR_CHANNEL)
        if not text:
            raise OSError("the connection to the pod ended before the command did")
        return exit_code(text)


def exit_code(status: bytes | str) -> int:
    """An exec's exit code from its error channel's Status, read as client-go reads it
    (staging/src/k8s.io/client-go/tools/remotecommand/v4.go, errorDecoderV4.decode: Success is
    0; a Failure with reason NonZeroExitCode carries the code in a cause of reason ExitCode;
    anything else is an error with the Status's message)."""
    try:
        found = json.loads(status)
    except ValueError:
        raise OSError(f"error stream protocol error: {status!r}") from None
    if found.get("status") == "Success":
        return 0
    if found.get("status") != "Failure":
        raise OSError("error stream protocol error: unknown error")
    causes = (found.get("details") or {}).get("causes") or []
    if found.get("reason") == "NonZeroExitCode":
        codes = [c.get("message", "") for c in causes if c.get("reason") == "ExitCode"]
        if not codes:
            raise OSError("error stream protocol error: no ExitCode cause given")
        if not codes[0].isdigit() or int(codes[0]) > 255:
            raise OSError(f"error stream protocol error: invalid exit code value {codes[0]!r}")
        return int(codes[0])
    raise OSError(found.get("message") or "the command failed")
