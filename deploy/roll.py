"""Move running jobs off a pool's drifted nodes now, each restarting once from its checkpoint.

    .venv/bin/python -m deploy.roll --stack prod --pool gpu-large          # what it would do
    .venv/bin/python -m deploy.roll --stack prod --pool gpu-large --yes    # do it

Needs the cluster (a kubeconfig, e.g. `aws eks update-kubeconfig --name <cluster>`) and the rights
of a platform admin. Drift (an AMI or Kubernetes upgrade, a NodePool or EC2NodeClass edit) never
takes a node from under a running job or DevServer: the pools have no terminationGracePeriod, so
their pods' `karpenter.sh/do-not-disrupt` keeps the node (kubernetes-sigs/karpenter at
KARPENTER_CHART, pkg/controllers/disruption/types.go NewCandidate). This command moves the jobs on
purpose:

1. finds the pool's drifted NodeClaims (condition Drifted=True) and the jobs with pods on them;
2. deactivates each job's Kueue Workload (`spec.active: false`): Kueue evicts it, the job is
   suspended and its pods get SIGTERM, on which the trainer saves a checkpoint (Kueue at KUEUE_CHART
   pkg/controller/core/workload_controller.go, reason Deactivated);
3. once no pod of those jobs is left on a drifted node, deletes those NodeClaims: nothing holds
   them any more, and Karpenter terminates them;
4. activates the Workloads again: Kueue queues and admits each job once, Karpenter launches
   current nodes for it, and the trainer resumes from its newest checkpoint.
A drifted node that still runs a DevServer is left alone and named: its user decides when to
stop the server (`devctl stop`).
"""

import argparse
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from deploy.cluster_access import add_arguments, with_cluster
from infra.core.config import ConfigError
from infra.core.paths import PROJECT_DIR
from infra.stack.loading import load_stack_file

NODECLAIMS = ("karpenter.sh", "v1", "nodeclaims")
WORKLOADS = ("kueue.x-k8s.io", "v1beta2", "workloads")
POOL_LABEL = "karpenter.sh/nodepool"
# Pods of the DevServer operator's StatefulSets carry their server's name (devservers/api.py).
SERVER_LABEL = "dev.training-platform.io/server"


@dataclass
class Roll:
    claims: list[dict] = field(default_factory=list)  # drifted NodeClaims that can go
    workloads: dict[tuple[str, str], dict] = field(default_factory=dict)  # (ns, name) -> Workload
    held: dict[str, list[str]] = field(default_factory=dict)  # node -> DevServer pods on it

    @property
    def nodes(self) -> set[str]:
        return {c["status"]["nodeName"] for c in self.claims if c.get("status", {}).get("nodeName")}


def drifted(claim: dict) -> bool:
    conditions = (claim.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Drifted" and c.get("status") == "True" for c in conditions)


def _owner_uids(obj: dict) -> list[str]:
    return [o["uid"] for o in obj["metadata"].get("ownerReferences") or [] if o.get("uid")]


class Cluster:
    """The calls the roll makes, through the kubernetes client."""

    def __init__(self, api_client):
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)

    def claims(self, pool: str) -> list[dict]:
        group, version, plural = NODECLAIMS
        found = self.custom.list_cluster_custom_object(
            group, version, plural, label_selector=f"{POOL_LABEL}={pool}"
        )
        return found["items"]

    def pods_on(self, node: str) -> list[dict]:
        found = self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}")
        return [self.core.api_client.sanitize_for_serialization(p) for p in found.items]

    def workloads(self, namespace: str) -> list[dict]:
        group, version, plural = WORKLOADS
        return self.custom.list_namespaced_custom_object(group, version, namespace, plural)["items"]

    def job_owners(self, namespace: str, uid: str) -> list[str]:
        """The owners of a batch Job (an MPIJob's launcher) with this uid."""
        for job in self.batch.list_namespaced_job(namespace).items:
            if job.metadata.uid == uid:
                return [o.uid for o in job.metadata.owner_references or []]
        return []

    def activate(self, namespace: str, name: str, active: bool) -> None:
        group, version, plural = WORKLOADS
        self.custom.patch_namespaced_custom_object(
            group, version, namespace, plural, name, {"spec": {"active": active}}
        )

    def delete_claim(self, name: str) -> None:
        group, version, plural = NODECLAIMS
        self.custom.delete_cluster_custom_object(group, version, plural, name)


