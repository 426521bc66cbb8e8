"""The DevServers operator: kopf handlers around devservers.controller.reconcile.

    kopf run --standalone --namespace 'dev-*' -m devservers.operator

Every change to a DevServer's spec, every change to a flavor, every pod event of a server and a
timer all run the same level-based reconcile; only the timer measures activity (it execs into
the pods), and it is the one that stops an idle server. Children are deleted by the garbage
collector through owner references: the operator needs no finalizer.
"""

import logging
from datetime import UTC, datetime

import kopf

from devservers.api import API_VERSION, FLAVORS, GROUP, SERVER_LABEL, SERVERS, VERSION
from devservers.controller import Outcome, reconcile

IDLE_CHECK_SECONDS = 60


def now() -> datetime:
    return datetime.now(UTC)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_) -> None:
    from devservers.kube import KubeCluster, settings_from_env

    # kopf's bookkeeping goes to annotations: the DevServer status schema is closed.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP)
    settings.posting.level = logging.WARNING
    memo.cluster = KubeCluster()
    memo.settings = settings_from_env()


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


@kopf.timer(GROUP, VERSION, SERVERS, interval=IDLE_CHECK_SECONDS)
def check_activity(body, patch: kopf.Patch, memo: kopf.Memo, **_) -> None:
    server = _server(body)
    _apply(patch, server, reconcile(memo.cluster, server, memo.settings, now(), measure=True))


def _refresh(memo: kopf.Memo, name: str, namespace: str) -> None:
    """Reconcile a server that kopf did not hand us, and record its status ourselves."""
    server = memo.cluster.get(API_VERSION, "DevServer", name, namespace)
    if server is None or server["metadata"].get("deletionTimestamp"):
        return
    outcome = reconcile(memo.cluster, server, memo.settings, now())
    changed = _changed(server, outcome.status)
    if changed:
        memo.cluster.patch_status(name, namespace, changed)


@kopf.on.event("v1", "pods", labels={SERVER_LABEL: kopf.PRESENT})
def on_pod(labels, namespace, memo: kopf.Memo, **_) -> None:
    """A pod became ready, was admitted or went away: the server's phase follows at once."""
    _refresh(memo, labels[SERVER_LABEL], namespace)


@kopf.on.update(GROUP, VERSION, FLAVORS, field="spec")
def on_flavor(name, memo: kopf.Memo, **_) -> None:
    """A resized flavor reaches every server using it (their pods are replaced)."""
    for server in memo.cluster.list(API_VERSION, "DevServer", None, {}):
        if server["spec"]["flavor"] == name:
            _refresh(memo, server["metadata"]["name"], server["metadata"]["namespace"])
