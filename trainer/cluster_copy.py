"""A job's checkpoint folder on the cluster's FSx for Lustre or EFS, or in S3, read from outside
the cluster.

Those file systems are reachable only from inside the VPC, through the team's claims; the S3
prefix of a team's jobs only with the team's role (members have no rights of their own on the
bucket, nor on its KMS key). So a short-lived pod of the trainer image (Pod Security restricted)
is started in the team's namespace: mounting the claim read-only, or as the team's self-service
service account (SERVICE_ACCOUNT), whose Pod Identity role may read the team's checkpoints and
decrypt them (infra/components/team_jobs_identity.py). The steps are listed and the one asked
for is streamed out as a tar over the API server's exec (the kubernetes Python client): `find`
and `tar` on a file system, trainer/s3_folder.py in S3. The pod is deleted, whatever happened.
The user needs POD_RULES in that namespace and a kubeconfig for the cluster.

The pod names the team's queue: a team member's pods must (infra/components/team_access.py
POD_POLICY), and Kueue holds it behind a scheduling gate until the queue admits it, within the
team's quota.
"""

import io
import json
import os
import tarfile
import tempfile
import time
from pathlib import Path

from trainer import RESTRICTED_CONTAINER, RESTRICTED_POD, s3_folder

# Where job pods mount the shared file systems' claims that hold checkpoints, and those claims
# (the first of each store in workloads/manifests.py MOUNTS; a test keeps the two equal).
CLAIMS = {"/fsx/checkpoints": "fsx-checkpoints", "/efs": "efs-shared"}
# What the copy does in the team's namespace: create, read and delete its pod, and exec into it
# (a websocket GET, authorized as `get` and, from Kubernetes 1.35, also as `create`).
POD_RULES = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "delete"]},
    {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create", "get"]},
    # Without --queue, which queue the pod waits in.
    {"apiGroups": ["kueue.x-k8s.io"], "resources": ["localqueues"], "verbs": ["list"]},
]
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
LOCAL_QUEUES = ("kueue.x-k8s.io", "v1beta2")  # group, version (the only one Kueue 0.20 serves)
# The team's service account the pod reads S3 as (infra/config SELF_SERVICE_ACCOUNT; a test keeps
# the two equal): every team namespace has it, and its role reads the team's checkpoints.
SERVICE_ACCOUNT = "self-service-jobs"
# The program that reads S3 in the pod, sent as text: the image need not hold this revision.
S3_PROGRAM = Path(s3_folder.__file__).read_text()
# What Kueue's pod webhook gates a queued pod with until its queue admits it (kueue v0.19.2 and
# the 0.20 line for v0.20.7, pkg/controller/jobs/pod/constants: SchedulingGateName).
KUEUE_GATE = "kueue.x-k8s.io/admission"
# The pod's own end, should this process die before deleting it.
POD_SECONDS = 3600
POD_NAME = "checkpoint-copy"
# $1: the file, $2: its size. head reads exactly the file, so the command ends without the end of
# stdin, which the exec websocket can signal only from protocol v5; a reader sees the file whole
# (written under another name, then renamed).
PUT = 'mkdir -p "$(dirname "$1")" && head -c "$2" > "$1.part.$$" && mv -f "$1.part.$$" "$1"'
STDIN_CHUNK = 1 << 20


def _checkpoints():
    """trainer.checkpoint, imported when a checkpoint's steps are asked for: it imports torch,
    seconds of start-up that devctl's copies of any other file (submit, fetch) do without."""
    from trainer import checkpoint

    return checkpoint


def in_s3(path: str) -> bool:
    return path.startswith("s3://")


def claim_of(path: str) -> tuple[str, str]:
    """(mount path, claim) of a job's checkpoint folder; ValueError if on neither."""
    for mount, claim in CLAIMS.items():
        if path == mount or path.startswith(mount + "/"):
            return mount, claim
    raise ValueError(
        f"{path} is on neither of the cluster's shared file systems ({', '.join(CLAIMS)})"
    )


