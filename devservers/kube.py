"""The Cluster boundary over the real Kubernetes API (the kubernetes Python client).

Every failure of a call (an HTTP error, a refused websocket upgrade of exec or port-forward, no
connection, no credentials, a timeout) leaves this module as an OSError carrying the API server's
one-line message: PermissionError for a 403 (RBAC), OSError otherwise. `get` of an absent object
is None.

Nothing the operator calls can hold it: every API request is bounded (connecting, then each read
of the answer: API_TIMEOUT), and `exec` (the operator's probes of a user's pod, whose shell the
user controls) is bounded in connecting and upgrading, in each read, in total (EXEC_SECONDS) and
in what it takes in (EXEC_OUTPUT_BYTES), after which it closes the connection.
"""

import contextlib
import json
import os
import ssl
import threading
import time
import urllib.request
from urllib.parse import quote

import certifi
from kubernetes import client, config, dynamic
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from kubernetes.dynamic.exceptions import ResourceNotFoundError
from kubernetes.stream import portforward, stream
from kubernetes.stream.ws_client import (
    ERROR_CHANNEL,
    STDERR_CHANNEL,
    STDOUT_CHANNEL,
    V4_CHANNEL_PROTOCOL,
    V5_CHANNEL_PROTOCOL,
    get_websocket_url,
)
from urllib3.exceptions import HTTPError
from websocket import (
    ABNF,
    WebSocket,
    WebSocketBadStatusException,
    WebSocketException,
    WebSocketTimeoutException,
)

from devservers.activity import ProbeCut, gpu_utilization
from devservers.api import DCGM_LABELS, DCGM_PORT, GROUP, SERVERS, VERSION
from devservers.render import Settings

DCGM_BYTES = 16 << 20  # an exporter's page for a node of 8 GPUs is tens of KiB
NOT_FOUND, CONFLICT = 404, 409
# (connect, read) seconds of every API request: the API server answers a get, list or patch in
# milliseconds, and a request that gets no answer must not hold an operator thread for good.
API_TIMEOUT = (10.0, 30.0)
# An exec into a pod: connecting and upgrading to a websocket, then the whole command. The probes
# (devservers.activity.PROBE, controller.WARN) take well under a second.
EXEC_CONNECT_SECONDS = 10.0
EXEC_SECONDS = 20.0
# What an exec may print before it is cut: the activity probe prints about 300 bytes per process,
# so this is some 14,000 processes.
EXEC_OUTPUT_BYTES = 4 << 20
# Connections kept to the API server: as many as threads use it at once (operator.CHECK_WORKERS
# idle checks and kopf's handlers), or urllib3 opens and drops one per request beyond it.
CONNECTIONS = 64
LOG_CHUNK = 64 << 10


