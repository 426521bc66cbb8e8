"""The HTTP API, its object store and the control-plane controllers every cluster runs.

Upstream behaviour followed here (kubernetes/kubernetes v1.35 unless said otherwise):
- storage and REST verbs: staging/src/k8s.io/apiserver/pkg/registry/generic/registry/store.go
  (create with generateName, resourceVersion conflicts, deletion with finalizers and
  deletionTimestamp, `ShouldDeleteDuringUpdate`: an object being deleted goes when its last
  finalizer is removed; no new finalizers once deletion started), and a write that changes
  nothing is no write (no new resourceVersion, no watch event)
- status subresources: staging/src/k8s.io/apiextensions-apiserver/pkg/registry/customresource/
  strategy.go and status_strategy.go (the main resource ignores .status, /status takes nothing
  else); generation counts changes outside metadata and status
- CRD structural schemas: defaulting, pruning of unknown fields, then validation (422)
  (staging/src/k8s.io/apiextensions-apiserver/pkg/apiserver/schema/{defaulting,pruning})
- watch: staging/src/k8s.io/apiserver/pkg/storage/cacher/cache_watcher.go (no resourceVersion or
  "0": ADDED for every object, then changes; an object leaving a label selector is DELETED)
- patch: RFC 7386 merge patch and RFC 6902 JSON patch (a failed `test` is 422, which kopf
  expects); strategic merge patch is not implemented here and answered 415
- namespaces: pkg/controller/namespace/deletion/namespaced_resources_deleter.go (a terminating
  namespace's objects are deleted, it goes when they are gone) and the NamespaceLifecycle
  admission plugin (no new objects in a terminating namespace)
- garbage collection: pkg/controller/garbagecollector/garbagecollector.go (dependents of absent
  owners are deleted; `foregroundDeletion` waits for dependents with blockOwnerDeletion;
  `orphan` strips owner references)
- the namespaces every cluster has from its start (pkg/controlplane/controller/systemnamespaces:
  default, kube-system, kube-public, kube-node-lease)
- core/v1 Events: where one may live (pkg/apis/core/validation/events.go, legacyValidateEvent:
  an Event about a cluster-scoped object, such as a Node, only in `default`, or in `kube-system`
  too when it has an eventTime; about a namespaced object, only in that object's namespace) and
  what one with an eventTime must name
- pods/exec and pods/portforward: the websocket protocols of
  staging/src/k8s.io/apimachinery/pkg/util/httpstream/wsstream (v5/v4.channel.k8s.io: a channel
  byte per message, stdout 1, stderr 2, the exit Status on 3; port-forward: channels 2i data and
  2i+1 errors, each opened by a frame with the port) and their authorization: the upgrade is a
  GET (verb `get`) and also needs `create` (pkg/registry/core/pod/rest/authorize.go, on by
  default from 1.35)
- pods/log: the container run whose log a GET returns, from the pod's status, as the kubelet
  picks it (pkg/kubelet/kubelet_pods.go, validateContainerLogStatus): `previous` the last
  terminated run (400 without one), else the running container, else the terminated one, else
  (waiting to restart) the last terminated one; the
  log text is what the test says each container ID wrote (`KubeAPI.container_logs`)
- ValidatingAdmissionPolicies (`KubeAPI.policies`, each bound with validationActions Deny) on a
  user's create, after mutating admission, their CEL evaluated by infra.core.tests.admission_rules;
  a refusal as staging/src/k8s.io/apiserver/pkg/admission/plugin/policy/validating/dispatcher.go
  makes it: `<resource> "<name>" is forbidden: ValidatingAdmissionPolicy '<policy>' with binding
  '<binding>' denied request: <message>`, code 422 for the reason Invalid (every policy's here)
"""

import asyncio
import copy
import json
import re
import secrets
import threading
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from urllib.parse import parse_qs

from aiohttp import web
from jsonschema import FormatChecker
from openapi_schema_validator import OAS30Validator

from infra.core.tests.admission_rules import refusals
from tests.kube_api.rbac import Authorizer, RequestInfo, User, forbidden, request_info

VERSION = {"major": "1", "minor": "35", "gitVersion": "v1.35.0", "platform": "linux/amd64"}
READ_WRITE = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
CONNECT = {"exec": "PodExecOptions", "portforward": "PodPortForwardOptions"}


@dataclass(frozen=True)
class Kind:
    """A served resource: what discovery lists and the store keeps apart."""

    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool
    subresources: tuple[str, ...] = ()
    schema: dict | None = field(default=None, compare=False)  # a CRD version's openAPIV3Schema

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


