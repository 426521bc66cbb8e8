"""The DevServers operator: kopf handlers around devservers.controller.reconcile.

    kopf run --standalone --namespace 'dev-*' -m devservers.operator

Every change to a DevServer's spec, every flavor event and every pod event of a server run the
same level-based reconcile; a check every IDLE_CHECK_SECONDS also measures activity (it execs
into the pods, and keeps each pod's CPU seconds until the next check) and is the one that warns
the users of an idle server and then stops it.

What the operator leaves on objects is what its RBAC allows (devservers/component.py):
kopf's bookkeeping annotations on DevServers only. Flavors, which it may only read, are seen
through an event handler, which keeps no state on them; the servers of a flavor come from an
index of the DevServers kopf watches in the dev-* namespaces (no cluster-wide list). The idle
check is a task started with the operator that walks that index, not a kopf timer: kopf puts its
finalizer on every object a timer or daemon serves, and a server (or its namespace, or the CRD)
could then not be deleted while the operator is down, as during `pulumi destroy`. Children are
deleted by the garbage collector through owner references: the operator needs no finalizer.
"""

import asyncio
import contextlib
import logging
import os
from datetime import UTC, datetime

import kopf

from devservers.api import API_VERSION, FLAVORS, GROUP, SERVER_LABEL, SERVERS, VERSION
from devservers.controller import CpuSamples, Outcome, reconcile

IDLE_CHECK_SECONDS = float(os.environ.get("DEVSERVERS_IDLE_CHECK_SECONDS", "60"))
logger = logging.getLogger(__name__)


def now() -> datetime:
    return datetime.now(UTC)


@kopf.index(GROUP, VERSION, SERVERS)
def servers_by_flavor(namespace, name, spec, **_) -> dict:
    """Every DevServer the operator serves, by flavor: (namespace, name)."""
    return {spec.get("flavor"): (namespace, name)}


@kopf.on.startup()
async def configure(
    settings: kopf.OperatorSettings, memo: kopf.Memo, servers_by_flavor: kopf.Index, **_
) -> None:
    from devservers.kube import KubeCluster, settings_from_env

    # kopf's bookkeeping goes to annotations: the DevServer status schema is closed.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP)
    settings.posting.level = logging.WARNING
    memo.cluster = KubeCluster()
    memo.settings = settings_from_env()
    memo.cpu_samples = CpuSamples()
    memo.idle_checks = asyncio.create_task(check_activity(memo, servers_by_flavor))


@kopf.on.cleanup()
async def stop_idle_checks(memo: kopf.Memo, **_) -> None:
    memo.idle_checks.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await memo.idle_checks


def _servers(index: kopf.Index, flavor: str | None = None) -> list[tuple[str, str]]:
    """(namespace, name) of the indexed servers, of one flavor or all; read on kopf's loop."""
    keys = [flavor] if flavor is not None else list(index)
    return sorted({server for key in keys if key in index for server in index[key]})


async def check_activity(memo: kopf.Memo, index: kopf.Index) -> None:
    """Measure every server's activity, and stop the idle ones, every IDLE_CHECK_SECONDS."""
    while True:
        await asyncio.sleep(IDLE_CHECK_SECONDS)
        servers = _servers(index)
        for namespace, name in servers:
            try:
                await asyncio.to_thread(_refresh, memo, name, namespace, True)
            except Exception as e:  # noqa: BLE001 (one server's failure must not stop the rest)
                logger.warning("activity check of %s/%s failed: %s", namespace, name, e)
        memo.cpu_samples.retain(set(servers))


def _changed(server: dict, status: dict) -> dict:
    """The status fields that differ from the server's: an unchanged server gets no write."""
    previous = server.get("status") or {}
    return {k: v for k, v in status.items() if previous.get(k) != v}


def _apply(patch: kopf.Patch, server: dict, outcome: Outcome) -> None:
    patch.status.update(_changed(server, outcome.status))
    patch.spec.update(outcome.spec)


def _server(body) -> dict:
    return {
        "metadata": dict(body["metadata"]),
        "spec": dict(body["spec"]),
        "status": dict(body.get("status") or {}),
    }


@kopf.on.resume(GROUP, VERSION, SERVERS)
@kopf.on.create(GROUP, VERSION, SERVERS)
@kopf.on.update(GROUP, VERSION, SERVERS, field="spec")
def on_server(body, patch: kopf.Patch, memo: kopf.Memo, **_) -> None:
    server = _server(body)
    _apply(patch, server, reconcile(memo.cluster, server, memo.settings, now()))


def _refresh(memo: kopf.Memo, name: str, namespace: str, measure: bool = False) -> None:
    """Reconcile a server that kopf did not hand us, and record the outcome ourselves."""
    server = memo.cluster.get(API_VERSION, "DevServer", name, namespace)
    if server is None or server["metadata"].get("deletionTimestamp"):
        return
    samples = memo.cpu_samples if measure else None
    outcome = reconcile(memo.cluster, server, memo.settings, now(), measure=samples)
    changed = _changed(server, outcome.status)
    if changed:
        memo.cluster.patch_status(name, namespace, changed)
    if outcome.spec:
        memo.cluster.patch(API_VERSION, "DevServer", name, namespace, {"spec": outcome.spec})


@kopf.on.event("v1", "pods", labels={SERVER_LABEL: kopf.PRESENT})
def on_pod(labels, namespace, memo: kopf.Memo, **_) -> None:
    """A pod became ready, was admitted or went away: the server's phase follows at once."""
    _refresh(memo, labels[SERVER_LABEL], namespace)


@kopf.on.event(GROUP, VERSION, FLAVORS)
async def on_flavor(type, name, memo: kopf.Memo, servers_by_flavor: kopf.Index, **_) -> None:
    """A changed or deleted flavor reaches every server using it (their pods are replaced)."""
    if type is None:
        return  # the listing at start: nothing changed (kopf resumes every server anyway)
    for namespace, server in _servers(servers_by_flavor, name):
        await asyncio.to_thread(_refresh, memo, server, namespace)