def copy_pod(namespace: str, path: str, image: str, queue: str, writable: bool = False) -> dict:
    """The pod that reads `path` (or, `writable`, writes it), in `queue`: mounting its claim, or
    as the team's service account for S3. It only sleeps while commands are exec'd."""
    container = {
        "name": "copy",
        "image": image,
        "command": ["sleep", str(POD_SECONDS)],
        "securityContext": RESTRICTED_CONTAINER,
        "resources": {
            "requests": {"cpu": "100m", "memory": "256Mi"},
            "limits": {"memory": "256Mi"},
        },
    }
    spec = {
        "restartPolicy": "Never",
        # Pod Identity mounts its own token; the pod never calls the Kubernetes API.
        "automountServiceAccountToken": False,
        "securityContext": RESTRICTED_POD,
        "containers": [container],
    }
    if in_s3(path):
        spec["serviceAccountName"] = SERVICE_ACCOUNT
    else:
        mount, claim = claim_of(path)
        read_only = {} if writable else {"readOnly": True}
        container["volumeMounts"] = [{"name": "checkpoints", "mountPath": mount, **read_only}]
        spec["volumes"] = [
            {"name": "checkpoints", "persistentVolumeClaim": {"claimName": claim, **read_only}}
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": f"{POD_NAME}-",
            "namespace": namespace,
            "labels": {"app.kubernetes.io/name": POD_NAME, QUEUE_LABEL: queue},
        },
        "spec": spec,
    }


class CommandFailed(OSError):
    """A command run in the pod ended with an error."""


def _refusal(error: BaseException) -> str | None:
    """The API server's one-line answer hidden in `error` or the errors it was raised from.

    A refused exec upgrade reaches us from the client's stream() as an AttributeError whose
    context is websocket's WebSocketBadStatusException, which carries the server's Status."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import MaxRetryError
    from websocket import WebSocketBadStatusException

    while error is not None:
        if isinstance(error, WebSocketBadStatusException):
            status, body = error.status_code, error.resp_body
        elif isinstance(error, ApiException) and error.status:
            status, body = error.status, error.body
        elif isinstance(error, MaxRetryError | ConnectionError):
            return f"cannot reach the Kubernetes API server ({getattr(error, 'reason', error)})"
        else:
            error = error.__context__
            continue
        try:
            return json.loads(body)["message"]
        except (TypeError, ValueError, KeyError):
            return f"the API server answered HTTP {status}"
    return None


def call(what: str, fn, *args, **kwargs):
    """`fn(*args, **kwargs)`; a refusal or an unreachable server as an OSError naming `what`."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:
        message = _refusal(e)
        if message is None:
            raise
        raise OSError(f"{what}: {message}") from None


def answer(what: str, fn, *args, **kwargs) -> dict:
    """The API object a call answers, as the server sent it (the client's typed models refuse
    objects it does not expect, such as a status of fields still unset)."""
    return json.loads(call(what, fn, *args, _preload_content=False, **kwargs).data)


def api_client():
    """A client of the kubeconfig's cluster, as the user: OSError without one."""
    from kubernetes import config
    from kubernetes.config.config_exception import ConfigException

    paths = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    if not any(os.path.exists(p) for p in paths.split(os.pathsep) if p):
        raise OSError(
            f"no kubeconfig at {paths}: set KUBECONFIG, or run `aws eks update-kubeconfig`"
        )
    try:
        return config.new_client_from_config(config_file=paths)
    except ConfigException as e:
        raise OSError(f"no cluster credentials: {e}") from None