BUILTIN = [
    Kind("", "v1", "Namespace", "namespaces", False, ("status", "finalize")),
    Kind("", "v1", "Node", "nodes", False, ("status",)),
    Kind("", "v1", "Pod", "pods", True, ("status", "exec", "portforward", "log")),
    Kind("", "v1", "Service", "services", True, ("status",)),
    Kind("", "v1", "ConfigMap", "configmaps", True),
    Kind("", "v1", "Secret", "secrets", True),
    Kind("", "v1", "PersistentVolumeClaim", "persistentvolumeclaims", True, ("status",)),
    Kind("", "v1", "ResourceQuota", "resourcequotas", True, ("status",)),
    Kind("", "v1", "Event", "events", True),
    Kind("apps", "v1", "StatefulSet", "statefulsets", True, ("status",)),
    Kind("networking.k8s.io", "v1", "NetworkPolicy", "networkpolicies", True),
    Kind(
        "apiextensions.k8s.io",
        "v1",
        "CustomResourceDefinition",
        "customresourcedefinitions",
        False,
        ("status",),
    ),
]


class ApiError(Exception):
    """A failure the API answers with a Status body."""

    def __init__(self, code: int, reason: str, message: str, details: dict | None = None):
        super().__init__(message)
        self.status = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "details": details or {},
            "code": code,
        }

    def response(self) -> web.Response:
        return reply(self.status, status=self.status["code"])


def reply(obj, status: int = 200) -> web.Response:
    """JSON as kube-apiserver sends it (Content-Type without a charset, which clients compare)."""
    body = json.dumps(obj).encode()
    return web.Response(body=body, status=status, headers={"Content-Type": "application/json"})


def _not_found(kind: Kind, name: str) -> ApiError:
    details = {"name": name, "group": kind.group, "kind": kind.plural}
    return ApiError(404, "NotFound", f'{kind.qualified} "{name}" not found', details)


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_patch(target, patch):
    """RFC 7386: mappings merge, null removes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    target = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        else:
            target[key] = merge_patch(target.get(key), value)
    return target


def _pointer(path: str) -> list[str]:
    return [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]


def json_patch(document, operations: list[dict]):
    """RFC 6902: add, remove, replace, move, copy and test; a failed test refuses the patch."""

    def parent(doc, path):
        *head, last = _pointer(path)
        for part in head:
            doc = doc[int(part)] if isinstance(doc, list) else doc[part]
        return doc, last

    def get(doc, path):
        container, last = parent(doc, path)
        return container[int(last)] if isinstance(container, list) else container[last]

    def remove(doc, path):
        container, last = parent(doc, path)
        return container.pop(int(last) if isinstance(container, list) else last)

    def add(doc, path, value):
        container, last = parent(doc, path)
        if isinstance(container, list):
            container.insert(len(container) if last == "-" else int(last), value)
        else:
            container[last] = value

    document = copy.deepcopy(document)
    for op in operations:
        try:
            kind, path = op["op"], op["path"]
            if kind == "test":
                if get(document, path) != op["value"]:
                    raise ApiError(422, "Invalid", f"the server rejected our request: test {path}")
            elif kind == "remove":
                remove(document, path)
            elif kind == "add":
                add(document, path, copy.deepcopy(op["value"]))
            elif kind == "replace":
                remove(document, path)
                add(document, path, copy.deepcopy(op["value"]))
            elif kind in ("move", "copy"):
                value = get(document, op["from"])
                if kind == "move":
                    remove(document, op["from"])
                add(document, path, copy.deepcopy(value))
            else:
                raise ApiError(400, "BadRequest", f"unknown JSON patch op {kind!r}")
        except (KeyError, IndexError, ValueError, TypeError) as e:
            raise ApiError(422, "Invalid", f"the server rejected our request: {op}: {e}") from e
    return document


def _selector_terms(text: str) -> list[str]:
    """Split a selector on the commas outside `in (a,b)` sets."""
    return [t.strip() for t in re.split(r",(?![^()]*\))", text) if t.strip()]


def labels_match(selector: str, labels: dict) -> bool:
    """staging/src/k8s.io/apimachinery/pkg/labels/selector.go: =, ==, !=, in, notin, key, !key."""
    for term in _selector_terms(selector):
        if match := re.fullmatch(r"(\S+)\s+(in|notin)\s+\((.*)\)", term):
            key, op, values = match.groups()
            inside = labels.get(key) in {v.strip() for v in values.split(",")}
            if inside != (op == "in"):
                return False
        elif match := re.fullmatch(r"(\S+?)\s*(==|!=|=)\s*(\S*)", term):
            key, op, value = match.groups()
            if (labels.get(key) == value) != (op != "!="):
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def fields_match(selector: str, obj: dict) -> bool:
    """Field selectors by dotted path (metadata.name, metadata.namespace, status.phase...)."""
    for term in _selector_terms(selector):
        path, op, value = re.fullmatch(r"([^!=]+?)\s*(==|!=|=)\s*(.*)", term).groups()
        found = obj
        for part in path.split("."):
            found = found.get(part) if isinstance(found, dict) else None
        if (str(found if found is not None else "") == value) != (op != "!="):
            return False
    return True


# The `format`s of CRD schemas the API server checks that the project's CRDs use: date-time
# (k8s.io/apiextensions-apiserver pkg/apiserver/validation/formats.go, supportedVersionedFormats).
FORMATS = FormatChecker(["date-time"])


def event_errors(event: dict) -> list[str]:
    """legacyValidateEvent (pkg/apis/core/validation/events.go), which every core/v1 Event passes
    on create and update. Not modelled: the format checks of reportingController (a qualified
    name) and of the namespace (a DNS subdomain)."""
    namespace = event["metadata"].get("namespace", "")
    involved = (event.get("involvedObject") or {}).get("namespace", "")
    mismatch = (
        f'involvedObject.namespace: Invalid value: "{involved}": does not match event.namespace'
    )
    if not event.get("eventTime"):
        # "event.Namespace must also be empty (or "default", for compatibility with old clients)"
        allowed = (namespace in ("", "default")) if not involved else namespace == involved
        return [] if allowed else [mismatch]
    errors = []
    if not involved and namespace not in ("default", "kube-system"):
        errors.append(mismatch)
    # (the path upstream names, the v1 field, its length limit): the v1 API's reportingComponent
    # is the internal reportingController.
    for path, field_name, limit in (
        ("reportingController", "reportingComponent", None),
        ("reportingInstance", "reportingInstance", 128),
        ("action", "action", 128),
        ("reason", "reason", 128),
    ):
        value = event.get(field_name) or ""
        if not value:
            errors.append(f"{path}: Required value")
        elif limit and len(value) > limit:
            errors.append(f'{path}: Invalid value: "": can have at most {limit} characters')
    if len(event.get("message") or "") > 1024:
        errors.append('message: Invalid value: "": can have at most 1024 characters')
    return errors


def _structural(schema: dict, value, root: bool = False):
    """Defaults filled in and unknown fields pruned, as a CRD's structural schema does."""
    if isinstance(value, dict) and schema.get("type") == "object":
        if schema.get("x-kubernetes-preserve-unknown-fields"):
            return value
        properties = schema.get("properties")
        if properties is not None:
            kept = {"apiVersion", "kind", "metadata"} if root else set()
            value = {k: v for k, v in value.items() if k in properties or k in kept}
            for key, sub in properties.items():
                if key not in value and "default" in sub:
                    value[key] = copy.deepcopy(sub["default"])
                if key in value and not (root and key == "metadata"):
                    value[key] = _structural(sub, value[key])
        elif isinstance(schema.get("additionalProperties"), dict):
            value = {k: _structural(schema["additionalProperties"], v) for k, v in value.items()}
    elif isinstance(value, list) and "items" in schema:
        value = [_structural(schema["items"], v) for v in value]
    return value


