"""Record which nodes ran and which jobs held quota, so `devctl usage` can count them after the
cluster has forgotten them: a Workload goes with its job, a Node with its instance.

One run (the stack's CronJob runs it every few minutes on the system nodes) reads what exists and
writes what it saw into ConfigMaps, per kind, namespace and UTC day (records.py):
  - `usage-nodes-<day>` in --record-namespace: every Node of a pool (--pool-label), keyed by its
    uid, from its creationTimestamp to the run that last saw it, with its pool, instance type
    (node.kubernetes.io/instance-type) and capacity type (karpenter.sh/capacity-type);
  - `usage-jobs-<day>` in each team namespace (--namespaces): every admission of a Kueue Workload
    (kueue.x-k8s.io/v1beta2), keyed by the Workload's uid and the admission's start, with the job
    it was made for (its controller owner), per pod set the pool it was admitted to (the flavor,
    named after the pool), the resources admitted and the instance and capacity types of the
    nodes its pods ran on (its pods: those with the labels each operator sets, --job-pods, and a
    controller), kept across runs once the pods are gone.
A record goes into the map of the day it started (a further one once a map nears the API
server's 1 MiB). An admission runs from the Admitted condition's lastTransitionTime to the
Finished condition's (Kueue leaves Admitted True beside Finished: pkg/workload/finish), or, once
Kueue evicted it, to the lastTransitionTime of Admitted turned False (pkg/workload/workload.go
UnsetQuotaReservationWithCondition, which also clears the admission, and admissionchecks.go
SyncAdmittedCondition; kubernetes-sigs/kueue v0.19.2 and main at ff69552e, the pinned v0.20.7 is
not readable here). An admission or a node that vanished between two runs ends at the run that
last saw it, so a record is short by at most the schedule's interval, and one that came and went
between two runs is not recorded.
Records open at the last run are `open`; a map is deleted once every record in it ended more
than --keep-days ago. A namespace the API server refuses is left for the next run, the others
recorded, and the run fails so that the CronJob's failed Job says so.

Tenants cannot change the record: team members may read ConfigMaps in their own namespace, not
write them; the node maps are in a namespace they cannot read.
"""

import argparse
import json
import sys
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from usagerecorder.records import (
    CAPACITY_TYPE_LABEL,
    INSTANCE_TYPE_LABEL,
    JOB_MAP,
    MAX_MAP_BYTES,
    NODE_MAP,
    ON_DEMAND,
    RECORD_LABEL,
    admitted_now,
    condition,
    controller,
    current_key,
    entries,
    job_pods,
    labels,
    parse,
    records_of,
    stamp,
    workload_uid,
)

WORKLOADS = ("kueue.x-k8s.io", "v1beta2", "workloads")


def node_records(nodes: Iterable[dict], pool_label: str, now: datetime) -> dict[str, dict]:
    """{uid: record} of the pools' nodes that exist now."""
    found = {}
    for node in nodes:
        if pool_label not in labels(node):
            continue  # the system nodes: the stack's floor, no pool's
        found[node["metadata"]["uid"]] = {
            "name": node["metadata"]["name"],
            "pool": labels(node)[pool_label],
            "instanceType": labels(node).get(INSTANCE_TYPE_LABEL, ""),
            "capacity": labels(node).get(CAPACITY_TYPE_LABEL, ON_DEMAND),
            "from": stamp(parse(node["metadata"]["creationTimestamp"])),
            "to": stamp(now),
            "open": True,
        }
    return found


def job_records(
    workloads: Iterable[dict],
    pods: list[dict],
    nodes: dict[str, dict],
    pod_labels: dict[str, dict[str, str]],
    pool_label: str,
    now: datetime,
) -> dict[str, dict]:
    """{workload uid.admission start: record} of the admissions that hold quota now (or held it
    until the job finished: Kueue leaves Admitted True beside Finished)."""
    found = {}
    for workload in workloads:
        admitted = admitted_now(workload)
        admission = (workload.get("status") or {}).get("admission")
        if admitted is None or not admission:
            continue
        finished = condition(workload, "Finished")
        done = finished is not None and finished.get("status") == "True"
        on = [nodes[p["spec"]["nodeName"]] for p in job_pods(workload, pods, pod_labels)
              if (p.get("spec") or {}).get("nodeName") in nodes]  # fmt: skip
        pod_sets = []
        for assignment in admission.get("podSetAssignments") or []:
            pool = next(iter((assignment.get("flavors") or {}).values()), "")
            seen = [labels(n) for n in on if labels(n).get(pool_label) == pool]
            pod_sets.append(
                {
                    "name": assignment.get("name", ""),
                    "pool": pool,
                    "usage": assignment.get("resourceUsage") or {},
                    "instanceTypes": sorted({n.get(INSTANCE_TYPE_LABEL, "") for n in seen}),
                    "capacities": sorted({n.get(CAPACITY_TYPE_LABEL, ON_DEMAND) for n in seen}),
                }
            )
        owner = controller(workload)
        found[current_key(workload)] = {
            "workload": workload["metadata"]["name"],
            "job": f"{owner['kind']}/{owner['name']}" if owner else workload["metadata"]["name"],
            "podSets": pod_sets,
            "from": stamp(parse(admitted["lastTransitionTime"])),
            "to": stamp(parse(finished["lastTransitionTime"]) if done else now),
            "open": not done,
        }
    return found


