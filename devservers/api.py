"""The DevServer API: group, version, names and labels shared by operator, devctl and Pulumi."""

from datetime import UTC, datetime
from functools import cache
from pathlib import Path

import yaml

GROUP = "dev.training-platform.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
SERVERS = "devservers"  # plural, namespaced
FLAVORS = "devserverflavors"  # plural, cluster-scoped
CRD_DIR = Path(__file__).resolve().parent / "crds"

# Every child object carries this label with its server's name.
SERVER_LABEL = f"{GROUP}/server"
# The status condition of a server whose users are warned of an idle stop.
STOP_WARNING = "IdleStopSoon"
OWNER_LABEL = f"{GROUP}/owner"
NAMESPACE_PREFIX = "dev-"
# The LocalQueue every user namespace has; it feeds the user's team ClusterQueue.
LOCAL_QUEUE = "dev"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
GPU = "nvidia.com/gpu"
# The DCGM exporter the operator reads GPU use from, one per GPU node (its chart's pod label and
# port; the platform installs it in infra/components/gpu_metrics.py).
DCGM_LABELS = {"app.kubernetes.io/name": "dcgm-exporter"}
DCGM_PORT = 9400
# The ResourceQuota in every user namespace, and what it caps.
QUOTA = "devservers"
SERVER_COUNT = f"count/{SERVERS}.{GROUP}"
GPU_REQUESTS = f"requests.{GPU}"
CPU_QUOTA = ("requests.cpu", "limits.cpu")
MEMORY_QUOTA = ("requests.memory", "limits.memory")


# The quota of the storage that claims of one storage class request: `<class>` + this suffix
# (kubernetes pkg/quota/v1/evaluator/core/persistent_volume_claims.go, V1ResourceByStorageClass).
STORAGE_QUOTA_SUFFIX = ".storageclass.storage.k8s.io/requests.storage"


def storage_quota(storage_class: str) -> str:
    return f"{storage_class}{STORAGE_QUOTA_SUFFIX}"


def timestamp(moment: datetime) -> str:
    """A status time, as the API server writes its own (RFC 3339, UTC, seconds)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_timestamp(text: str) -> datetime:
    """Any RFC 3339 time the CRD's date-time format accepts (a user may write keepUntil)."""
    return datetime.fromisoformat(text)


def controller_ref(obj: dict) -> dict | None:
    """The owner reference that names the object's controller (the API server allows one)."""
    refs = obj["metadata"].get("ownerReferences") or []
    return next((r for r in refs if r.get("controller")), None)


def user_namespace(user: str) -> str:
    return f"{NAMESPACE_PREFIX}{user}"


@cache
def crds() -> tuple[dict, ...]:
    """The CustomResourceDefinitions, as the YAML files in devservers/crds declare them."""
    return tuple(yaml.safe_load(p.read_text()) for p in sorted(CRD_DIR.glob("*.yaml")))


def flavor_object(
    name: str,
    node_pool: str,
    node_selector: dict[str, str],
    tolerations: list[dict],
    gpus: int,
    cpu: int,
    memory_gib: int,
    *,
    home_storage_class: str,
    shared_file_system: bool,
) -> dict:
    """A DevServerFlavor: where its pods go, what each asks for (requests equal limits: a dev
    server gets what it asked for, no more), the StorageClass of their homes and whether their
    nodes mount the shared file system. All of it travels in the flavor, so the operator needs
    no knowledge of the cluster's pool labels, taints and storage."""
    amounts = {"cpu": str(cpu), "memory": f"{memory_gib}Gi"}
    if gpus:
        amounts[GPU] = str(gpus)
    return {
        "apiVersion": API_VERSION,
        "kind": "DevServerFlavor",
        "metadata": {"name": name},
        "spec": {
            "nodePool": node_pool,
            "nodeSelector": node_selector,
            "tolerations": tolerations,
            "resources": {"requests": dict(amounts), "limits": dict(amounts)},
            "homeStorageClass": home_storage_class,
            "sharedFileSystem": shared_file_system,
        },
    }
