"""Record which nodes ran and which jobs held quota, so `devctl usage` can count them after the
cluster has forgotten them: a Workload goes with its job, a Node with its instance.

One run (the stack's CronJob runs it every few minutes on the system nodes) reads what exists and
writes what it saw into ConfigMaps, one per kind, namespace and UTC day:
  - `usage-nodes-<day>` in --record-namespace: every Node of a pool (--pool-label), keyed by its
    uid, from its creationTimestamp to the run that last saw it, with its pool, instance type
    (node.kubernetes.io/instance-type) and capacity type (karpenter.sh/capacity-type);
  - `usage-jobs-<day>` in each team namespace (--namespaces): every admission of a Kueue Workload
    (kueue.x-k8s.io/v1beta2), keyed by the Workload's uid and the admission's start, with the job
    it was made for (its controller owner), per pod set the pool it was admitted to (the flavor,
    named after the pool), the resources admitted and the instance and capacity types of the
    nodes its pods ran on (pods found by the labels each operator sets: --job-pods).
A record goes into the map of the day it started. An admission runs from the Admitted condition's
lastTransitionTime to the Finished condition's, or, once Kueue evicted it (Admitted turns False:
Kueue pkg/workload/workload.go UnsetQuotaReservationWithCondition, v0.19.2; the same at v0.20),
to that condition's lastTransitionTime; an admission or a node that vanished between two runs
ends at the run that last saw it, so a record is short by at most the schedule's interval.
Records open at the last run are `open`; maps older than --keep-days are deleted.

Tenants cannot change the record: team members may read ConfigMaps in their own namespace, not
write them; the node maps are in a namespace they cannot read.
"""

import argparse
import json
import sys
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from kubernetes import client, config
from urllib3.exceptions import HTTPError

from usagerecorder.records import (
    JOB_MAP,
    NODE_MAP,
    RECORD_LABEL,
    admission_key,
    records_of,
    workload_uid,
)

INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
CAPACITY_TYPE_LABEL = "karpenter.sh/capacity-type"
WORKLOADS = ("kueue.x-k8s.io", "v1beta2", "workloads")


def stamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse(text: str) -> datetime:
    return datetime.fromisoformat(text)


def map_name(prefix: str, moment: datetime) -> str:
    return f"{prefix}{moment.astimezone(UTC):%Y-%m-%d}"


def _labels(obj: dict) -> dict:
    return obj["metadata"].get("labels") or {}


def _condition(obj: dict, kind: str) -> dict | None:
    found = ((obj.get("status") or {}).get("conditions")) or []
    return next((c for c in found if c.get("type") == kind), None)


def _controller(obj: dict) -> dict | None:
    refs = obj["metadata"].get("ownerReferences") or []
    return next((r for r in refs if r.get("controller")), None)


def node_records(nodes: Iterable[dict], pool_label: str, now: datetime) -> dict[str, dict]:
    """{uid: record} of the pools' nodes that exist now."""
    found = {}
    for node in nodes:
        labels = _labels(node)
        if pool_label not in labels:
            continue  # the system nodes: the stack's floor, no pool's
        found[node["metadata"]["uid"]] = {
            "name": node["metadata"]["name"],
            "pool": labels[pool_label],
            "instanceType": labels.get(INSTANCE_TYPE_LABEL, ""),
            "capacity": labels.get(CAPACITY_TYPE_LABEL, "on-demand"),
            "from": node["metadata"]["creationTimestamp"],
            "to": stamp(now),
            "open": True,
        }
    return found


def job_pods(workload: dict, pods: list[dict], job_pods: dict[str, dict[str, str]]) -> list[dict]:
    """The pods of the job the Workload was made for, by the labels its operator sets
    (`job_pods`: kind -> labels, `{name}` standing for the job's name)."""
    owner = _controller(workload)
    wanted = job_pods.get(owner["kind"]) if owner else None
    if wanted is None:
        return []
    wanted = {k: v.replace("{name}", owner["name"]) for k, v in wanted.items()}
    return [p for p in pods if wanted.items() <= _labels(p).items()]


def job_records(
    workloads: Iterable[dict],
    pods: list[dict],
    nodes: dict[str, dict],
    job_pod_labels: dict[str, dict[str, str]],
    pool_label: str,
    now: datetime,
) -> dict[str, dict]:
    """{workload uid.admission start: record} of the admissions that hold quota now (or held it
    until the job finished)."""
    found = {}
    for workload in workloads:
        admitted = _condition(workload, "Admitted")
        admission = (workload.get("status") or {}).get("admission")
        if not admitted or admitted.get("status") != "True" or not admission:
            continue
        finished = _condition(workload, "Finished")
        done = finished is not None and finished.get("status") == "True"
        on = [nodes[p["spec"]["nodeName"]] for p in job_pods(workload, pods, job_pod_labels)
              if (p.get("spec") or {}).get("nodeName") in nodes]  # fmt: skip
        pod_sets = []
        for assignment in admission.get("podSetAssignments") or []:
            pool = next(iter((assignment.get("flavors") or {}).values()), "")
            seen = [n for n in on if _labels(n).get(pool_label) == pool]
            pod_sets.append(
                {
                    "name": assignment.get("name", ""),
                    "pool": pool,
                    "usage": assignment.get("resourceUsage") or {},
                    "instanceTypes": sorted(
                        {_labels(n).get(INSTANCE_TYPE_LABEL, "") for n in seen}
                    ),
                    "capacities": sorted(
                        {_labels(n).get(CAPACITY_TYPE_LABEL, "on-demand") for n in seen}
                    ),
                }
            )
        owner = _controller(workload)
        key = admission_key(workload["metadata"]["uid"], admitted["lastTransitionTime"])
        found[key] = {
            "workload": workload["metadata"]["name"],
            "job": f"{owner['kind']}/{owner['name']}" if owner else workload["metadata"]["name"],
            "podSets": pod_sets,
            "from": stamp(parse(admitted["lastTransitionTime"])),
            "to": finished["lastTransitionTime"] if done else stamp(now),
            "open": not done,
        }
    return found


