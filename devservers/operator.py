"""The DevServers operator: kopf handlers around devservers.controller.reconcile.

    kopf run --standalone --namespace 'dev-*' -m devservers.operator

Every change to a DevServer's spec, every flavor event and every pod event of a server run the
same level-based reconcile; a check every IDLE_CHECK_SECONDS also measures activity (it execs
into the pods, and keeps each pod's CPU seconds until the next check) and is the one that warns
the users of an idle server and then stops it.

One server cannot hold the others up: the idle check runs CHECK_WORKERS servers at once, and
every call the reconcile makes is bounded (devservers.kube: an exec into a pod whose shell hangs
costs at most its EXEC_SECONDS, in one worker). A server is reconciled by one thread at a time
(a lock per server), so a check and a kopf handler never write its status from two readings.

What the operator leaves on objects is what its RBAC allows (devservers/component.py):
kopf's bookkeeping annotations on DevServers only, their status, Events about them, and in each
user namespace a ConfigMap per server that keeps a copy of its usage record
(devservers.savings.LEDGER_PREFIX), which outlives the server.
Flavors, which it may only read, are seen through an event handler, which keeps no state on
them; the servers of a flavor come from an index of the DevServers kopf watches in the dev-*
namespaces (no cluster-wide list). The idle check is a task started with the operator that walks
that index, not a kopf timer: kopf puts its finalizer on every object a timer or daemon serves,
and a server (or its namespace, or the CRD) could then not be deleted while the operator is down,
as during `pulumi destroy`. Children are deleted by the garbage collector through owner
references: the operator needs no finalizer.
"""

import asyncio
import contextlib
import logging
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import kopf

from devservers.api import (
    API_VERSION,
    FLAVORS,
    GROUP,
    SERVER_LABEL,
    SERVERS,
    VERSION,
    controller_ref,
    timestamp,
)
from devservers.controller import CpuSamples, reconcile
from devservers.savings import (
    LEDGER_LABELS,
    MAX_DELETED,
    copied_record,
    expired,
    ledger_copy,
)

IDLE_CHECK_SECONDS = float(os.environ.get("DEVSERVERS_IDLE_CHECK_SECONDS", "60"))
# Servers checked at once. A check waits on the API server and the pods' execs, not on this
# process's CPU; a hung shell holds one worker for its exec's bound.
CHECK_WORKERS = int(os.environ.get("DEVSERVERS_CHECK_WORKERS", "32"))
# kopf's sync handlers (creates, spec changes, pod events) run in a pool of this size.
HANDLER_WORKERS = 16
METRICS_PORT = int(os.environ.get("DEVSERVERS_METRICS_PORT", "8081"))
COMPONENT = "devserver-operator"
logger = logging.getLogger(__name__)


def now() -> datetime:
    return datetime.now(UTC)


@kopf.index(GROUP, VERSION, SERVERS)
def servers_by_flavor(namespace, name, spec, **_) -> dict:
    """Every DevServer the operator serves, by flavor: (namespace, name)."""
    return {spec.get("flavor"): (namespace, name)}


def configure_kopf(settings: kopf.OperatorSettings) -> None:
    """kopf's bookkeeping, and bounds on its own calls: a watch that stalls is dropped and
    reopened, a request that gets no answer fails (kopf retries it)."""
    # kopf's bookkeeping goes to annotations: the DevServer status schema is closed.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP)
    settings.posting.level = logging.WARNING
    settings.networking.connect_timeout = 10
    settings.networking.request_timeout = 60
    settings.watching.connect_timeout = 10
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.execution.max_workers = HANDLER_WORKERS


def with_state(memo: kopf.Memo, cluster, settings) -> kopf.Memo:
    """`memo` with what the handlers share: the cluster, the platform's settings, CPU samples,
    one lock per server, the metrics, and the idle checks' workers."""
    from devservers.metrics import Metrics

    memo.cluster = cluster
    memo.settings = settings
    memo.cpu_samples = CpuSamples()
    memo.locks = {}
    memo.unwritten = set()  # (namespace, name) of servers whose ledger copy failed
    memo.metrics = Metrics()
    memo.checks = ThreadPoolExecutor(CHECK_WORKERS, thread_name_prefix="idle-check")
    return memo


@kopf.on.startup()
async def configure(
    settings: kopf.OperatorSettings, memo: kopf.Memo, servers_by_flavor: kopf.Index, **_
) -> None:
    from devservers.kube import KubeCluster, settings_from_env

    configure_kopf(settings)
    with_state(memo, KubeCluster(), settings_from_env())
    memo.metrics.serve(METRICS_PORT)
    memo.idle_checks = asyncio.create_task(check_activity(memo, servers_by_flavor))