def query_bool(query: dict[str, list[str]], name: str) -> bool:
    """A boolean query parameter as the API server reads it (apimachinery pkg/runtime,
    Convert_Slice_string_To_bool): absent, "0" or any case of "false" is false, anything else
    true (the Python client sends "True")."""
    values = query.get(name)
    return bool(values) and values[0] != "0" and values[0].lower() != "false"


class KubeAPI:
    """A Kubernetes API server on 127.0.0.1 (see the package docstring).

    Runs aiohttp on its own event loop in a thread. Everything that touches the store runs on
    that loop: request handlers, watch streams and the controllers (plain functions of this
    object, run after writes until they change nothing). Tests read the store through
    `objects`/`read` and wait with `settle`.
    """

    def __init__(self, authorizer: Authorizer, kinds: list[Kind] = BUILTIN):
        self.authorizer = authorizer
        self.kinds: dict[tuple[str, str, str], Kind] = {}
        for kind in kinds:
            self.serve(kind)
        self.store: dict[tuple[str, str, str, str], dict] = {}  # (group, plural, ns, name)
        # The same objects by (group, plural), then namespace, then name: what a list reads, so
        # that a list costs what it returns, not the whole store.
        self.by_kind: dict[tuple[str, str], dict[str, dict[str, dict]]] = {}
        self.history: list[tuple[int, Kind, str, dict, dict | None]] = []
        self.revision = 0
        self.tokens: dict[str, User] = {}
        self.refusals: list[str] = []  # every 403, as its message
        self.requests: list[tuple[str, str]] = []  # (user, "verb resource") of every request
        self.controllers = [garbage_collector, namespace_controller, crd_controller]
        # Mutating admission on create, as webhooks do: functions of (kind, object).
        self.admission = []
        # Validating admission on a user's create: policy name -> ValidatingAdmissionPolicy spec.
        self.policies: dict[str, dict] = {}
        self.runtime = None  # serves exec and port-forward (tests.kube_api.kubelet.Kubelet)
        self.container_logs: dict[str, str] = {}  # containerID -> what that run wrote
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._dirty = asyncio.Event()
        self._tick: asyncio.Future | None = None
        self._stopping = False

    # lifecycle (from the test's thread)

    def start(self) -> "KubeAPI":
        ready = threading.Event()
        threading.Thread(target=self._run, args=(ready,), daemon=True).start()
        ready.wait(10)
        return self

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._serve)
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=1)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        port = site._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self._tick = self._loop.create_future()
        self._controllers_task = self._loop.create_task(self._control())
        namespaces = self.kinds[("", "v1", "namespaces")]
        for name in SYSTEM_NAMESPACES:
            self.create(namespaces, "", {"metadata": {"name": name}})
        ready.set()
        self._loop.run_forever()

    def stop(self) -> None:
        async def shutdown():
            self._stopping = True
            self._notify()
            self._controllers_task.cancel()
            if self.runtime is not None:
                self.runtime.stop()
            await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)

    def call(self, fn, *args):
        """Run `fn(*args)` on the API's loop (a coroutine function is awaited) and return."""

        async def run():
            result = fn(*args)
            return await result if asyncio.iscoroutine(result) else result

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(60)

    def settle(self, timeout: float = 90) -> None:
        """Wait until the controllers and the kubelet have nothing left to do. The kubelet sets up
        a container in seconds here, in tens of them on a 2-core machine under load: the
        timeout is for a hang, not a measure."""

        def busy() -> bool:
            return self._dirty.is_set() or bool(self.runtime and self.runtime.busy())

        async def settled():
            while busy():
                if self._controllers_task.done():  # a controller raised: say what, not a timeout
                    self._controllers_task.result()
                await asyncio.sleep(0.002)

        asyncio.run_coroutine_threadsafe(asyncio.wait_for(settled(), timeout), self._loop).result()

    def add_token(self, who: User) -> str:
        token = secrets.token_urlsafe(24)
        self.tokens[token] = who
        return token

    def kubeconfig(self, token: str, namespace: str | None = None) -> dict:
        context = {"cluster": "local", "user": "user"}
        if namespace:
            context["namespace"] = namespace
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "local", "cluster": {"server": self.url}}],
            "users": [{"name": "user", "user": {"token": token}}],
            "contexts": [{"name": "local", "context": context}],
            "current-context": "local",
        }

    # reading (from the test's thread)

    def objects(self, plural: str, namespace: str | None = None, group: str = "") -> list[dict]:
        return self.call(
            lambda: [
                copy.deepcopy(o)
                for (g, p, ns, _), o in sorted(self.store.items())
                if (g, p) == (group, plural) and namespace in (None, ns)
            ]
        )

    def read(self, plural: str, namespace: str, name: str, group: str = "") -> dict | None:
        return self.call(lambda: copy.deepcopy(self.store.get((group, plural, namespace, name))))

    # the store (on the API's loop)

    def serve(self, kind: Kind) -> None:
        self.kinds[(kind.group, kind.version, kind.plural)] = kind

    def _notify(self) -> None:
        if self._tick is not None and not self._tick.done():
            self._tick.set_result(None)
        self._tick = self._loop.create_future()
        self._dirty.set()

    def _commit(self, kind: Kind, event: str, obj: dict, old: dict | None) -> dict:
        self.revision += 1
        obj["metadata"]["resourceVersion"] = str(self.revision)
        meta = obj["metadata"]
        key = (kind.group, kind.plural, meta.get("namespace", ""), meta["name"])
        names = self.by_kind.setdefault(key[:2], {}).setdefault(key[2], {})
        if event == "DELETED":
            del self.store[key]
            del names[key[3]]
        else:
            self.store[key] = obj
            names[key[3]] = obj
        self.history.append((self.revision, kind, event, obj, old))
        self._notify()
        return obj

    def get(self, kind: Kind, namespace: str, name: str) -> dict:
        found = self.store.get((kind.group, kind.plural, namespace, name))
        if found is None:
            raise _not_found(kind, name)
        return found

    def select(self, kind: Kind, namespace: str = "", labels: str = "", fields: str = ""):
        """Objects of `kind` (of `namespace`, unless empty) matching the selectors, sorted by
        namespace and name."""
        spaces = self.by_kind.get((kind.group, kind.plural), {})
        chosen = [namespace] if namespace else sorted(spaces)
        return [
            o
            for ns in chosen
            for _, o in sorted(spaces.get(ns, {}).items())
            if labels_match(labels, o["metadata"].get("labels") or {}) and fields_match(fields, o)
        ]

    def _admit(self, kind: Kind, obj: dict) -> dict:
        if (kind.group, kind.plural) == ("", "events") and (errors := event_errors(obj)):
            name = obj["metadata"].get("name", "")
            message = f'Event "{name}" is invalid: {"; ".join(errors)}'
            raise ApiError(422, "Invalid", message, {"name": name, "kind": kind.kind})
        if kind.schema is None:
            return obj
        obj = _structural(kind.schema, obj, root=True)
        errors = [
            f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
            for e in OAS30Validator(kind.schema, format_checker=FORMATS).iter_errors(obj)
        ]
        if errors:
            name = obj["metadata"].get("name", "")
            message = f'{kind.kind}.{kind.group} "{name}" is invalid: {"; ".join(errors)}'
            raise ApiError(422, "Invalid", message, {"name": name, "kind": kind.kind})
        return obj

    def create(self, kind: Kind, namespace: str, body: dict, who: User | None = None) -> dict:
        """Store a new object; `who`: the user whose request it is (None: a controller here)."""
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if kind.namespaced:
            if meta.setdefault("namespace", namespace) != namespace:
                raise ApiError(
                    400,
                    "BadRequest",
                    "the namespace of the provided object does not match the namespace sent on "
                    "the request",
                )
            home = self.store.get(("", "namespaces", "", namespace))
            if home is None:
                raise _not_found(self.kinds[("", "v1", "namespaces")], namespace)
            if home["metadata"].get("deletionTimestamp"):
                raise ApiError(
                    403,
                    "Forbidden",
                    f'{kind.qualified} "{meta.get("name", "")}" is forbidden: unable to create '
                    f"new content in namespace {namespace} because it is being terminated",
                )
        else:
            meta.pop("namespace", None)
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise ApiError(422, "Invalid", "metadata.name: Required value")
            meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
        if (kind.group, kind.plural, meta.get("namespace", ""), meta["name"]) in self.store:
            raise ApiError(
                409,
                "AlreadyExists",
                f'{kind.qualified} "{meta["name"]}" already exists',
                {"name": meta["name"], "group": kind.group, "kind": kind.plural},
            )
        obj["apiVersion"], obj["kind"] = kind.api_version, kind.kind
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now(), generation=1)
        meta.pop("deletionTimestamp", None)
        # Status is the /status subresource's, except a Node's: "Nodes allow *all* fields,
        # including status, to be set on create" (pkg/registry/core/node/strategy.go).
        if "status" in kind.subresources and kind.plural != "nodes":
            obj.pop("status", None)
        if kind.plural == "namespaces":
            obj["spec"] = {"finalizers": ["kubernetes"]}
            obj["status"] = {"phase": "Active"}
        for webhook in self.admission:
            webhook(kind, obj)
        if who is not None:
            self._validate(who, kind, obj)
        return self._commit(kind, "ADDED", self._admit(kind, obj), None)

    def _validate(self, who: User, kind: Kind, obj: dict) -> None:
        meta = obj["metadata"]
        namespace = self.store.get(("", "namespaces", "", meta.get("namespace", "")))
        for name, policy in self.policies.items():
            refused = refusals(
                policy,
                "CREATE",
                obj,
                username=who.name,
                groups=who.groups,
                namespace=namespace,
                resource=(kind.group, kind.plural),
            )
            if refused:
                denial = f"ValidatingAdmissionPolicy '{name}' with binding '{name}' denied request"
                raise ApiError(
                    422,
                    "Invalid",
                    f'{kind.qualified} "{meta["name"]}" is forbidden: {denial}: {refused[0]}',
                    {"name": meta["name"], "group": kind.group, "kind": kind.plural},
                )

    def replace(self, kind: Kind, old: dict, new: dict) -> dict:
        """Store `new` in place of `old`: the one path of every update, patch and controller."""
        new = copy.deepcopy(new)
        meta, previous = new.setdefault("metadata", {}), old["metadata"]
        for key in ("uid", "creationTimestamp", "deletionTimestamp", "name", "namespace"):
            if key in previous:
                meta[key] = previous[key]
            else:
                meta.pop(key, None)
        new["apiVersion"], new["kind"] = kind.api_version, kind.kind
        if previous.get("deletionTimestamp"):
            added = set(meta.get("finalizers") or []) - set(previous.get("finalizers") or [])
            if added:
                raise ApiError(
                    422,
                    "Invalid",
                    f"metadata.finalizers: Forbidden: no new finalizers can be added if the "
                    f"object is being deleted, found new finalizers {sorted(added)}",
                )
        body = {k: v for k, v in new.items() if k not in ("metadata", "status")}
        before = {k: v for k, v in old.items() if k not in ("metadata", "status")}
        meta["generation"] = previous.get("generation", 1) + (body != before)
        new = self._admit(kind, new)
        meta = new["metadata"]
        meta["resourceVersion"] = previous["resourceVersion"]
        # A namespace is held by its spec.finalizers too (the namespace controller's).
        held = meta.get("finalizers")
        if kind.plural == "namespaces":
            held = held or (new.get("spec") or {}).get("finalizers")
        if meta.get("deletionTimestamp") and not held:
            return self._commit(kind, "DELETED", new, old)
        if new == old:
            return old
        return self._commit(kind, "MODIFIED", new, old)

    def delete(self, kind: Kind, obj: dict, propagation: str = "Background") -> dict:
        meta = obj["metadata"]
        if meta.get("deletionTimestamp"):
            return obj
        new = copy.deepcopy(obj)
        if kind.plural == "namespaces":
            new["status"] = {**(new.get("status") or {}), "phase": "Terminating"}
        finalizers = list(meta.get("finalizers") or [])
        extra = {"Foreground": "foregroundDeletion", "Orphan": "orphan"}.get(propagation)
        if extra and extra not in finalizers:
            finalizers.append(extra)
        if not finalizers and kind.plural != "namespaces":
            return self._commit(kind, "DELETED", new, obj)
        new["metadata"].update(
            finalizers=finalizers, deletionTimestamp=now(), deletionGracePeriodSeconds=0
        )
        return self._commit(kind, "MODIFIED", new, obj)

    async def _control(self) -> None:
        while True:
            await self._dirty.wait()
            await asyncio.sleep(0.002)  # let a burst of writes land first
            self._dirty.clear()
            for controller in [*self.controllers, *getattr(self.runtime, "controllers", [])]:
                try:
                    controller(self)
                except ApiError:
                    self._dirty.set()  # a conflict with a concurrent write: run again

    # HTTP

    async def _serve(self, request: web.Request) -> web.StreamResponse:
        header = request.headers.get("Authorization", "")
        who = self.tokens.get(header.removeprefix("Bearer ").strip())
        if who is None:
            return ApiError(401, "Unauthorized", "Unauthorized").response()
        info = request_info(request.method, request.path, request.query_string)
        self.requests.append((who.name, f"{info.verb} {info.path}"))
        if not self.authorizer.allows(who, info):
            return self._refuse(who, info)
        try:
            if not info.is_resource:
                return self._discovery(info)
            kind = self.kinds.get((info.api_group, info.api_version, info.resource))
            if kind is None or (info.subresource and info.subresource not in kind.subresources):
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            if info.subresource in CONNECT:
                # authorize.go: the websocket upgrade is a `get`; exec, attach and port-forward
                # also need `create`.
                if info.verb != "create" and not self.authorizer.allows(
                    who, info.with_verb("create")
                ):
                    return self._refuse(who, info, reason="")
                pod = self.get(kind, info.namespace, info.name)
                return await self.runtime.connect(request, info.subresource, pod)
            if info.subresource == "log":
                pod = self.get(kind, info.namespace, info.name)
                return self._log(pod, parse_qs(request.query_string, keep_blank_values=True))
            return await self._rest(request, kind, info, who)
        except ApiError as e:
            return e.response()

    def _log(self, pod: dict, query: dict) -> web.Response:
        """validateContainerLogStatus: which run of the container the log is read from."""
        name = pod["metadata"]["name"]
        containers = [c["name"] for c in pod["spec"]["containers"]]
        container = query.get("container", containers[:1] if len(containers) == 1 else [""])[0]
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        found = next((s for s in statuses if s["name"] == container), None)
        if found is None:
            raise ApiError(
                400, "BadRequest", f'container "{container}" in pod "{name}" is not available'
            )
        state, last = found.get("state") or {}, found.get("lastState") or {}
        if query_bool(query, "previous"):
            run = (last.get("terminated") or {}).get("containerID")
            if not run:
                raise ApiError(
                    400,
                    "BadRequest",
                    f'previous terminated container "{container}" in pod "{name}" not found',
                )
        elif "running" in state:
            run = found.get("containerID")
        elif "terminated" in state:
            run = state["terminated"].get("containerID")
        elif "terminated" in last:  # waiting to restart: the run before
            run = last["terminated"].get("containerID")
        else:
            reason = (state.get("waiting") or {}).get("reason", "")
            raise ApiError(
                400,
                "BadRequest",
                f'container "{container}" in pod "{name}" is waiting to start: {reason}',
            )
        return web.Response(text=self.container_logs.get(run, ""), content_type="text/plain")

    def _refuse(self, who: User, info: RequestInfo, reason: str | None = None) -> web.Response:
        status = forbidden(who, info, reason)
        self.refusals.append(status["message"])
        return reply(status, status=403)

    def _discovery(self, info: RequestInfo) -> web.Response:
        groups: dict[str, list[str]] = {}
        for k in self.kinds.values():
            groups.setdefault(k.group, [])
            if k.version not in groups[k.group]:
                groups[k.group].append(k.version)
        path = info.path.rstrip("/")
        if path in ("/version", "/healthz", "/livez", "/readyz"):
            return reply(VERSION) if path == "/version" else web.Response(text="ok")
        if path == "/api":
            return reply({"kind": "APIVersions", "versions": groups[""]})

        def group_doc(name: str) -> dict:
            versions = [{"groupVersion": f"{name}/{v}", "version": v} for v in groups[name]]
            return {"name": name, "versions": versions, "preferredVersion": versions[0]}

        if path == "/apis":
            listed = [group_doc(g) for g in sorted(groups) if g]
            return reply({"kind": "APIGroupList", "apiVersion": "v1", "groups": listed})
        parts = path.strip("/").split("/")
        if parts[0] == "apis" and len(parts) == 2 and parts[1] in groups:
            return reply({"kind": "APIGroup", "apiVersion": "v1", **group_doc(parts[1])})
        group, version = ("", parts[1]) if parts[0] == "api" else (parts[1], parts[-1])
        served = [k for k in self.kinds.values() if (k.group, k.version) == (group, version)]
        if len(parts) not in (2, 3) or not served:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        resources = []
        for k in served:
            resources.append(
                {
                    "name": k.plural,
                    "singularName": k.kind.lower(),
                    "namespaced": k.namespaced,
                    "kind": k.kind,
                    "verbs": READ_WRITE,
                }
            )
            for sub in k.subresources:
                resources.append(
                    {
                        "name": f"{k.plural}/{sub}",
                        "singularName": "",
                        "namespaced": k.namespaced,
                        "kind": CONNECT.get(sub, k.kind),
                        "verbs": ["create", "get"]
                        if sub in CONNECT
                        else ["get"]
                        if sub == "log"
                        else ["get", "patch", "update"],
                    }
                )
        return reply(
            {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": f"{group}/{version}" if group else version,
                "resources": resources,
            }
        )

    async def _rest(self, request: web.Request, kind: Kind, info: RequestInfo, who: User):
        query = parse_qs(request.query_string)
        first = {k: v[0] for k, v in query.items()}
        # RequestInfo names a namespace object's own name as its namespace (requestinfo.go).
        namespace = info.namespace if kind.namespaced else ""
        if kind.namespaced and not namespace and info.verb not in ("list", "watch"):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if info.verb == "get":
            return reply(self.get(kind, namespace, info.name))
        if info.verb == "list":
            items = self.select(
                kind, namespace, first.get("labelSelector", ""), first.get("fieldSelector", "")
            )
            return reply(
                {
                    "kind": f"{kind.kind}List",
                    "apiVersion": kind.api_version,
                    "metadata": {"resourceVersion": str(self.revision)},
                    "items": items,
                }
            )
        if info.verb == "watch":
            return await self._watch(request, kind, namespace, first)
        body = await request.json() if request.can_read_body else {}
        if info.verb == "create":
            return reply(self.create(kind, namespace, body, who), status=201)
        if info.verb == "delete":
            obj = self.get(kind, namespace, info.name)
            policy = (body or {}).get("propagationPolicy") or first.get("propagationPolicy")
            return reply(self.delete(kind, obj, policy or "Background"))
        if info.verb not in ("update", "patch"):
            raise ApiError(405, "MethodNotAllowed", f"{info.verb} is not supported here")
        old = self.get(kind, namespace, info.name)
        if info.verb == "update":
            wanted = body.get("metadata", {}).get("resourceVersion")
            if wanted and wanted != old["metadata"]["resourceVersion"]:
                raise ApiError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {kind.qualified} "{info.name}": the object '
                    "has been modified; please apply your changes to the latest version and try "
                    "again",
                )
            new = body
        elif request.content_type == "application/merge-patch+json":
            new = merge_patch(old, body)
        elif request.content_type == "application/json-patch+json":
            new = json_patch(old, body)
        else:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format: {request.content_type}",
            )
        if info.subresource == "status":
            new = {**copy.deepcopy(old), "status": new.get("status")}
        elif "status" in kind.subresources:
            new = {k: v for k, v in new.items() if k != "status"}
            if "status" in old:
                new["status"] = old["status"]
        return reply(self.replace(kind, old, new))

    async def _watch(self, request, kind: Kind, namespace: str, query: dict):
        labels, fields = query.get("labelSelector", ""), query.get("fieldSelector", "")
        since = query.get("resourceVersion", "")
        timeout = float(query.get("timeoutSeconds") or 1800)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)

        def visible(obj: dict | None) -> bool:
            return (
                obj is not None
                and namespace in ("", obj["metadata"].get("namespace", ""))
                and labels_match(labels, obj["metadata"].get("labels") or {})
                and fields_match(fields, obj)
            )

        async def send(event: str, obj: dict) -> None:
            await response.write(json.dumps({"type": event, "object": obj}).encode() + b"\n")

        position = len(self.history)
        if since in ("", "0"):
            for obj in self.select(kind, namespace, labels, fields):
                await send("ADDED", obj)
        else:
            position = next(
                (i for i, e in enumerate(self.history) if e[0] > int(since)), len(self.history)
            )
        deadline = self._loop.time() + timeout
        try:
            while not self._stopping:
                while position < len(self.history):
                    _, k, event, obj, old = self.history[position]
                    position += 1
                    if k != kind:
                        continue
                    now_in, was_in = visible(obj) and event != "DELETED", visible(old)
                    if event == "DELETED" and was_in:
                        await send("DELETED", obj)
                    elif now_in:
                        await send("MODIFIED" if was_in else "ADDED", obj)
                    elif was_in:
                        await send("DELETED", obj)
                left = deadline - self._loop.time()
                if left <= 0:
                    break
                try:
                    await asyncio.wait_for(asyncio.shield(self._tick), left)
                except TimeoutError:
                    break
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        return response


