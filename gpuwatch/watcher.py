"""Delete the NodeClaim of a GPU node whose GPUs never registered, so Karpenter replaces it.

Why nothing else does: Karpenter marks a NodeClaim Initialized only once every extended resource
it was launched for is allocatable on its node, and has no time limit on that, only on
registration (kubernetes-sigs/karpenter v1.14.1, and for v1.15.1 its main at 2266468, the newest
readable source, the same in these files: pkg/controllers/nodeclaim/lifecycle/initialization.go
RequestedResourcesRegistered; liveness.go registrationTimeout, 15 minutes).
Until then Karpenter counts the node as the GPUs it launched it for (pkg/controllers/state/
statenode.go, Allocatable), so pending GPU pods wait for it rather than for a new node, and it is
never a disruption candidate ("node isn't initialized", ValidateNodeDisruptable). A node whose
device plugin never advertises `nvidia.com/gpu` bills until its NodePool's expireAfter.

One run (the stack's CronJob runs it every few minutes on the system nodes):
  - nodes: those matching --node-selector (the GPU pools' label), not being deleted;
  - each paired with its NodeClaim as Karpenter pairs them, by the NodeClaim's status.providerID
    (pkg/utils/node/node.go, GetNodeClaims); only NodeClaims of the --pools, not being deleted;
  - stuck: allocatable nvidia.com/gpu absent or 0 more than --timeout-seconds after the Node was
    created, Ready or not;
  - the longest stuck first, at most --max-deletions NodeClaims deleted (Karpenter then drains
    the node, terminates the instance and launches capacity for the pods that still need it);
    every stuck node gets a Warning Event, the ones past the cap saying they were left.

Its rights (the CronJob's ServiceAccount): list nodes, list and delete karpenter.sh NodeClaims,
create Events in `default`, where the API server keeps Events about cluster-scoped objects
(pkg/apis/core/validation/events.go, legacyValidateEvent).
"""

import argparse
import sys
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from kubernetes import client, config
from kubernetes.utils import parse_quantity
from urllib3.exceptions import HTTPError

GPU = "nvidia.com/gpu"
NODEPOOL_LABEL = "karpenter.sh/nodepool"
EVENT_NAMESPACE = "default"
COMPONENT = "gpu-registration-watch"
DELETED = "GPUNotRegistered"
LEFT = "GPUNotRegisteredDeletionCapped"


@dataclass(frozen=True)
class Stuck:
    node: client.V1Node
    claim: str
    pool: str
    gpus: str  # what allocatable says: "absent" or "0"

    @property
    def created(self) -> datetime:
        return self.node.metadata.creation_timestamp


def duration(delta: timedelta) -> str:
    """`17m3s`, as Kubernetes prints durations."""
    minutes, seconds = divmod(int(delta.total_seconds()), 60)
    return f"{minutes}m{seconds}s" if seconds else f"{minutes}m"


def find_stuck(
    nodes: list[client.V1Node], claims: list[dict], pools: set[str], timeout: timedelta, now
) -> list[Stuck]:
    """The rule in the module docstring, longest stuck first."""
    by_provider = {
        c["status"]["providerID"]: c
        for c in claims
        if (c.get("status") or {}).get("providerID")
        and not c["metadata"].get("deletionTimestamp")
        and (c["metadata"].get("labels") or {}).get(NODEPOOL_LABEL) in pools
    }
    stuck = []
    for node in nodes:
        claim = by_provider.get(node.spec.provider_id) if node.spec else None
        if claim is None or node.metadata.deletion_timestamp:
            continue
        gpus = ((node.status and node.status.allocatable) or {}).get(GPU)
        if gpus is not None and parse_quantity(gpus) > 0:
            continue
        if now - node.metadata.creation_timestamp <= timeout:
            continue
        pool = claim["metadata"]["labels"][NODEPOOL_LABEL]
        stuck.append(
            Stuck(node, claim["metadata"]["name"], pool, "absent" if gpus is None else gpus)
        )
    return sorted(stuck, key=lambda s: (s.created, s.node.metadata.name))