class PodFolder:
    """A checkpoint folder in a pod: `with PodFolder(...) as folder:` starts the pod and deletes
    it on the way out. Every failure is an OSError saying what went wrong."""

    def __init__(
        self,
        namespace: str,
        path: str,
        image: str,
        queue: str,
        start_timeout: float,
        writable: bool = False,
    ):
        """`queue`: the LocalQueue the pod waits in; empty: the namespace's one LocalQueue.
        `writable`: the claim mounted read-write, for `put` (a file system's folder only)."""
        self.namespace, self.path, self.image = namespace, path.rstrip("/"), image
        self.queue, self.start_timeout, self.writable = queue, start_timeout, writable
        self.name = ""

    def where(self, step: int) -> str:
        return f"{self.path}/{_checkpoints().step_name(step)} (namespace {self.namespace})"

    _call = staticmethod(call)
    _object = staticmethod(answer)

    def __enter__(self) -> "PodFolder":
        from kubernetes import client

        self.core = client.CoreV1Api(api_client())
        self.queue = self.queue or self._the_queue(client.CustomObjectsApi(self.core.api_client))
        pod = copy_pod(self.namespace, self.path, self.image, self.queue, self.writable)
        created = self._object(
            f"creating a pod in namespace {self.namespace}",
            self.core.create_namespaced_pod,
            self.namespace,
            pod,
        )
        self.name = created["metadata"]["name"]
        try:
            self._wait_running()
        except BaseException:
            self._delete()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._delete()

    def _the_queue(self, custom) -> str:
        """The namespace's LocalQueue: a team's namespace has one, named after the team, which
        is not always the namespace's name (the stack may name it otherwise)."""
        found = self._object(
            f"listing the LocalQueues of namespace {self.namespace}",
            custom.list_namespaced_custom_object,
            *LOCAL_QUEUES,
            self.namespace,
            "localqueues",
        )
        names = sorted(q["metadata"]["name"] for q in found.get("items") or [])
        if len(names) != 1:
            held = f"LocalQueues {', '.join(names)}" if names else "no LocalQueue"
            raise OSError(f"namespace {self.namespace} has {held}: name the team's with --queue")
        return names[0]

    def _delete(self) -> None:
        self._object(
            f"deleting pod {self.name}",
            self.core.delete_namespaced_pod,
            self.name,
            self.namespace,
            grace_period_seconds=0,
        )

    def _wait_running(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        why = "not scheduled yet"
        while time.monotonic() < deadline:
            pod = self._object(
                f"reading pod {self.name}",
                self.core.read_namespaced_pod,
                self.name,
                self.namespace,
            )
            status = pod.get("status") or {}
            phase = status.get("phase")
            if phase == "Running":
                return
            if phase in ("Failed", "Succeeded"):
                raise OSError(f"pod {self.name} ended ({phase}) before the copy")
            waiting = [
                c["state"]["waiting"]
                for c in status.get("containerStatuses") or []
                if "waiting" in (c.get("state") or {})
            ]
            unmet = [
                c["message"]
                for c in status.get("conditions") or []
                if c.get("status") != "True" and c.get("message")
            ]
            if waiting:
                why = ": ".join(filter(None, (waiting[0].get("reason"), waiting[0].get("message"))))
            elif KUEUE_GATE in [g["name"] for g in pod["spec"].get("schedulingGates") or []]:
                why = f"queue {self.queue} has not admitted it: `kubectl get workloads` says why"
            elif unmet:
                why = unmet[0]
            time.sleep(0.5)
        raise OSError(
            f"pod {self.name} in namespace {self.namespace} did not start within "
            f"{self.start_timeout:.0f} s ({why})"
        )

    def _run(self, command: list[str], out, stdin: bytes | None = None) -> None:
        """Run `command` in the pod, its stdout written to `out` as it comes, `stdin` sent to
        it; OSError if it fails. stderr is not asked for: it would come mixed into the stream
        the client buffers."""
        from kubernetes.stream import stream
        from kubernetes.stream.ws_client import ERROR_CHANNEL

        connection = self._call(
            f"exec in pod {self.name}",
            stream,
            self.core.connect_get_namespaced_pod_exec,
            self.name,
            self.namespace,
            command=command,
            stdin=stdin is not None,
            stdout=True,
            stderr=False,
            tty=False,
            binary=True,
            _preload_content=False,
        )
        status = b""
        try:
            for start in range(0, len(stdin or b""), STDIN_CHUNK):
                connection.write_stdin(stdin[start : start + STDIN_CHUNK])
            while connection.is_open():
                connection.update(timeout=1)
                status += connection.read_channel(ERROR_CHANNEL)
                # read_all() hands over what came on stdout and empties the client's buffers,
                # which would otherwise keep the whole checkpoint in memory.
                out.write(connection.read_all())
            status += connection.read_channel(ERROR_CHANNEL)
            out.write(connection.read_all())
        finally:
            connection.close()
        answer = json.loads(status or b"{}")
        if answer.get("status") != "Success":
            raise CommandFailed(
                answer.get("message") or "the connection to the pod ended before the command did"
            )

    def _listing(self) -> list[str]:
        """The command that prints the folder's step folders and their files, one a line,
        relative to it."""
        if in_s3(self.path):
            return ["python", "-c", S3_PROGRAM, self.path]
        pattern = f"{self.path}/step-*"
        return ["find", self.path, "-mindepth", "1", "-maxdepth", "2", "-path", pattern,
                "-printf", "%P\\n"]  # fmt: skip

    def _archive(self, relative: str) -> list[str]:
        """The command that writes the folder's `relative` path as a tar stream on stdout."""
        if in_s3(self.path):
            return ["python", "-c", S3_PROGRAM, self.path, relative]
        return ["tar", "-C", self.path, "-cf", "-", relative]

    def steps(self) -> tuple[list[int], list[int]]:
        """(committed, uncommitted) steps, ascending, as trainer.checkpoint's stores see them."""
        listing = tempfile.SpooledTemporaryFile()
        try:
            self._run(self._listing(), listing)
        except CommandFailed as e:
            listing.seek(0)
            said = listing.read().decode(errors="replace").strip().splitlines()
            why = said[-1] if said and said[-1].startswith(s3_folder.ERROR) else str(e)
            raise OSError(
                f"cannot list {self.path} in namespace {self.namespace} (does the job write "
                f"its checkpoints there?): {why.removeprefix(s3_folder.ERROR)}"
            ) from None
        listing.seek(0)
        return _checkpoints().step_folders(listing.read().decode().splitlines())

    def copy(self, step: int, destination: Path) -> None:
        """Step `step`'s folder into `destination` (as `destination/step-NNNNNNNN`)."""
        hint = "a running job may have pruned it meanwhile: try again"
        self.copy_path(_checkpoints().step_name(step), destination, self.where(step), hint)

    def copy_path(self, relative: str, destination: Path, what: str = "", hint: str = "") -> None:
        """The folder's `relative` file or folder into `destination`, under the same path."""
        what = what or f"{self.path}/{relative} (namespace {self.namespace})"
        with tempfile.TemporaryFile(dir=destination) as archive:
            try:
                self._run(self._archive(relative), archive)
            except CommandFailed as e:
                said = f"copying {what} failed ({e})" + (f"; {hint}" if hint else "")
                raise OSError(said) from None
            archive.seek(0)
            with tarfile.open(fileobj=archive) as tar:
                tar.extractall(destination, filter="data")

    def put(self, relative: str, data: bytes) -> bool:
        """`data` as the file `relative` in the folder, unless it is there already (then nothing
        is sent): whether it was written."""
        path = f"{self.path}/{relative}"
        try:
            self._run(["test", "-f", path], io.BytesIO())
            return False
        except CommandFailed:
            pass
        try:
            self._run(["sh", "-c", PUT, "put", path, str(len(data))], io.BytesIO(), data)
        except CommandFailed as e:
            raise OSError(f"writing {path} in namespace {self.namespace} failed: {e}") from None
        return True
