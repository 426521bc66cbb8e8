"""An in-memory controller.Cluster with just enough Kubernetes behaviour to exercise the operator
without a cluster: merge patches, foreground deletion, owner-reference garbage collection, and a
StatefulSet controller that makes pods (ready, or held by Kueue's admission gate) and home
claims. The tests and the benchmark (devservers/bench.py) drive the operator against it."""

import copy
from datetime import UTC, datetime

from devservers.activity import PROBE
from devservers.controller import KUEUE_GATE
from devservers.render import POD_INDEX_LABEL

STATEFUL_SETS = ("apps/v1", "StatefulSet")


def merge_patch(target: dict, patch: dict) -> dict:
    """RFC 7386: mappings merge, null removes, anything else replaces."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            merge_patch(target[key], value)
        else:
            target[key] = copy.deepcopy(value)
    return target


class FakeCluster:
    def __init__(self):
        self.objects: dict[tuple[str, str, str, str], dict] = {}
        self.writes: list[tuple[str, str, str]] = []  # (verb, kind, name)
        self.processes: dict[str, str] = {}  # pod name -> what the activity probe prints
        self.outputs: dict[str, str] = {}  # any other command run in a pod -> its output
        self.gpu: float | None = None
        self.admit = True  # Kueue admits new pods (else they stay gated)
        self.forbidden: set[str] = set()  # namespaces where RBAC refuses every verb
        self._uids = 0

    @staticmethod
    def _key(api_version, kind, name, namespace):
        return (api_version, kind, namespace or "", name)

    # controller.Cluster

    def _allowed(self, namespace):
        if namespace in self.forbidden:
            raise PermissionError(f"forbidden in namespace {namespace}")

    def get(self, api_version, kind, name, namespace):
        self._allowed(namespace)
        found = self.objects.get(self._key(api_version, kind, name, namespace))
        return copy.deepcopy(found)

    def list(self, api_version, kind, namespace, labels):
        self._allowed(namespace)
        return [
            copy.deepcopy(obj)
            for (version, k, ns, _), obj in sorted(self.objects.items())
            if (version, k) == (api_version, kind)
            and (namespace is None or ns == namespace)
            and labels.items() <= obj["metadata"].get("labels", {}).items()
        ]

    def create(self, manifest):
        meta = manifest["metadata"]
        key = self._key(
            manifest["apiVersion"], manifest["kind"], meta["name"], meta.get("namespace")
        )
        if key in self.objects:
            raise ValueError(f"{key} already exists")
        self._uids += 1
        obj = copy.deepcopy(manifest)
        obj["metadata"] |= {"uid": f"uid-{self._uids}", "generation": 1}
        self.objects[key] = obj
        self.writes.append(("create", manifest["kind"], meta["name"]))
        return copy.deepcopy(obj)

    def patch(self, api_version, kind, name, namespace, patch):
        self._allowed(namespace)
        obj = self.objects[self._key(api_version, kind, name, namespace)]
        before = copy.deepcopy(obj.get("spec"))
        merge_patch(obj, patch)
        if obj.get("spec") != before:
            obj["metadata"]["generation"] = obj["metadata"].get("generation", 1) + 1
        self.writes.append(("patch", kind, name))
        return copy.deepcopy(obj)

    def delete(self, api_version, kind, name, namespace):
        self._allowed(namespace)
        obj = self.objects.get(self._key(api_version, kind, name, namespace))
        if obj is not None:
            obj["metadata"]["deletionTimestamp"] = datetime.now(UTC).isoformat()
            self.writes.append(("delete", kind, name))

    def patch_status(self, name, namespace, status):
        server = self.objects[
            self._key("dev.training-platform.io/v1alpha1", "DevServer", name, namespace)
        ]
        merge_patch(server.setdefault("status", {}), status)

    def exec(self, namespace, pod, container, command):
        if command == PROBE:
            return self.processes.get(pod, "start.sh\nsshd\n")
        return self.outputs.get(" ".join(command), "")

    def gpu_utilization(self, namespace, pods):
        return self.gpu

    # what the cluster's own controllers would do

    def admit_pending(self) -> None:
        """Kueue admits the gated pods (quota came free) and they become ready."""
        self.admit = True
        for (_, kind, _, _), pod in self.objects.items():
            if kind == "Pod":
                pod["spec"]["schedulingGates"] = []
                pod["status"]["conditions"] = [{"type": "Ready", "status": "True"}]

    def settle(self) -> None:
        """Run the StatefulSet controller and the garbage collector until nothing changes."""
        while self._step():
            pass

    def _step(self) -> bool:
        changed = False
        for key, sts in [(k, o) for k, o in self.objects.items() if k[:2] == STATEFUL_SETS]:
            changed |= self._run_stateful_set(key, sts)
        uids = {o["metadata"]["uid"] for o in self.objects.values()}
        deleting = {
            o["metadata"]["uid"]
            for o in self.objects.values()
            if o["metadata"].get("deletionTimestamp")
        }
        for key, obj in list(self.objects.items()):
            meta = obj["metadata"]
            # Foreground deletion cascades to dependents; a vanished owner orphans them.
            orphaned = any(
                r["uid"] not in uids or r["uid"] in deleting
                for r in meta.get("ownerReferences", [])
            )
            dependents = any(
                r["uid"] == meta["uid"]
                for o in self.objects.values()
                for r in o["metadata"].get("ownerReferences", [])
            )
            if (orphaned or meta.get("deletionTimestamp")) and not dependents:
                del self.objects[key]
                changed = True
            elif orphaned and not meta.get("deletionTimestamp"):
                meta["deletionTimestamp"] = datetime.now(UTC).isoformat()
                changed = True
        return changed

    def _run_stateful_set(self, key, sts) -> bool:
        name, namespace = sts["metadata"]["name"], sts["metadata"]["namespace"]
        wanted = 0 if sts["metadata"].get("deletionTimestamp") else sts["spec"]["replicas"]
        changed = False
        for i in range(wanted):
            pod_key = self._key("v1", "Pod", f"{name}-{i}", namespace)
            if pod_key not in self.objects:
                self._uids += 1
                template = sts["spec"]["template"]
                labels = {**template["metadata"]["labels"], POD_INDEX_LABEL: str(i)}
                ready = "True" if self.admit else "False"
                self.objects[pod_key] = {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": f"{name}-{i}",
                        "namespace": namespace,
                        "uid": f"uid-{self._uids}",
                        "labels": labels,
                        "ownerReferences": [{"kind": "StatefulSet", "uid": sts["metadata"]["uid"]}],
                    },
                    "spec": {
                        **copy.deepcopy(template["spec"]),
                        "schedulingGates": [] if self.admit else [{"name": KUEUE_GATE}],
                    },
                    "status": {"conditions": [{"type": "Ready", "status": ready}]},
                }
                changed = True
            for claim in sts["spec"]["volumeClaimTemplates"]:
                claim_name = f"{claim['metadata']['name']}-{name}-{i}"
                claim_key = self._key("v1", "PersistentVolumeClaim", claim_name, namespace)
                if claim_key not in self.objects:
                    self._uids += 1
                    self.objects[claim_key] = {
                        "apiVersion": "v1",
                        "kind": "PersistentVolumeClaim",
                        "metadata": {
                            "name": claim_name,
                            "namespace": namespace,
                            "uid": f"uid-{self._uids}",
                            "labels": dict(claim["metadata"]["labels"]),
                        },
                        "spec": copy.deepcopy(claim["spec"]),
                    }
                    changed = True
        for pod_key, pod in list(self.objects.items()):
            if (
                pod_key[:3] == ("v1", "Pod", namespace)
                and pod["metadata"]["ownerReferences"][0]["uid"] == sts["metadata"]["uid"]
            ):
                if int(pod["metadata"]["labels"][POD_INDEX_LABEL]) >= wanted:
                    del self.objects[pod_key]
                    changed = True
        return changed