def survey(cluster: Cluster, pool: str) -> Roll:
    roll = Roll()
    for claim in cluster.claims(pool):
        if not drifted(claim):
            continue
        node = (claim.get("status") or {}).get("nodeName")
        pods = cluster.pods_on(node) if node else []
        servers = [p["metadata"]["name"] for p in pods if SERVER_LABEL in _labels(p)]
        if servers:
            roll.held[node] = servers
            continue
        roll.claims.append(claim)
        for pod in pods:
            workload = _workload_of(cluster, pod)
            if workload is not None:
                meta = workload["metadata"]
                roll.workloads[(meta["namespace"], meta["name"])] = workload
    return roll


def _labels(obj: dict) -> dict:
    return obj["metadata"].get("labels") or {}


def _workload_of(cluster: Cluster, pod: dict) -> dict | None:
    """The Kueue Workload of the job a pod belongs to: Workloads are owned by the job, as are its
    pods (a PyTorchJob's, an MPIJob's workers) or the batch Job that owns them (an MPIJob's
    launcher)."""
    namespace = pod["metadata"]["namespace"]
    workloads = cluster.workloads(namespace)

    def owned_by(uids: list[str]) -> dict | None:
        return next((w for w in workloads if set(_owner_uids(w)) & set(uids)), None)

    owners = _owner_uids(pod)
    return owned_by(owners) or owned_by(
        [uid for owner in owners for uid in cluster.job_owners(namespace, owner)]
    )


def run(cluster: Cluster, pool: str, act: bool, timeout: float, poll: float = 2.0) -> int:
    roll = survey(cluster, pool)
    for node, servers in sorted(roll.held.items()):
        print(f"left alone: node {node} runs DevServer pods {', '.join(servers)} (their users "
              "stop them with devctl stop; the node rolls once they are gone)")  # fmt: skip
    if not roll.claims:
        print(f"nothing to roll: no drifted node of pool {pool} without a DevServer")
        return 0
    jobs = sorted(f"{ns}/{name}" for ns, name in roll.workloads)
    print(
        f"pool {pool}: {len(roll.claims)} drifted nodes "
        f"({', '.join(sorted(c['metadata']['name'] for c in roll.claims))}); jobs that restart "
        f"once from their checkpoint: {', '.join(jobs) or 'none'}"
    )
    if not act:
        print("nothing done: run again with --yes to roll")
        return 0
    for namespace, name in sorted(roll.workloads):
        cluster.activate(namespace, name, False)
        print(f"deactivated workload {namespace}/{name}: its pods stop with a checkpoint")
    deadline = time.monotonic() + timeout
    while True:
        left = [
            p["metadata"]["name"]
            for node in roll.nodes
            for p in cluster.pods_on(node)
            if _workload_of(cluster, p) is not None
        ]
        if not left:
            break
        if time.monotonic() > deadline:
            print(
                f"error: after {timeout:g} s these pods still run on drifted nodes: "
                f"{', '.join(sorted(left))}; their workloads stay deactivated (activate them "
                'with: kubectl patch workload <name> --type merge -p \'{"spec":{"active":true}}\')',
                file=sys.stderr,
            )
            return 1
        time.sleep(poll)
    for claim in roll.claims:
        cluster.delete_claim(claim["metadata"]["name"])
        print(f"deleted drifted NodeClaim {claim['metadata']['name']}")
    for namespace, name in sorted(roll.workloads):
        cluster.activate(namespace, name, True)
        print(f"activated workload {namespace}/{name}: Kueue admits it again on current nodes")
    return 0


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m deploy.roll", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--stack", required=True, help="stack name: reads Pulumi.<stack>.yaml")
    parser.add_argument(
        "--pool", required=True, help="the NodePool whose drifted nodes to roll (required)"
    )
    parser.add_argument(
        "--yes", action="store_true", help="roll (default: off, only say what it would do)"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=1800,
        help="seconds to wait for the jobs' pods to stop (default: 1800)",
    )
    add_arguments(parser)
    parser.add_argument(
        "--project-dir",
        type=Path,
        help="folder of the stack files (default: this checkout)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        config = load_stack_file(args.stack, args.project_dir or PROJECT_DIR)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    pools = [p.name for p in config.node_pools]
    if args.pool not in pools:
        print(
            f"error: --pool {args.pool}: no such NodePool in {args.stack}; "
            f"allowed: {', '.join(pools)}",
            file=sys.stderr,
        )
        return 2
    return with_cluster(
        args, lambda api_client: run(Cluster(api_client), args.pool, args.yes, args.timeout)
    )


if __name__ == "__main__":
    sys.exit(main())