@kopf.on.cleanup()
async def stop_idle_checks(memo: kopf.Memo, **_) -> None:
    memo.idle_checks.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await memo.idle_checks
    memo.checks.shutdown(wait=False, cancel_futures=True)


def _servers(index: kopf.Index, flavor: str | None = None) -> list[tuple[str, str]]:
    """(namespace, name) of the indexed servers, of one flavor or all; read on kopf's loop."""
    keys = [flavor] if flavor is not None else list(index)
    return sorted({server for key in keys if key in index for server in index[key]})


async def check_activity(memo: kopf.Memo, index: kopf.Index) -> None:
    """Measure every server's activity, and stop the idle ones, every IDLE_CHECK_SECONDS."""
    while True:
        await asyncio.sleep(IDLE_CHECK_SECONDS)
        await sweep(memo, _servers(index))


async def sweep(memo: kopf.Memo, servers: list[tuple[str, str]]) -> float:
    """One idle check of `servers`, CHECK_WORKERS at a time; returns how long it took."""
    started = time.monotonic()
    await _each(memo, servers, measure=True)
    memo.cpu_samples.retain(set(servers))
    memo.metrics.retain(set(servers))
    for key in set(memo.locks) - set(servers):
        memo.locks.pop(key, None)
    memo.unwritten &= set(servers)
    took = time.monotonic() - started
    memo.metrics.check_seconds.set(took)
    memo.metrics.checked.set(len(servers))
    logger.info("idle check of %d servers took %.1f s", len(servers), took)
    return took


async def _each(memo: kopf.Memo, servers: list[tuple[str, str]], measure: bool) -> None:
    """_refresh every server in the check workers; one server's failure stops no other."""
    loop = asyncio.get_running_loop()
    results = await asyncio.gather(
        *(
            loop.run_in_executor(memo.checks, _refresh, memo, name, namespace, measure)
            for namespace, name in servers
        ),
        return_exceptions=True,
    )
    for (namespace, name), result in zip(servers, results, strict=True):
        if isinstance(result, Exception):
            logger.warning("check of %s/%s failed: %s", namespace, name, result)


@kopf.on.resume(GROUP, VERSION, SERVERS)
@kopf.on.create(GROUP, VERSION, SERVERS)
@kopf.on.update(GROUP, VERSION, SERVERS, field="spec")
def on_server(name, namespace, memo: kopf.Memo, **_) -> None:
    _refresh(memo, name, namespace, copy=True)


@kopf.on.event(GROUP, VERSION, SERVERS)
def on_server_deleted(type, body, memo: kopf.Memo, **_) -> None:
    """A deleted server's copy of its record stays, closed now. kopf does not retry an event
    handler, so the write is tried a few times. A server deleted with propagationPolicy Orphan
    (the garbage collector has released its children by the time it is gone) would leave its
    pods running with no idle check and no record: its StatefulSet goes."""
    if type != "DELETED":
        return
    meta = body["metadata"]
    usage = (body.get("status") or {}).get("usage") or []
    with _lock(memo, meta["namespace"], meta["name"]):
        for attempt in range(3):
            if _write_ledger(memo, dict(body), usage, now(), deleted=True):
                break
            time.sleep(2**attempt)
        _delete_orphan(memo, meta["name"], meta["namespace"])


def _changed(server: dict, status: dict) -> dict:
    """The status fields that differ from the server's: an unchanged server gets no write."""
    previous = server.get("status") or {}
    return {k: v for k, v in status.items() if previous.get(k) != v}


def _refresh(
    memo: kopf.Memo, name: str, namespace: str, measure: bool = False, copy: bool = False
) -> bool:
    """Reconcile a server as it is now, write what changed, copy a changed usage record (or any,
    with `copy`) to the ledger, and emit its Events; one thread per server at a time. False if
    there is no such server."""
    with _lock(memo, namespace, name):
        server = memo.cluster.get(API_VERSION, "DevServer", name, namespace)
        if server is None:
            return False
        if server["metadata"].get("deletionTimestamp"):
            return True
        samples = memo.cpu_samples if measure else None
        moment = now()
        outcome = reconcile(memo.cluster, server, memo.settings, moment, measure=samples)
        changed = _changed(server, outcome.status)
        if changed:
            memo.cluster.patch_status(name, namespace, changed)
        if outcome.spec:
            memo.cluster.patch(API_VERSION, "DevServer", name, namespace, {"spec": outcome.spec})
        for kind, reason, message in outcome.events:
            _event(memo, server, kind, reason, message, moment)
        memo.metrics.observe(server, outcome.status.get("usage") or [], outcome.events)
        # Last, and best effort: a copy that failed is written again at the next reconcile.
        key = (namespace, name)
        if copy or "usage" in changed or key in memo.unwritten:
            if _write_ledger(memo, server, outcome.status.get("usage") or [], moment):
                memo.unwritten.discard(key)
            else:
                memo.unwritten.add(key)
        return True