def close(record: dict, workload: dict | None) -> dict:
    """A record that was open at the last run and whose admission or node is gone: it ends when
    Kueue took the quota back, if the Workload says so, else at the run that last saw it."""
    ended = condition(workload, "Admitted")
    if ended and ended.get("status") == "False":
        at = stamp(parse(ended["lastTransitionTime"]))
        if at >= record["from"]:
            return {**record, "to": at, "open": False}
    return {**record, "open": False}


def _with_earlier_nodes(record: dict, before: dict) -> dict:
    """`record` with the instance and capacity types its pod sets were seen on before: once its
    pods are gone (drained at an eviction, cleaned up after the job finished) a run sees none."""
    if "podSets" not in record:
        return record
    earlier = {p["name"]: p for p in before.get("podSets") or []}
    pod_sets = []
    for pod_set in record["podSets"]:
        was = earlier.get(pod_set["name"], {})
        pod_sets.append(
            {
                **pod_set,
                **{
                    key: sorted(set(pod_set[key]) | set(was.get(key) or []))
                    for key in ("instanceTypes", "capacities")
                },
            }
        )
    return {**record, "podSets": pod_sets}


def merged(
    recorded: dict[str, tuple[str, dict]], current: dict[str, dict], workloads: dict[str, dict]
) -> tuple[dict[str, dict[str, dict]], dict[str, dict]]:
    """What to write: ({map name: {key: record}} of records kept where they are, {key: record}
    of new ones). `recorded` is {key: (map, record)} as stored; `current` what this run saw;
    `workloads` the Workloads by uid (none for nodes)."""
    updates: dict[str, dict[str, dict]] = {}
    new = {}
    for key, record in current.items():
        if key not in recorded:
            new[key] = record
            continue
        where, before = recorded[key]
        record = _with_earlier_nodes(record, before)
        if record != before:
            updates.setdefault(where, {})[key] = record
    for key, (where, record) in recorded.items():
        if record["open"] and key not in current:
            updates.setdefault(where, {})[key] = close(record, workloads.get(workload_uid(key)))
    return updates, new


def _size(records: dict[str, str]) -> int:
    return sum(len(text.encode()) for text in records.values())


def placed(maps: list[dict], new: dict[str, dict], prefix: str) -> dict[str, dict[str, str]]:
    """{map name: {key: JSON}} for the new records: each into a map of the day it began, the
    first of that day's maps with room under MAX_MAP_BYTES (`<prefix><day>`, then `-1`, ...)."""
    room = {m["metadata"]["name"]: _size(m.get("data") or {}) for m in maps}
    found: dict[str, dict[str, str]] = {}
    for key, record in sorted(new.items(), key=lambda item: item[1]["from"]):
        text = json.dumps(record, sort_keys=True)
        day = f"{prefix}{parse(record['from']):%Y-%m-%d}"
        n = 0
        while room.get(name := day if n == 0 else f"{day}-{n}", 0) + len(text) > MAX_MAP_BYTES:
            n += 1
        room[name] = room.get(name, 0) + len(text)
        found.setdefault(name, {})[key] = text
    return found


def expired(maps: list[dict], oldest: datetime) -> list[str]:
    """The maps whose every record is closed and ended before `oldest`: a record still open, or
    one that ran into the kept days, keeps its map however old the day it began."""
    ends: dict[str, list[tuple[bool, str]]] = {m["metadata"]["name"]: [] for m in maps}
    for meta, _, record in entries(maps):
        ends[meta["name"]].append((record["open"], record["to"]))
    cutoff = stamp(oldest)
    return sorted(n for n, found in ends.items() if not any(o or to >= cutoff for o, to in found))