def _owned_by(obj: dict, uid: str, blocking_only: bool = False) -> bool:
    return any(
        r.get("uid") == uid and (r.get("blockOwnerDeletion") or not blocking_only)
        for r in obj["metadata"].get("ownerReferences") or []
    )


def _without_finalizer(obj: dict, finalizer: str) -> dict:
    new = copy.deepcopy(obj)
    new["metadata"]["finalizers"] = [f for f in obj["metadata"]["finalizers"] if f != finalizer]
    return new


def _everything(api: KubeAPI):
    kinds = {(k.group, k.plural): k for k in api.kinds.values()}
    for (group, plural, _, _), obj in list(api.store.items()):
        yield kinds[(group, plural)], obj


def garbage_collector(api: KubeAPI) -> None:
    """Dependents of absent owners are deleted; owners in foreground deletion wait for their
    blocking dependents; orphaning owners release theirs."""
    objects = list(_everything(api))
    by_uid = {o["metadata"]["uid"]: o for _, o in objects}
    for kind, obj in objects:
        meta = obj["metadata"]
        if (
            api.store.get((kind.group, kind.plural, meta.get("namespace", ""), meta["name"]))
            is not obj
        ):
            continue  # changed by this pass already
        references = meta.get("ownerReferences") or []
        owners = [by_uid.get(r.get("uid")) for r in references]
        finalizers = meta.get("finalizers") or []
        if meta.get("deletionTimestamp") and "orphan" in finalizers:
            for dependent_kind, dependent in objects:
                if _owned_by(dependent, meta["uid"]):
                    released = copy.deepcopy(dependent)
                    released["metadata"]["ownerReferences"] = [
                        r
                        for r in dependent["metadata"]["ownerReferences"]
                        if r.get("uid") != meta["uid"]
                    ]
                    api.replace(dependent_kind, dependent, released)
            api.replace(kind, obj, _without_finalizer(obj, "orphan"))
        elif meta.get("deletionTimestamp") and "foregroundDeletion" in finalizers:
            if not any(_owned_by(d, meta["uid"], blocking_only=True) for _, d in objects):
                api.replace(kind, obj, _without_finalizer(obj, "foregroundDeletion"))
        if not references or meta.get("deletionTimestamp"):
            continue
        foreground = [
            o
            for o in owners
            if o is not None
            and o["metadata"].get("deletionTimestamp")
            and "foregroundDeletion" in (o["metadata"].get("finalizers") or [])
        ]
        if all(o is None for o in owners) or foreground:
            # attemptToDeleteItem: in foreground only what blocks a waiting owner and has
            # dependents of its own.
            has_dependents = any(_owned_by(d, meta["uid"]) for _, d in objects)
            api.delete(kind, obj, "Foreground" if foreground and has_dependents else "Background")
        elif any(o is None for o in owners):
            kept = copy.deepcopy(obj)
            kept["metadata"]["ownerReferences"] = [
                r for r, o in zip(references, owners, strict=True) if o is not None
            ]
            api.replace(kind, obj, kept)