def record(core: client.CoreV1Api, node: client.V1Node, reason: str, message: str, now) -> None:
    """A Warning Event on the Node, as client-go's recorder writes one (core/v1, in `default`)."""
    name = node.metadata.name
    core.create_namespaced_event(
        EVENT_NAMESPACE,
        client.CoreV1Event(
            metadata=client.V1ObjectMeta(
                name=f"{name}.{int(now.timestamp() * 1e9):x}", namespace=EVENT_NAMESPACE
            ),
            involved_object=client.V1ObjectReference(
                api_version="v1", kind="Node", name=name, uid=node.metadata.uid
            ),
            type="Warning",
            reason=reason,
            message=message,
            source=client.V1EventSource(component=COMPONENT),
            first_timestamp=now,
            last_timestamp=now,
            count=1,
        ),
    )


def run(
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    pools: set[str],
    node_selector: str,
    timeout: timedelta,
    max_deletions: int,
    now: datetime,
) -> list[Stuck]:
    """One pass: find the stuck nodes, delete up to `max_deletions` NodeClaims, record events.
    Returns the stuck nodes whose NodeClaim it deleted."""
    nodes = core.list_node(label_selector=node_selector).items
    claims = custom.list_cluster_custom_object("karpenter.sh", "v1", "nodeclaims")["items"]
    stuck = find_stuck(nodes, claims, pools, timeout, now)
    for rank, found in enumerate(stuck):
        age = duration(now - found.created)
        what = (
            f"{GPU} is {found.gpus} in allocatable {age} after the node was created "
            f"({found.created:%Y-%m-%dT%H:%M:%SZ}), past the {duration(timeout)} timeout"
        )
        if rank < max_deletions:
            custom.delete_cluster_custom_object("karpenter.sh", "v1", "nodeclaims", found.claim)
            reason = DELETED
            message = (
                f"{what}: deleted NodeClaim {found.claim} (NodePool {found.pool}); Karpenter "
                "drains the node and replaces the capacity"
            )
        else:
            reason = LEFT
            message = (
                f"{what}: NodeClaim {found.claim} (NodePool {found.pool}) left in place: "
                f"{len(stuck)} nodes are stuck and one run deletes at most {max_deletions} "
                "(gpuRegistrationMaxDeletions); a broken AMI or device plugin? A later run "
                "takes the next"
            )
        record(core, found.node, reason, message, now)
        print(f"{reason} {found.node.metadata.name}: {message}", flush=True)
    return stuck[:max_deletions]


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m gpuwatch.watcher",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--pools", required=True, help="GPU NodePools, comma-separated")
    parser.add_argument("--node-selector", required=True, help="label selector of GPU nodes")
    parser.add_argument(
        "--timeout-seconds",
        type=int,
        required=True,
        help="how long a GPU node may lack allocatable nvidia.com/gpu after its creation "
        "(karpenter.gpuRegistrationTimeout)",
    )
    parser.add_argument(
        "--max-deletions",
        type=int,
        required=True,
        help="NodeClaims deleted in one run at most (karpenter.gpuRegistrationMaxDeletions)",
    )
    return parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    return parser().parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    # In the pod: its ServiceAccount; elsewhere: $KUBECONFIG.
    try:
        config.load_config()
    except config.ConfigException as e:
        print(
            f"gpuwatch: no cluster credentials (not in a pod, no kubeconfig): {e}", file=sys.stderr
        )
        return 2
    try:
        deleted = run(
            client.CoreV1Api(),
            client.CustomObjectsApi(),
            set(args.pools.split(",")),
            args.node_selector,
            timedelta(seconds=args.timeout_seconds),
            args.max_deletions,
            datetime.now(UTC),
        )
    except HTTPError as e:  # urllib3's MaxRetryError: refused, or a name that does not resolve
        host = client.Configuration.get_default_copy().host
        reason = getattr(e, "reason", None) or e
        print(f"gpuwatch: cannot reach the API server at {host}: {reason}", file=sys.stderr)
        return 2
    print(f"deleted {len(deleted)} NodeClaim(s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