def record(
    core: client.CoreV1Api,
    namespace: str,
    kind: str,
    current: dict[str, dict],
    workloads: dict[str, dict],
    oldest: datetime,
) -> int:
    """Fold what this run saw into the namespace's maps of `kind`; returns the records written."""
    prefix = NODE_MAP if kind == "nodes" else JOB_MAP
    maps = _list(
        core.list_namespaced_config_map, namespace, label_selector=f"{RECORD_LABEL}={kind}"
    )
    updates, new = merged(records_of(maps), current, workloads)
    existing = {m["metadata"]["name"] for m in maps}
    writes = {name: {k: json.dumps(r, sort_keys=True) for k, r in found.items()}
              for name, found in updates.items()}  # fmt: skip
    for name, found in placed(maps, new, prefix).items():
        writes.setdefault(name, {}).update(found)
    for name, data in sorted(writes.items()):
        if name in existing:
            core.patch_namespaced_config_map(
                name, namespace, {"data": data}, _content_type="application/merge-patch+json"
            )
        else:
            body = {"metadata": {"name": name, "labels": {RECORD_LABEL: kind}}, "data": data}
            core.create_namespaced_config_map(namespace, body)
    for name in expired([m for m in maps if m["metadata"]["name"] not in writes], oldest):
        core.delete_namespaced_config_map(name, namespace)
    return sum(len(data) for data in writes.values())


def _list(call, *args, **kwargs) -> list[dict]:
    """The items of a list call, as the API server sent them (dicts, not the client's models)."""
    return json.loads(call(*args, **kwargs, _preload_content=False).data)["items"]


def run(
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    record_namespace: str,
    namespaces: list[str],
    pool_label: str,
    pod_labels: dict[str, dict[str, str]],
    keep: timedelta,
    now: datetime,
) -> tuple[dict[str, int], dict[str, str]]:
    """One pass: ({namespace: records written}, {namespace: why it failed}). A namespace the API
    refuses (a map past its size, a name taken) fails alone: the others are still recorded."""
    oldest = now - keep
    written, failed = {}, {}
    nodes = {n["metadata"]["name"]: n for n in _list(core.list_node)}
    try:
        current = node_records(nodes.values(), pool_label, now)
        written[record_namespace] = record(core, record_namespace, "nodes", current, {}, oldest)
    except ApiException as e:
        failed[record_namespace] = f"{e.status} {e.reason}"
    for namespace in namespaces:
        try:
            workloads = _list(custom.list_namespaced_custom_object, *WORKLOADS[:2], namespace,
                              WORKLOADS[2])  # fmt: skip
            pods = _list(core.list_namespaced_pod, namespace)
            current = job_records(workloads, pods, nodes, pod_labels, pool_label, now)
            by_uid = {w["metadata"]["uid"]: w for w in workloads}
            written[namespace] = record(core, namespace, "jobs", current, by_uid, oldest)
        except ApiException as e:
            failed[namespace] = f"{e.status} {e.reason}"
    return written, failed


def pod_labels_arg(text: str) -> tuple[str, dict[str, str]]:
    """`Kind=label=value,label=value`: the labels of a job's pods ({name}: the job's name)."""
    kind, _, labels = text.partition("=")
    pairs = [item.split("=", 1) for item in labels.split(",") if item]
    if not kind or not pairs or any(len(p) != 2 for p in pairs):
        raise argparse.ArgumentTypeError(f"{text!r}: want Kind=label=value[,label=value]")
    return kind, dict(pairs)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m usagerecorder.recorder",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--record-namespace", required=True, help="where the node maps go")
    parser.add_argument("--namespaces", required=True, help="team namespaces, comma-separated")
    parser.add_argument("--pool-label", required=True, help="the label naming a node's pool")
    parser.add_argument(
        "--job-pods",
        type=pod_labels_arg,
        action="append",
        required=True,
        help="Kind=label=value[,label=value]: the labels of a job's pods, {name} its name",
    )
    parser.add_argument(
        "--keep-days", type=int, required=True, help="days of maps kept (billing.usageRecordDays)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    # In the pod: its ServiceAccount; elsewhere: $KUBECONFIG.
    try:
        config.load_config()
    except config.ConfigException as e:
        print(
            f"usagerecorder: no cluster credentials (not in a pod, no kubeconfig): {e}",
            file=sys.stderr,
        )
        return 2
    try:
        written, failed = run(
            client.CoreV1Api(),
            client.CustomObjectsApi(),
            args.record_namespace,
            [n for n in args.namespaces.split(",") if n],
            args.pool_label,
            dict(args.job_pods),
            timedelta(days=args.keep_days),
            datetime.now(UTC),
        )
    except HTTPError as e:  # urllib3's MaxRetryError: refused, or a name that does not resolve
        host = client.Configuration.get_default_copy().host
        reason = getattr(e, "reason", None) or e
        print(f"usagerecorder: cannot reach the API server at {host}: {reason}", file=sys.stderr)
        return 2
    print(" ".join(f"{ns}={count}" for ns, count in written.items()), flush=True)
    for namespace, why in failed.items():
        print(f"usagerecorder: namespace {namespace} not recorded: {why}", file=sys.stderr)
    # A failed namespace fails the run, so the CronJob's Job shows it (failedJobsHistoryLimit).
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