def close(record: dict, workload: dict | None) -> dict:
    """A record that was open at the last run and whose admission or node is gone: it ends when
    Kueue took the quota back, if the Workload says so, else at the run that last saw it."""
    ended = _condition(workload, "Admitted") if workload else None
    if ended and ended.get("status") == "False":
        at = stamp(parse(ended["lastTransitionTime"]))
        if at >= record["from"]:
            return {**record, "to": at, "open": False}
    return {**record, "open": False}


def merged(
    recorded: dict[str, tuple[str, dict]],
    current: dict[str, dict],
    workloads: dict[str, dict],
    prefix: str,
) -> dict[str, dict[str, dict]]:
    """{map name: {key: record}}: what to write. `recorded` is {key: (map, record)} as stored;
    `current` what this run saw; `workloads` the Workloads by uid (none for nodes)."""
    writes: dict[str, dict[str, dict]] = {}
    for key, record in current.items():
        where = recorded[key][0] if key in recorded else map_name(prefix, parse(record["from"]))
        if key not in recorded or recorded[key][1] != record:
            writes.setdefault(where, {})[key] = record
    for key, (where, record) in recorded.items():
        if record.get("open") and key not in current:
            writes.setdefault(where, {})[key] = close(record, workloads.get(workload_uid(key)))
    return writes


def read_maps(core: client.CoreV1Api, namespace: str, kind: str) -> list[dict]:
    found = core.list_namespaced_config_map(
        namespace, label_selector=f"{RECORD_LABEL}={kind}", _preload_content=False
    )
    return json.loads(found.data)["items"]


def write(
    core: client.CoreV1Api,
    namespace: str,
    kind: str,
    maps: list[dict],
    writes: dict[str, dict[str, dict]],
) -> None:
    existing = {m["metadata"]["name"] for m in maps}
    for name, records in sorted(writes.items()):
        data = {key: json.dumps(record, sort_keys=True) for key, record in records.items()}
        if name in existing:
            core.patch_namespaced_config_map(
                name, namespace, {"data": data}, _content_type="application/merge-patch+json"
            )
        else:
            core.create_namespaced_config_map(
                namespace,
                {
                    "metadata": {"name": name, "labels": {RECORD_LABEL: kind}},
                    "data": data,
                },
            )


def prune(
    core: client.CoreV1Api, namespace: str, maps: list[dict], prefix: str, oldest: datetime
) -> list[str]:
    """Delete the maps of days before `oldest`; returns their names."""
    names = [m["metadata"]["name"] for m in maps if m["metadata"]["name"].startswith(prefix)]
    gone = [name for name in names if name < map_name(prefix, oldest)]
    for name in gone:
        core.delete_namespaced_config_map(name, namespace)
    return gone


def _list(call, *args) -> list[dict]:
    return json.loads(call(*args, _preload_content=False).data)["items"]


def run(
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    record_namespace: str,
    namespaces: list[str],
    pool_label: str,
    job_pod_labels: dict[str, dict[str, str]],
    keep: timedelta,
    now: datetime,
) -> dict[str, int]:
    """One pass; returns how many records it wrote per namespace."""
    oldest = now - keep
    written = {}
    nodes = {n["metadata"]["name"]: n for n in _list(core.list_node)}
    maps = read_maps(core, record_namespace, "nodes")
    writes = merged(records_of(maps), node_records(nodes.values(), pool_label, now), {}, NODE_MAP)
    write(core, record_namespace, "nodes", maps, writes)
    prune(core, record_namespace, maps, NODE_MAP, oldest)
    written[record_namespace] = sum(len(w) for w in writes.values())
    for namespace in namespaces:
        workloads = _list(custom.list_namespaced_custom_object, *WORKLOADS[:2], namespace,
                          WORKLOADS[2])  # fmt: skip
        pods = _list(core.list_namespaced_pod, namespace)
        current = job_records(workloads, pods, nodes, job_pod_labels, pool_label, now)
        maps = read_maps(core, namespace, "jobs")
        by_uid = {w["metadata"]["uid"]: w for w in workloads}
        writes = merged(records_of(maps), current, by_uid, JOB_MAP)
        write(core, namespace, "jobs", maps, writes)
        prune(core, namespace, maps, JOB_MAP, oldest)
        written[namespace] = sum(len(w) for w in writes.values())
    return written


def job_pods_arg(text: str) -> tuple[str, dict[str, str]]:
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
        type=job_pods_arg,
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
        written = run(
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