def _lock(memo: kopf.Memo, namespace: str, name: str) -> threading.Lock:
    return memo.locks.setdefault((namespace, name), threading.Lock())


def _write_ledger(
    memo: kopf.Memo, server: dict, usage: list, moment, deleted: bool = False
) -> bool:
    """Copy the server's record to its ledger ConfigMap (devservers.savings.LEDGER_PREFIX); on
    a deletion, also drop the namespace's expired copies. False if the API refused or failed."""
    meta = server["metadata"]
    if not usage:
        return True
    copy = ledger_copy(server, usage, moment, deleted)
    name, namespace = copy["metadata"]["name"], meta["namespace"]
    try:
        found = memo.cluster.get("v1", "ConfigMap", name, namespace)
        if found is None:
            memo.cluster.create(copy)
        elif "deletedAt" not in (copied_record(found) or {}):  # a late write never reopens it
            patch = {"metadata": {"labels": LEDGER_LABELS}, "data": copy["data"]}
            memo.cluster.patch("v1", "ConfigMap", name, namespace, patch)
        if deleted:
            ledgers = memo.cluster.list("v1", "ConfigMap", namespace, LEDGER_LABELS)
            for old, early in expired(ledgers, moment):
                memo.cluster.delete("v1", "ConfigMap", old, namespace)
                if early:
                    _event(memo, server, "Warning", "UsageRecordDropped",
                           f"more than {MAX_DELETED} deleted servers in 35 days: the usage "
                           f"record {old} of an older one is dropped", moment)  # fmt: skip
    except OSError as e:
        logger.warning("usage record of %s/%s: %s", namespace, meta["name"], e)
        return False
    return True


def _event(memo: kopf.Memo, server: dict, kind: str, reason: str, message: str, moment) -> None:
    """A core/v1 Event about the server, as `kubectl describe devserver` lists them."""
    meta = server["metadata"]
    stamp = timestamp(moment)
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": API_VERSION,
            "kind": "DevServer",
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta.get("uid", ""),
        },
        "type": kind,
        "reason": reason,
        "message": message[:1024],
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": socket.gethostname(),
    }
    try:
        memo.cluster.create(event)
    except OSError as e:  # the status holds what happened; an Event is for those who watch
        logger.warning("event %s about %s/%s: %s", reason, meta["namespace"], meta["name"], e)


@kopf.on.event("v1", "pods", labels={SERVER_LABEL: kopf.PRESENT})
def on_pod(type, labels, namespace, memo: kopf.Memo, **_) -> None:
    """A pod became ready, was admitted or went away: the server's phase follows at once. A pod
    whose server is gone belongs to a StatefulSet its user orphaned and the deletion's handler
    did not see (the operator was down): it goes now."""
    if type is None:
        return  # the listing at start: kopf resumes every server anyway
    name = labels[SERVER_LABEL]
    if not _refresh(memo, name, namespace) and type != "DELETED":
        _delete_orphan(memo, name, namespace)


def _delete_orphan(memo: kopf.Memo, name: str, namespace: str) -> None:
    """Delete the server's StatefulSet if nothing owns it any more (its pods go with it)."""
    found = memo.cluster.get("apps/v1", "StatefulSet", name, namespace)
    if found is None or (found["metadata"].get("labels") or {}).get(SERVER_LABEL) != name:
        return
    if controller_ref(found) is not None:
        return  # the garbage collector's to delete
    logger.warning("deleting %s/%s: its server is gone and its pods would run on", namespace, name)
    memo.cluster.delete("apps/v1", "StatefulSet", name, namespace)


@kopf.on.event(GROUP, VERSION, FLAVORS)
async def on_flavor(type, name, memo: kopf.Memo, servers_by_flavor: kopf.Index, **_) -> None:
    """A changed or deleted flavor reaches every server using it (their pods are replaced)."""
    if type is None:
        return  # the listing at start: nothing changed (kopf resumes every server anyway)
    await _each(memo, _servers(servers_by_flavor, name), measure=False)
