"""The DevServer reconciler: level-based and idempotent, written against a small client boundary.

Each call compares what a server should have (devservers.render) with what the cluster has,
makes the difference (create, patch, replace), and returns the status to record. Calling it
again with nothing changed writes nothing. The operator (devservers/operator.py) calls it on
every change and on a periodic activity check, through devservers.kube.KubeCluster; tests do the
same against a local Kubernetes API (tests/kube_api).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from devservers.activity import (
    PROBE,
    IdleRule,
    ProbeCut,
    in_use,
    parse_duration,
    pod_activity,
)
from devservers.api import (
    API_VERSION,
    GPU,
    SERVER_LABEL,
    STOP_WARNING,
    parse_timestamp,
    timestamp,
)
from devservers.images import image_refusal
from devservers.render import (
    CONTAINER,
    SHAPE_ANNOTATION,
    RenderError,
    Settings,
    children,
    desired_replicas,
    gpus_per_pod,
    host_key_secret,
    host_key_secret_name,
    host_public_key,
    kept_usd_per_hour,
    owner_of_namespace,
    ssh_enabled,
    ssh_service_name,
)
from devservers.savings import Nodes, record

KUEUE_GATE = "kueue.x-k8s.io/admission"
# Kueue 0.19's StatefulSet integration creates one Workload per StatefulSet, labelled with the
# StatefulSet's UID (pkg/controller/jobs/statefulset/statefulset_reconciler.go, constructWorkload;
# JobUIDLabel in pkg/controller/constants/constants.go).
WORKLOAD = ("kueue.x-k8s.io/v1beta2", "Workload")
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
# The well-known label of a node's instance type (set by the cloud provider's node controller).
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
# How long before an idle stop its users are warned (status condition STOP_WARNING), and so how
# long at least a warning stands before the stop: a check that first finds a server idle in the
# last WARN_BEFORE before its stop, or past it (the operator was down across that window, a pass
# was slow, idleTimeout was shortened), warns and moves the stop to WARN_BEFORE later. A stop thus
# comes up to one check (60 s) after idleTimeout: the price of a warning that always gives its
# full time, which a shorter notice for a late warning would not.
WARN_BEFORE = timedelta(minutes=10)
# A warning whose stop passed longer ago than this, with no check to carry it out (the operator
# was down), no longer stands: what the users did meanwhile went unseen, so they are warned anew.
WARNING_LAPSES = timedelta(minutes=5)
# Writes its first argument to every terminal a process of the pod has open: SSH sessions, shells
# in tmux or screen, `kubectl exec -t` shells. wall(1) reaches only the logins utmp records, and
# sshd running as the image's user records none. A terminal nobody reads must not hang the check.
WARN = [
    "sh",
    "-c",
    """for fd in /proc/[0-9]*/fd/*; do
  t=$(readlink "$fd" 2>/dev/null) || continue
  case "$t" in /dev/pts/[0-9]*) echo "$t" ;; esac
done | sort -u | while read -r t; do
  timeout 5 sh -c 'printf "%s" "$1" > "$2"' sh "$1" "$t" 2>/dev/null || true
done""",
    "sh",
]


class Cluster(Protocol):
    """What the reconciler needs from the Kubernetes API (devservers.kube.KubeCluster)."""

    def get(self, api_version: str, kind: str, name: str, namespace: str | None) -> dict | None: ...

    def list(
        self, api_version: str, kind: str, namespace: str | None, labels: dict
    ) -> list[dict]: ...

    def create(self, manifest: dict) -> dict: ...

    def patch(
        self, api_version: str, kind: str, name: str, namespace: str | None, patch: dict
    ) -> dict: ...

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None) -> None:
        """Foreground deletion: the object goes once its dependents (pods) are gone."""
        ...

    def patch_status(self, name: str, namespace: str, status: dict) -> None:
        """Merge `status` into a DevServer's status subresource."""
        ...

    def exec(self, namespace: str, pod: str, container: str, command: list[str]) -> str: ...

    def gpu_utilization(self, namespace: str, pods: list[dict]) -> float | None:
        """Highest DCGM GPU utilization of `pods`; None without DCGM or GPUs."""
        ...


@dataclass
class Outcome:
    status: dict
    spec: dict = field(default_factory=dict)  # spec changes the operator asks for (idle stop)
    # Events about the server to emit once the status is written: (type, reason, message).
    events: list[tuple[str, str, str]] = field(default_factory=list)


@dataclass
class CpuSamples:
    """Each server's pods' CPU seconds at the last check, kept by the operator between checks:
    CPU use is what the pods consumed since then. A pod's first check (and the first after the
    operator restarts) has nothing to compare with, and the server is then not stopped."""

    by_server: dict[tuple[str, str], dict[str, tuple[datetime, float]]] = field(
        default_factory=dict
    )

    def percent(
        self, server: tuple[str, str], now: datetime, pods: dict[str, float]
    ) -> float | None:
        """The busiest pod's CPU use since the last check, in % of one core (pods: uid ->
        CPU seconds now); None when no pod has an earlier sample."""
        before = self.by_server.get(server, {})
        self.by_server[server] = {uid: (now, seconds) for uid, seconds in pods.items()}
        rates = [
            max(seconds - before[uid][1], 0.0) / (now - before[uid][0]).total_seconds() * 100
            for uid, seconds in pods.items()
            if uid in before and now > before[uid][0]
        ]
        return max(rates) if rates else None

    def retain(self, servers: set[tuple[str, str]]) -> None:
        """Forget servers that are gone."""
        self.by_server = {k: v for k, v in self.by_server.items() if k in servers}


def _contains(existing, desired) -> bool:
    """Whether `existing` already holds every value of `desired` (servers add defaults)."""
    if isinstance(desired, dict):
        return isinstance(existing, dict) and all(
            _contains(existing.get(k), v) for k, v in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(existing, list)
            and len(existing) == len(desired)
            and all(_contains(e, d) for e, d in zip(existing, desired, strict=True))
        )
    return existing == desired


def _refused(cluster: Cluster, server: dict, reason: str, message: str) -> Outcome:
    """A server whose spec the operator refuses does not run: pods it had from an earlier spec
    are stopped (homes kept), or a user could keep a server out of idle checks by making its
    spec invalid. A new refusal is also an Event."""
    meta = server["metadata"]
    stateful_set = cluster.get("apps/v1", "StatefulSet", meta["name"], meta["namespace"])
    if (
        stateful_set
        and stateful_set["spec"]["replicas"]
        and not stateful_set["metadata"].get("deletionTimestamp")
    ):
        cluster.patch(
            "apps/v1", "StatefulSet", meta["name"], meta["namespace"], {"spec": {"replicas": 0}}
        )
    previous = (server.get("status") or {}).get("reason")
    return Outcome(
        {
            "phase": "Failed",
            "reason": reason,
            "message": message,
            "observedGeneration": meta.get("generation", 0),
        },
        events=[("Warning", reason, message)] if previous != reason else [],
    )


def pod_ready(pod: dict) -> bool:
    conditions = (pod.get("status") or {}).get("conditions", [])
    return not pod["metadata"].get("deletionTimestamp") and any(
        c["type"] == "Ready" and c["status"] == "True" for c in conditions
    )


def _gated(pod: dict) -> bool:
    return any(g["name"] == KUEUE_GATE for g in pod["spec"].get("schedulingGates", []))


def _condition(workload: dict, kind: str) -> dict | None:
    conditions = (workload.get("status") or {}).get("conditions", [])
    return next((c for c in conditions if c["type"] == kind), None)


def kueue_state(workload: dict | None) -> str | None:
    """One line for a Workload's state, from the conditions Kueue 0.19 sets on it
    (apis/kueue/v1beta2/workload_types.go; pkg/workload/evict/evict.go sets Evicted with the
    eviction reason; pkg/workload/workload.go, UpdateRequeueState, sets status.requeueState)."""
    if workload is None:
        return None

    def true(kind: str) -> dict | None:
        condition = _condition(workload, kind)
        return condition if condition and condition["status"] == "True" else None

    evicted = true("Evicted")
    if workload["spec"].get("active") is False:
        return f"Deactivated ({evicted['reason'] if evicted else 'spec.active false'})"
    if true("Finished"):
        return "Finished"
    if evicted:
        requeue_at = ((workload.get("status") or {}).get("requeueState") or {}).get("requeueAt")
        again = f"requeued at {requeue_at}" if requeue_at else "requeued"
        return f"Evicted ({evicted['reason']}), {again}"
    if true("Admitted"):
        ready = _condition(workload, "PodsReady")
        if ready is None or ready["status"] == "True":
            return "Admitted"
        return f"Admitted, pods not ready ({ready['reason']})"
    return "Queued"


def _workload(cluster: Cluster, stateful_set: dict | None) -> dict | None:
    """The Kueue Workload of the server's StatefulSet, if Kueue has made one."""
    if stateful_set is None:
        return None
    meta = stateful_set["metadata"]
    labels = {JOB_UID_LABEL: meta["uid"]}
    return next(iter(cluster.list(*WORKLOAD, meta["namespace"], labels)), None)


def _sync_children(cluster: Cluster, desired: list[dict]) -> tuple[bool, bool, dict]:
    """Create or correct every child. Returns (replacing, scaled_up, the children as read or
    made, by kind and name).

    Kueue freezes the pod template of an admitted StatefulSet, so a new pod shape (flavor, image,
    home size) replaces the StatefulSet; homes survive because their claims are retained.
    """
    replacing = scaled_up = False
    found = {}
    for child in desired:
        meta = child["metadata"]
        key = (child["apiVersion"], child["kind"], meta["name"], meta["namespace"])
        existing = found[(child["kind"], meta["name"])] = cluster.get(*key)
        if existing is None:
            found[(child["kind"], meta["name"])] = cluster.create(child)
            scaled_up |= child["kind"] == "StatefulSet" and child["spec"]["replicas"] > 0
        elif child["kind"] == "StatefulSet":
            shape = existing["metadata"].get("annotations", {}).get(SHAPE_ANNOTATION)
            if shape != meta["annotations"][SHAPE_ANNOTATION]:
                if not existing["metadata"].get("deletionTimestamp"):
                    cluster.delete(*key)
                replacing = True
            elif existing["spec"]["replicas"] != child["spec"]["replicas"]:
                # Kueue 0.19 lets an admitted StatefulSet scale only to and from zero.
                cluster.patch(*key, {"spec": {"replicas": child["spec"]["replicas"]}})
                scaled_up |= existing["spec"]["replicas"] == 0
        elif child["kind"] == "Service" and existing["spec"].get("type") != child["spec"]["type"]:
            # LoadBalancer <-> ClusterIP leaves fields the other type refuses: recreate it.
            if not existing["metadata"].get("deletionTimestamp"):
                cluster.delete(*key)
        else:
            body = {k: v for k, v in child.items() if k in ("spec", "data")}
            if not _contains(existing, body) or not _contains(
                existing["metadata"].get("labels"), meta["labels"]
            ):
                cluster.patch(*key, {**body, "metadata": {"labels": meta["labels"]}})
    return replacing, scaled_up, found


def _homes_elsewhere(claims: list[dict], flavor: dict) -> str | None:
    """Why the server cannot take `flavor`: homes of another StorageClass, or None.

    A StatefulSet reuses the claims it finds by name, whatever its claim templates say, and a
    home stays where it was made: a gp3 volume in its AZ, a hybrid-local directory on its
    machine (its volume's node affinity). A flavor whose pods go elsewhere would never start.
    """
    wanted = flavor["spec"]["homeStorageClass"]
    other = sorted(
        (c["spec"].get("storageClassName"), c["metadata"]["name"])
        for c in claims
        if c["spec"].get("storageClassName") != wanted
    )
    if not other:
        return None
    classes = ", ".join(sorted({storage_class for storage_class, _ in other}))
    names = ", ".join(name for _, name in other)
    return (
        f"flavor {flavor['metadata']['name']} keeps homes in {wanted}, and this server's are in "
        f"{classes} ({names}), where its pods could not go; allowed: a flavor with homes in "
        f"{classes}, or the server deleted with its homes (devctl delete --delete-home) and "
        "created anew"
    )


def _adopt_home_claims(cluster: Cluster, server: dict, claims: list[dict]) -> None:
    """Homes belong to the server (deleted with it) only when it asks for that."""
    meta = server["metadata"]
    wanted = server["spec"].get("lifecycle", {}).get("deleteHomeOnDelete", False)
    reference = {
        "apiVersion": API_VERSION,
        "kind": "DevServer",
        "name": meta["name"],
        "uid": meta.get("uid", ""),
    }
    for claim in claims:
        references = claim["metadata"].get("ownerReferences", [])
        owned = any(r.get("uid") == reference["uid"] for r in references)
        if owned != wanted:
            cluster.patch(
                "v1",
                "PersistentVolumeClaim",
                claim["metadata"]["name"],
                meta["namespace"],
                {"metadata": {"ownerReferences": [reference] if wanted else []}},
            )


def _labels(server: dict) -> dict:
    return {SERVER_LABEL: server["metadata"]["name"]}


def new_host_key() -> tuple[str, str]:
    """A new ed25519 SSH key: (private key in OpenSSH's format, which sshd reads; public line)."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(Encoding.PEM, PrivateFormat.OpenSSH, NoEncryption()).decode()
    public = key.public_key().public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).decode()
    return private, public


def _host_key(cluster: Cluster, server: dict) -> str:
    """The public half of the server's SSH host key, from its Secret, made when missing (a new
    server, or one whose key an administrator rotated by deleting the Secret)."""
    meta = server["metadata"]
    secret = cluster.get("v1", "Secret", host_key_secret_name(server), meta["namespace"])
    if secret is None:
        secret = cluster.create(host_key_secret(server, *new_host_key()))
    return host_public_key(secret)


def _ssh_endpoint(server: dict, service: dict | None) -> str | None:
    meta = server["metadata"]
    if not ssh_enabled(server) or service is None:
        return None
    ingress = ((service.get("status") or {}).get("loadBalancer") or {}).get("ingress") or []
    if service["spec"].get("type") == "LoadBalancer":
        return f"{ingress[0].get('hostname') or ingress[0].get('ip')}:22" if ingress else None
    return f"{ssh_service_name(server)}.{meta['namespace']}.svc:22"


def reconcile(
    cluster: Cluster,
    server: dict,
    settings: Settings,
    now: datetime,
    measure: CpuSamples | None = None,
) -> Outcome:
    """Bring `server`'s children in line with its spec; with `measure` (the CPU samples of earlier
    checks), also check its activity (devservers.activity), warn its users of an idle stop, and
    ask to stop it (spec.stopped) once idle past its idleTimeout and keepUntil and warned
    WARN_BEFORE earlier. The server's usage record (devservers.savings) follows what was found,
    with an Event at every idle stop and at the start that ends one."""
    outcome = _reconcile(cluster, server, settings, now, measure)
    change = record(
        (server.get("status") or {}).get("usage") or [],
        running=outcome.status.get("phase") == "Running",
        wanted=not server["spec"].get("stopped"),
        idle_stop=bool(outcome.spec.get("stopped")),
        nodes=lambda: _nodes(cluster, server, settings),
        now=now,
        counted_stop_hours=settings.counted_stop_hours,
        kept_usd_per_hour=kept_usd_per_hour(server, settings),
        gone=lambda names: all(cluster.get("v1", "Node", n, None) is None for n in names),
    )
    outcome.status["usage"] = change.usage or None
    outcome.events += [("Normal", reason, message) for reason, message in change.events]
    return outcome


def _nodes(cluster: Cluster, server: dict, settings: Settings) -> Nodes:
    """Where the server's ready pods run: their nodes' instance type, the share of each node a
    pod's requests hold (the largest of its GPU, CPU and memory shares), and its price."""
    from kubernetes.utils import parse_quantity  # here, not at the top: devctl imports this module

    meta = server["metadata"]
    pods = [
        p for p in cluster.list("v1", "Pod", meta["namespace"], _labels(server)) if pod_ready(p)
    ]
    types, shares, prices, names = set(), 0.0, [], set()
    for pod in pods:
        node_name = pod["spec"].get("nodeName")
        node = cluster.get("v1", "Node", node_name, None) if node_name else None
        if node is None:
            types.add("unknown")
            shares += 1
            prices.append(None)
            continue
        names.add(node_name)
        labels = node["metadata"].get("labels") or {}
        kind = labels.get(INSTANCE_TYPE_LABEL, "unknown")
        capacity = (node.get("status") or {}).get("capacity") or {}
        requests = pod["spec"]["containers"][0].get("resources", {}).get("requests") or {}
        share = max(
            [
                float(parse_quantity(requests[key]) / parse_quantity(capacity[key]))
                for key in (GPU, "cpu", "memory")
                if key in requests and parse_quantity(capacity.get(key, "0")) > 0
            ]
            or [1.0]
        )
        share = min(share, 1.0)
        types.add(kind)
        shares += share
        price = settings.prices.get(kind)
        prices.append(None if price is None else price * share)
    usd = None if None in prices or not prices else sum(prices)
    return Nodes("+".join(sorted(types)) or "unknown", shares, usd, tuple(sorted(names)))


def _reconcile(
    cluster: Cluster,
    server: dict,
    settings: Settings,
    now: datetime,
    measure: CpuSamples | None,
) -> Outcome:
    meta, spec = server["metadata"], server["spec"]
    previous = server.get("status") or {}
    if owner_of_namespace(meta["namespace"]) != spec["owner"]:
        return _refused(
            cluster,
            server,
            "NotOwnerNamespace",
            f"a DevServer of {spec['owner']} must be in namespace dev-{spec['owner']}",
        )
    refusal = image_refusal(spec["image"], settings.allowed_images, settings.require_image_digest)
    if refusal:
        return _refused(cluster, server, "ImageNotAllowed", refusal)
    flavor = cluster.get(API_VERSION, "DevServerFlavor", spec["flavor"], None)
    if flavor is None:
        names = sorted(
            f["metadata"]["name"] for f in cluster.list(API_VERSION, "DevServerFlavor", None, {})
        )
        return _refused(
            cluster,
            server,
            "UnknownFlavor",
            f"no flavor {spec['flavor']!r}; allowed: {', '.join(names)}",
        )
    try:
        desired = children(server, flavor, settings)
    except RenderError as e:
        return _refused(cluster, server, "InvalidSpec", str(e))
    claims = cluster.list("v1", "PersistentVolumeClaim", meta["namespace"], _labels(server))
    elsewhere = _homes_elsewhere(claims, flavor)
    if elsewhere:
        return _refused(cluster, server, "HomeElsewhere", elsewhere)
    # Before the pods, which mount it; its public half goes to the status for devctl to check.
    host_key = _host_key(cluster, server) if ssh_enabled(server) else None
    replacing, scaled_up, found = _sync_children(cluster, desired)
    _adopt_home_claims(cluster, server, claims)

    replicas = desired_replicas(server)
    pods = cluster.list("v1", "Pod", meta["namespace"], _labels(server))
    ready = [p for p in pods if pod_ready(p)]
    status = {
        "replicas": replicas,
        "replicasReady": len(ready),
        "observedGeneration": meta.get("generation", 0),
        "reason": "",
        "message": "",
    }
    if replacing:
        status |= {
            "phase": "Pending",
            "reason": "Replacing",
            "message": "new flavor, image or home size: restarting the pods (homes are kept)",
        }
    elif replicas == 0:
        # An idle stop keeps saying why until the server runs again.
        idle = previous.get("reason") == "Idle"
        status |= {
            "phase": "Pending" if pods else "Stopped",
            "reason": "Idle" if idle else ("Stopping" if pods else "Stopped"),
            "message": previous.get("message", "") if idle else "",
        }
    elif len(ready) == replicas:
        status["phase"] = "Running"
    elif any(_gated(p) for p in pods) or not pods:
        status |= {
            "phase": "Queued",
            "reason": "WaitingForQuota",
            "message": "Kueue has not admitted the pods yet",
        }
    else:
        status |= {"phase": "Pending", "reason": "Starting"}
    # None removes a field from the status (merge patch): no stale endpoint or activity figures.
    status["sshEndpoint"] = _ssh_endpoint(server, found.get(("Service", ssh_service_name(server))))
    status["sshHostKey"] = host_key
    stateful_set = found.get(("StatefulSet", meta["name"]))
    status["kueue"] = kueue_state(_workload(cluster, stateful_set)) if replicas else None
    if replicas == 0:
        status |= {"activeSessions": None, "gpuUtilization": None}

    # The idle clock starts when a server starts running, so a restarted one is not stopped at once.
    last = parse_timestamp(previous["lastActivity"]) if previous.get("lastActivity") else None
    if (
        scaled_up
        or last is None
        or (status["phase"] == "Running" and previous.get("phase") != "Running")
    ):
        last = now
    outcome = Outcome(status)
    lifecycle = {"idleTimeout": "2h", "autoShutdown": True, **spec.get("lifecycle", {})}
    running = status["phase"] == "Running"
    verdict = None
    if measure is not None and running:
        verdict = _measure(cluster, server, flavor, ready, settings, now, measure, status)
        if verdict is not None and verdict.in_use:
            last = now
            status["lastActivityReason"] = verdict.in_use
    stop_at = None
    if running and lifecycle["autoShutdown"]:
        stop_at = last + timedelta(seconds=parse_duration(lifecycle["idleTimeout"]))
        if lifecycle.get("keepUntil"):
            stop_at = max(stop_at, parse_timestamp(lifecycle["keepUntil"]))
    warning = None
    if stop_at is not None and now >= stop_at - WARN_BEFORE:
        given = _condition(server, STOP_WARNING)
        promised = parse_timestamp(previous["idleStopAt"]) if previous.get("idleStopAt") else None
        if (
            given is not None
            and promised is not None
            and stop_at <= promised
            and now <= promised + WARNING_LAPSES
            and (verdict is None or verdict.in_use is None)
        ):
            stop_at = promised  # what the warning said, even if the timeout was shortened since
        else:
            # None given yet, the stop moved later than it said, the server is in use, or the
            # stop it named passed long ago unchecked (the operator was down): warn anew.
            given = None
        if verdict is None:  # not measured now: a warning given stands until the next check
            warning = given
        elif verdict.in_use is None:
            idle = f"idle ({verdict.describe()}) since {timestamp(last)}"
            if given is None:
                stop_at = max(stop_at, now + WARN_BEFORE)
                warning = _warn(cluster, server, ready, idle, stop_at, now)
            elif now >= stop_at:
                outcome.spec = {"stopped": True}
                status |= {
                    "reason": "Idle",
                    "message": f"{idle}: stopped at {timestamp(now)}, home kept; "
                    f"devctl start {meta['name']}",
                }
            else:
                warning = given
    status["idleStopAt"] = timestamp(stop_at) if stop_at else None
    status["conditions"] = [warning] if warning else None
    status["lastActivity"] = timestamp(last)
    return outcome


def idle_rule(server: dict, settings: Settings) -> IdleRule:
    lifecycle = server["spec"].get("lifecycle", {})
    return IdleRule(
        gpu_percent=lifecycle.get("idleGpuPercent", settings.idle_gpu_percent),
        cpu_percent=lifecycle.get("idleCpuPercent", settings.idle_cpu_percent),
        keep_alive=tuple(lifecycle.get("keepAliveProcesses", ())),
    )


@dataclass(frozen=True)
class Verdict:
    rule: IdleRule
    in_use: str | None  # why the server is in use; None: idle by the rule
    gpu_measured: bool  # judged by DCGM's GPU figure, else by CPU use
    # Why no pod could be read (an exec that failed, hung or flooded), when none could and no
    # GPU figure judged it: nothing shows use, so the server is idle (a user cannot keep a
    # server from stopping by breaking its probe).
    unreadable: str | None = None

    def describe(self) -> str:
        if self.unreadable:
            return f"no activity readable: {self.unreadable}"
        return self.rule.describe(self.gpu_measured)


def _measure(
    cluster: Cluster,
    server: dict,
    flavor: dict,
    ready: list[dict],
    settings: Settings,
    now: datetime,
    samples: CpuSamples,
    status: dict,
) -> Verdict | None:
    """Read every ready pod's processes (and, on GPU flavors, DCGM), record the figures in
    `status` and judge them; None when there is no figure yet to tell idle from busy."""
    meta = server["metadata"]
    activity, failures = {}, []
    for pod in ready:
        try:
            found = cluster.exec(meta["namespace"], pod["metadata"]["name"], CONTAINER, PROBE)
        except ProbeCut as e:  # a shell that hung or flooded; any other failure is raised
            failures.append(str(e))
            continue
        activity[pod["metadata"]["uid"]] = pod_activity(found)
    gpu = cluster.gpu_utilization(meta["namespace"], ready) if gpus_per_pod(flavor) else None
    cpu = samples.percent(
        (meta["namespace"], meta["name"]), now, {u: a.cpu_seconds for u, a in activity.items()}
    )
    status["activeSessions"] = sum(a.ssh_sessions for a in activity.values())
    if gpu is not None:
        status["gpuUtilization"] = gpu
    rule = idle_rule(server, settings)
    reason = in_use(list(activity.values()), gpu, cpu, rule)
    if reason is None and gpu is None and not activity and failures:
        return Verdict(rule, None, False, failures[0])
    if reason is None and gpu is None and cpu is None:
        return None
    return Verdict(rule, reason, gpu is not None)


def _warn(
    cluster: Cluster,
    server: dict,
    ready: list[dict],
    idle: str,
    stop_at: datetime,
    now: datetime,
) -> dict:
    """A new warning condition, its message written to the pods' terminals."""
    name = server["metadata"]["name"]
    minutes = max(round((stop_at - now).total_seconds() / 60), 1)
    message = (
        f"{idle}: stops at {timestamp(stop_at)} (in {minutes}m), home kept; "
        f"devctl keep {name} 2h postpones it"
    )
    for pod in ready:
        # Best effort: the warning stands in the status (devctl list and monitor show it)
        # whether or not a pod's terminals could be reached.
        with contextlib.suppress(ProbeCut):
            cluster.exec(
                server["metadata"]["namespace"],
                pod["metadata"]["name"],
                CONTAINER,
                [*WARN, f"\r\n[devserver {name}] {message}\r\n"],
            )
    return {
        "type": STOP_WARNING,
        "status": "True",
        "reason": "IdleTimeout",
        "message": message,
        "lastTransitionTime": timestamp(now),
    }
