"""The records' format, which the recorder writes (recorder.py) and `devctl usage` reads
(devservers/usage_report.py): ConfigMaps labelled RECORD_LABEL, one per kind, namespace and UTC
day, each data key one record in JSON."""

import json
from collections.abc import Iterator
from datetime import datetime

# The recorder's own namespace, which holds the node maps (infra/billing/usage_recorder.py).
RECORD_NAMESPACE = "usage-records"
NODE_MAP, JOB_MAP = "usage-nodes-", "usage-jobs-"
RECORD_LABEL = "training-platform/usage-record"  # its value: nodes or jobs


def admission_key(uid: str, admitted_at: str) -> str:
    """A job record's key: its Workload's uid and when the admission began (the Admitted
    condition's lastTransitionTime), in seconds since the epoch."""
    return f"{uid}.{int(datetime.fromisoformat(admitted_at).timestamp())}"


def workload_uid(key: str) -> str:
    return key.split(".")[0]


def entries(maps: list[dict]) -> Iterator[tuple[dict, str, dict]]:
    """(the map's metadata, key, record) of every record the maps hold. Only a cluster
    administrator can edit a map by hand; a record that no longer reads as JSON is skipped
    rather than stopping every later run and report."""
    for stored in maps:
        for key, text in (stored.get("data") or {}).items():
            try:
                record = json.loads(text)
            except ValueError:
                continue
            yield stored["metadata"], key, record


def records_of(maps: list[dict]) -> dict[str, tuple[str, dict]]:
    """{key: (the name of the map that holds it, record)}."""
    return {key: (meta["name"], record) for meta, key, record in entries(maps)}