def namespace_controller(api: KubeAPI) -> None:
    """A terminating namespace's objects are deleted; it goes once they are all gone."""
    for namespace in list(api.store.values()):
        meta = namespace["metadata"]
        if namespace["kind"] != "Namespace" or not meta.get("deletionTimestamp"):
            continue
        left = [
            (k, o) for k, o in _everything(api) if o["metadata"].get("namespace") == meta["name"]
        ]
        for kind, obj in left:
            api.delete(kind, obj)
        if not left and namespace["spec"].get("finalizers"):
            finalized = copy.deepcopy(namespace)
            finalized["spec"]["finalizers"] = []
            api.replace(api.kinds[("", "v1", "namespaces")], namespace, finalized)


def crd_controller(api: KubeAPI) -> None:
    """Each stored CustomResourceDefinition serves its versions (apiextensions-apiserver)."""
    for crd in list(api.store.values()):
        if crd["kind"] != "CustomResourceDefinition" or crd["metadata"].get("deletionTimestamp"):
            continue
        spec = crd["spec"]
        for version in spec["versions"]:
            if version.get("served", True):
                api.serve(
                    Kind(
                        spec["group"],
                        version["name"],
                        spec["names"]["kind"],
                        spec["names"]["plural"],
                        spec["scope"] == "Namespaced",
                        tuple(version.get("subresources") or {}),
                        version.get("schema", {}).get("openAPIV3Schema"),
                    )
                )
