"""The records' format and the rules the recorder (recorder.py) and `devctl usage`
(devservers/usage_report.py) share: ConfigMaps labelled RECORD_LABEL, one or more per kind,
namespace and UTC day, each data key one record in JSON."""

import json
from collections.abc import Iterator
from datetime import UTC, datetime

# The recorder's own namespace, which holds the node maps (infra/billing/usage_recorder.py).
RECORD_NAMESPACE = "usage-records"
NODE_MAP, JOB_MAP = "usage-nodes-", "usage-jobs-"
RECORD_LABEL = "training-platform/usage-record"  # its value: nodes or jobs
# The API server refuses a ConfigMap whose data values sum past 1 MiB (kubernetes
# pkg/apis/core/validation/validation.go ValidateConfigMap: core.MaxSecretSize): a day's records
# go on into a further map (`<prefix><day>-1`, ...) well before that.
MAX_MAP_BYTES = 900 * 1024
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
CAPACITY_TYPE_LABEL = "karpenter.sh/capacity-type"
ON_DEMAND = "on-demand"  # what Karpenter's nodes without the label are
NODE_FIELDS = {"name", "pool", "instanceType", "capacity", "from", "to", "open"}
JOB_FIELDS = {"workload", "job", "podSets", "from", "to", "open"}


def stamp(moment: datetime) -> str:
    """A record's time: RFC 3339, UTC, seconds, as the API server writes its own."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse(text: str) -> datetime:
    return datetime.fromisoformat(text)


def labels(obj: dict) -> dict:
    return obj["metadata"].get("labels") or {}


def controller(obj: dict) -> dict | None:
    """The owner reference that names the object's controller (the API server allows one)."""
    refs = obj["metadata"].get("ownerReferences") or []
    return next((r for r in refs if r.get("controller")), None)


def job_pods(workload: dict, pods: list[dict], pod_labels: dict[str, dict[str, str]]) -> list[dict]:
    """The pods of the job the Workload was made for: those with the labels its operator sets
    (`pod_labels`: per job kind, `{name}` standing for the job's name) and a controller. A pod a
    team member makes has no owner at all (infra/teams/access.py POD_POLICY), so one carrying a
    job's labels on a cheaper node cannot pass for part of it."""
    owner = controller(workload)
    wanted = pod_labels.get(owner["kind"]) if owner else None
    if wanted is None:
        return []
    wanted = {k: v.replace("{name}", owner["name"]) for k, v in wanted.items()}
    return [p for p in pods if wanted.items() <= labels(p).items() and controller(p)]


def condition(obj: dict | None, kind: str) -> dict | None:
    found = ((obj or {}).get("status") or {}).get("conditions") or []
    return next((c for c in found if c.get("type") == kind), None)


def admitted_now(workload: dict) -> dict | None:
    """The Admitted condition of a Workload that holds quota now, or held it until its job
    finished (Kueue leaves Admitted True beside Finished)."""
    admitted = condition(workload, "Admitted")
    return admitted if admitted and admitted.get("status") == "True" else None


def current_key(workload: dict) -> str | None:
    """The record key of the Workload's admission that holds quota now: its uid and when the
    admission began (the Admitted condition's lastTransitionTime), in seconds since the epoch."""
    admitted = admitted_now(workload)
    if admitted is None:
        return None
    return f"{workload['metadata']['uid']}.{int(parse(admitted['lastTransitionTime']).timestamp())}"


def workload_uid(key: str) -> str:
    return key.split(".")[0]


def _well_formed(record: object) -> bool:
    if not isinstance(record, dict):
        return False
    if not (NODE_FIELDS <= record.keys() or JOB_FIELDS <= record.keys()):
        return False
    try:
        return parse(record["from"]) <= parse(record["to"])
    except (TypeError, ValueError):
        return False


def entries(maps: list[dict]) -> Iterator[tuple[dict, str, dict]]:
    """(the map's metadata, key, record) of every record the maps hold. Only a cluster
    administrator can edit a map by hand; a record that no longer reads as one is skipped rather
    than stopping every later run and report."""
    for stored in maps:
        for key, text in (stored.get("data") or {}).items():
            try:
                record = json.loads(text)
            except ValueError:
                continue
            if _well_formed(record):
                yield stored["metadata"], key, record


def records_of(maps: list[dict]) -> dict[str, tuple[str, dict]]:
    """{key: (the name of the map that holds it, record)}."""
    return {key: (meta["name"], record) for meta, key, record in entries(maps)}