def settings_from_env(environ=os.environ) -> Settings:
    """The platform's choices, passed to the operator's Deployment by the DevServers component."""
    defaults = Settings()

    def listed(name: str) -> tuple[str, ...]:
        return tuple(item for item in environ.get(name, "").split(",") if item)

    return Settings(
        ssh_cidrs=listed("DEVSERVERS_SSH_CIDRS"),
        vpc_cidr=environ.get("DEVSERVERS_VPC_CIDR", ""),
        idle_gpu_percent=float(
            environ.get("DEVSERVERS_IDLE_GPU_PERCENT", defaults.idle_gpu_percent)
        ),
        idle_cpu_percent=float(
            environ.get("DEVSERVERS_IDLE_CPU_PERCENT", defaults.idle_cpu_percent)
        ),
        allowed_images=listed("DEVSERVERS_ALLOWED_IMAGES"),
        require_image_digest=environ.get("DEVSERVERS_REQUIRE_IMAGE_DIGEST", "false") == "true",
        prices={k: float(v) for k, v in json.loads(environ.get("DEVSERVERS_PRICES", "{}")).items()},
        load_balancer_tags=environ.get("DEVSERVERS_LB_TAGS", ""),
        kept_prices={
            k: float(v) for k, v in json.loads(environ.get("DEVSERVERS_KEPT_PRICES", "{}")).items()
        },
        counted_stop_hours=float(
            environ.get("DEVSERVERS_COUNTED_STOP_HOURS", defaults.counted_stop_hours)
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
        elif isinstance(error, HTTPError | ConnectionError | TimeoutError):
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
    configuration = client.Configuration()
    configuration.connection_pool_maxsize = CONNECTIONS
    try:
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=configuration)
        else:
            paths = kubeconfig_paths()
            if not any(os.path.exists(p) for p in paths.split(os.pathsep) if p):
                raise OSError(
                    f"no kubeconfig at {paths}: set KUBECONFIG, or run `aws eks update-kubeconfig`"
                )
            config.load_kube_config(config_file=paths, client_configuration=configuration)
    except ConfigException as e:
        raise OSError(f"no cluster credentials: {e}") from None
    return client.ApiClient(configuration)


def _bounded(api_client: client.ApiClient) -> None:
    """Give every request of `api_client` that names no timeout of its own API_TIMEOUT (the
    client's default is none: a request with no answer waits for ever)."""
    request = api_client.request

    def bounded(*args, _request_timeout=None, **kwargs):
        return request(*args, _request_timeout=_request_timeout or API_TIMEOUT, **kwargs)

    api_client.request = bounded


def _websocket(configuration: client.Configuration, url: str, headers: dict) -> WebSocket:
    """kubernetes.stream.ws_client.create_websocket (its TLS options and subprotocols), but with
    the connection and the upgrade bounded by EXEC_CONNECT_SECONDS; no proxy, which the
    operator, in the cluster, never needs."""
    if url.startswith("wss://") and configuration.verify_ssl:
        options = {
            "cert_reqs": ssl.CERT_REQUIRED,
            "ca_certs": configuration.ssl_ca_cert or certifi.where(),
        }
        if configuration.assert_hostname is not None:
            options["check_hostname"] = configuration.assert_hostname
    else:
        options = {"cert_reqs": ssl.CERT_NONE}
    for key, value in (
        ("certfile", configuration.cert_file),
        ("keyfile", configuration.key_file),
        ("server_hostname", configuration.tls_server_name),
    ):
        if value:
            options[key] = value
    socket = WebSocket(sslopt=options)
    header = [f"{k}: {v}" for k, v in headers.items()]
    header.append(f"sec-websocket-protocol: {V5_CHANNEL_PROTOCOL},{V4_CHANNEL_PROTOCOL}")
    socket.connect(url, header=header, timeout=EXEC_CONNECT_SECONDS)
    return socket


class KubeCluster:
    """controller.Cluster for a real cluster: in-cluster credentials, or the local kubeconfig.
    Objects come back as the JSON the API server sent (`serialize=False`): the dynamic client's
    ResourceInstance, turned back into a dict, costs several times the JSON parsing, on every
    call of every idle check."""

    def __init__(self, api_client: client.ApiClient | None = None):
        api_client = api_client or _api_client()
        _bounded(api_client)
        self.api_client = api_client
        self.host = api_client.configuration.host
        self._dynamic: dynamic.DynamicClient | None = None  # made at first use (discovery)
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.dcgm_namespace = os.environ.get("DEVSERVERS_DCGM_NAMESPACE", "monitoring")
        # Resolved kinds, so that threads working at once look discovery up only once.
        self._resources: dict[tuple[str, str], object] = {}
        self._resources_lock = threading.Lock()

    @contextlib.contextmanager
    def _translated(self):
        try:
            yield
        except (ApiException, AttributeError, HTTPError, ConnectionError) as e:
            failure = _failure(e, self.host)
            if failure is None:
                raise
            raise failure from None

    def _api(self, api_version: str, kind: str):
        with self._resources_lock:
            if self._dynamic is None:
                with self._translated():
                    self._dynamic = dynamic.DynamicClient(self.api_client)
            if (api_version, kind) not in self._resources:
                try:
                    found = self._dynamic.resources.get(api_version=api_version, kind=kind)
                except ResourceNotFoundError:
                    served = f"the API server does not serve {kind} ({api_version})"
                    raise NotServed(served) from None
                self._resources[(api_version, kind)] = found
            return self._resources[(api_version, kind)]

    def get(self, api_version, kind, name, namespace):
        try:
            with self._translated():
                found = self._api(api_version, kind).get(
                    name=name, namespace=namespace, serialize=False
                )
        except ApiError as e:
            if e.status == NOT_FOUND:
                return None
            raise
        return json.loads(found.data)

    def list(self, api_version, kind, namespace, labels):
        selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        with self._translated():
            found = self._api(api_version, kind).get(
                namespace=namespace, label_selector=selector, serialize=False
            )
        return json.loads(found.data)["items"]

    def create(self, manifest):
        meta = manifest["metadata"]
        try:
            with self._translated():
                api = self._api(manifest["apiVersion"], manifest["kind"])
                created = api.create(
                    body=manifest, namespace=meta.get("namespace"), serialize=False
                )
                return json.loads(created.data)
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
        return b"".join(self.log_stream(namespace, pod, container, False)).decode(errors="replace")

    def log_stream(self, namespace: str, pod: str, container: str, follow: bool):
        """The container's log in chunks as they come (`follow`: until the container ends)."""
        with self._translated():
            found = self.core.read_namespaced_pod_log(
                pod,
                namespace,
                container=container,
                follow=follow,
                _preload_content=False,
                # A followed log may stay quiet for long (a slow step, a checkpoint).
                _request_timeout=(API_TIMEOUT[0], None) if follow else None,
            )
        try:
            yield from found.stream(LOG_CHUNK)
        finally:
            found.release_conn()

    def patch(self, api_version, kind, name, namespace, patch):
        with self._translated():
            api = self._api(api_version, kind)
            found = api.patch(
                body=patch,
                name=name,
                namespace=namespace,
                content_type="application/merge-patch+json",
                serialize=False,
            )
        return json.loads(found.data)

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
        """`command`'s output (stdout) in `pod`. An exec is a websocket GET, which the API server
        authorizes as `get` on pods/exec and, from Kubernetes 1.35, also as `create`.

        Bounded, unlike the client's stream(), which waits for ever to connect and to read, keeps
        all output, and swaps its ApiClient's request function while it runs (so no other thread
        may use that client meanwhile): connecting and upgrading (EXEC_CONNECT_SECONDS), the
        whole exec (EXEC_SECONDS) and its output (EXEC_OUTPUT_BYTES); past a bound the
        connection is closed and an OSError says which bound it was."""
        configuration = self.api_client.configuration
        query = [("command", part) for part in command]
        query += [("container", container), ("stdout", "true"), ("stderr", "false")]
        path = f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(pod)}/exec"
        headers: dict = {}
        self.api_client.update_params_for_auth(headers, [], ["BearerToken"])
        where = f"exec in {namespace}/{pod}"
        deadline = time.monotonic() + EXEC_SECONDS
        url = get_websocket_url(configuration.host + path, query)
        try:
            socket = _websocket(configuration, url, headers)
        except (WebSocketTimeoutException, TimeoutError):
            raise ProbeCut(f"{where}: no answer within {EXEC_CONNECT_SECONDS:g} s") from None
        except (WebSocketException, OSError) as e:
            raise _failure(e, self.host) or OSError(f"{where}: {e}") from None
        output = bytearray()
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                socket.settimeout(left)
                opcode, frame = socket.recv_data_frame(True)
                if opcode == ABNF.OPCODE_CLOSE:
                    return output.decode("utf-8", "replace")
                if opcode in (ABNF.OPCODE_BINARY, ABNF.OPCODE_TEXT) and frame.data:
                    data = frame.data if isinstance(frame.data, bytes) else frame.data.encode()
                    if data[0] == STDOUT_CHANNEL:
                        output += data[1:]
                        if len(output) > EXEC_OUTPUT_BYTES:
                            raise ProbeCut(
                                f"{where}: more than {EXEC_OUTPUT_BYTES} bytes of output; cut"
                            )
        except (TimeoutError, WebSocketTimeoutException):
            raise ProbeCut(f"{where}: not done within {EXEC_SECONDS:g} s; cut") from None
        except WebSocketException as e:
            raise OSError(f"{where}: {e}") from None
        finally:
            socket.shutdown()  # no closing handshake: nothing more is read from this pod

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
                value = gpu_utilization(response.read(DCGM_BYTES).decode(), namespace, names)
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
