"""The GPU registration watcher (gpuwatch/watcher.py) run as the dev stack's CronJob runs it (its
image's ENTRYPOINT with the CronJob's args), against the local Kubernetes API (tests.kube_api)
holding the plan's RBAC, with a token of the CronJob's ServiceAccount: a request RBAC refuses
fails the test.

Nodes and NodeClaims are shaped as Karpenter at KARPENTER_CHART makes them
(kubernetes-sigs/karpenter pkg/controllers/provisioning/scheduling/nodeclaimtemplate.go ToNodeClaim:
the NodePool's template, its labels plus karpenter.sh/nodepool, an owner reference to the NodePool;
pkg/controllers/nodeclaim/lifecycle/registration.go syncNode: the Node gets the NodeClaim's
labels and taints, the termination finalizer and an owner reference to it; initialization.go:
Initialized stays Unknown while a requested resource is not allocatable). Each NodeClaim is
checked against the vendored NodeClaim CRD, CEL rules included, each Node against Kubernetes
1.34's schema, before the API stores them.
"""

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import kubernetes_validate
import pytest
import yaml

from infra.core.catalog import load_catalog
from infra.core.tests.crd_schema import CRD_DIR, cel_violations, conformance_errors
from tests.kube_api import from_plan, service_account
from tests.kube_api.least_privilege import granted, used
from tests.plugin import ROOT

CRONJOB = "gpu-registration-watch"
GROUP = "karpenter.sh"
ZONE = "us-west-2a"
READY_CONDITIONS = ("Launched", "Registered", "Initialized", "Ready")


def stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Machine:
    """One EC2 instance Karpenter launched into `pool` (None: a node no NodeClaim owns)."""

    name: str
    host: int  # its address, 10.20.1.<host>, names the node; its instance id
    pool: str | None
    instance_type: str
    minutes_old: int
    gpus: str | None  # allocatable nvidia.com/gpu; None: not advertised at all
    ready: bool = True

    @property
    def node_name(self) -> str:
        return f"ip-10-20-1-{self.host}.us-west-2.compute.internal"

    @property
    def provider_id(self) -> str:
        return f"aws:///{ZONE}/i-{self.host:017x}"

    @property
    def claim_name(self) -> str:
        return f"{self.pool}-{self.name}"


class Cluster:
    def __init__(self, plan, tmp_path):
        crds = [
            yaml.safe_load((CRD_DIR / "karpenter" / f"karpenter.sh_{plural}.yaml").read_text())
            for plural in ("nodepools", "nodeclaims")
        ]
        self.api = from_plan(plan, crds=crds)
        self.plan = plan
        self.tmp_path = tmp_path
        self.cronjob = plan.one("kubernetes:batch/v1:CronJob", CRONJOB).inputs
        pod = self.cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        (self.container,) = pod["containers"]
        self.namespace = self.cronjob["metadata"]["namespace"]
        self.account_name = pod["serviceAccountName"]
        self.account = service_account(self.namespace, self.account_name)
        self.kubeconfig = tmp_path / "kubeconfig-watcher"
        config = self.api.kubeconfig(self.api.add_token(self.account))
        self.kubeconfig.write_text(yaml.safe_dump(config))
        self.kinds = {
            plural: self.api.call(
                lambda p=plural: next(k for k in self.api.kinds.values() if k.plural == p)
            )
            for plural in ("nodes", "nodeclaims", "nodepools")
        }

    def command(self) -> list[str]:
        """The image's ENTRYPOINT, with this interpreter, and the CronJob's args."""
        dockerfile = (ROOT / "gpuwatch" / "Dockerfile").read_text()
        entrypoint = json.loads(re.search(r"^ENTRYPOINT (\[.*\])$", dockerfile, re.M).group(1))
        assert entrypoint[0] == "python"
        return [sys.executable, *entrypoint[1:], *self.container["args"]]

    def run_watcher(self) -> str:
        environment = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "PYTHONPATH": str(ROOT),
            "TMPDIR": str(self.tmp_path),
        }
        environment.pop("KUBERNETES_SERVICE_HOST", None)
        done = subprocess.run(
            self.command(), cwd=ROOT, env=environment, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert self.api.refusals == []
        return done.stdout

    # Karpenter's objects

    def add_node_pool(self, name: str, like: str) -> None:
        """A NodePool made by hand beside the stack's (a copy of `like`)."""
        spec = self.api.read("nodepools", "", like, group=GROUP)["spec"]
        pool = {"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": name}}
        self.api.call(self.api.create, self.kinds["nodepools"], "", {**pool, "spec": spec})

    def _store(self, plural: str, manifest: dict) -> dict:
        """Create `manifest` as the API does (status dropped), then write its status as its
        controller does, and backdate its creation as the API stamped it then."""
        kind = self.kinds[plural]
        created = self.api.call(self.api.create, kind, "", manifest)
        with_status = {**created, "status": manifest["status"]}
        stored = self.api.call(self.api.replace, kind, created, with_status)
        return stored

    def backdate(self, plural: str, name: str, minutes: int) -> None:
        moment = stamp(datetime.now(UTC) - timedelta(minutes=minutes))
        key = ("karpenter.sh" if plural == "nodeclaims" else "", plural, "", name)
        self.api.call(lambda: self.api.store[key]["metadata"].update(creationTimestamp=moment))

    def launch(self, machine: Machine) -> None:
        instance = load_catalog()[machine.instance_type]
        capacity = {"cpu": str(instance.vcpu), "memory": f"{instance.memory_gib}Gi", "pods": "110"}
        if instance.gpus:
            capacity["nvidia.com/gpu"] = str(instance.gpus)
        allocatable = {k: v for k, v in capacity.items() if k != "nvidia.com/gpu"}
        if machine.gpus is not None:
            allocatable["nvidia.com/gpu"] = machine.gpus
        registered = machine.gpus not in (None, "0")
        since = stamp(datetime.now(UTC) - timedelta(minutes=machine.minutes_old))
        labels = {
            "node.kubernetes.io/instance-type": machine.instance_type,
            "topology.kubernetes.io/zone": ZONE,
            "kubernetes.io/arch": "amd64",
            "kubernetes.io/os": "linux",
        }
        owners, taints = [], []
        if machine.pool is not None:
            claim = self.claim(machine, capacity, registered, since)
            labels |= claim["metadata"]["labels"]
            taints = claim["spec"].get("taints", [])
            owners = [
                {
                    "apiVersion": "karpenter.sh/v1",
                    "kind": "NodeClaim",
                    "name": claim["metadata"]["name"],
                    "uid": claim["metadata"]["uid"],
                    "blockOwnerDeletion": True,
                }
            ]
            labels["karpenter.sh/registered"] = "true"
            if registered:
                labels["karpenter.sh/initialized"] = "true"
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": machine.node_name,
                "labels": {**labels, "kubernetes.io/hostname": machine.node_name},
                "ownerReferences": owners,
                "finalizers": ["karpenter.sh/termination"] if owners else [],
            },
            "spec": {"providerID": machine.provider_id, "taints": taints},
            "status": {
                "capacity": capacity,
                "allocatable": allocatable,
                "conditions": [
                    {
                        "type": "Ready",
                        "status": str(machine.ready),
                        "reason": "KubeletReady" if machine.ready else "KubeletNotReady",
                        "message": "kubelet is posting ready status",
                        "lastHeartbeatTime": stamp(datetime.now(UTC)),
                        "lastTransitionTime": since,
                    }
                ],
            },
        }
        kubernetes_validate.validate(node, "1.34", strict=True)
        self._store("nodes", node)
        self.backdate("nodes", machine.node_name, machine.minutes_old)

    def claim(self, machine: Machine, capacity: dict, registered: bool, since: str) -> dict:
        pool = self.api.read("nodepools", "", machine.pool, group=GROUP)
        template = pool["spec"]["template"]
        requests = {"cpu": "1", "memory": "4Gi", "pods": "1"}
        if "nvidia.com/gpu" in capacity:
            requests["nvidia.com/gpu"] = capacity["nvidia.com/gpu"]
        node_class = template["spec"]["nodeClassRef"]["name"]
        conditions = {
            "Launched": ("True", "Launched", ""),
            "Registered": ("True", "Registered", ""),
            "Initialized": ("True", "Initialized", "")
            if registered
            else (
                "Unknown",
                "ResourceNotRegistered",
                'Resource "nvidia.com/gpu" was requested but not registered',
            ),
        }
        conditions["Ready"] = conditions["Initialized"]
        claim = {
            "apiVersion": "karpenter.sh/v1",
            "kind": "NodeClaim",
            "metadata": {
                "name": machine.claim_name,
                "labels": {
                    **template["metadata"]["labels"],
                    "karpenter.sh/nodepool": machine.pool,
                    "karpenter.k8s.aws/ec2nodeclass": node_class,
                    "karpenter.sh/capacity-type": "on-demand",
                    "node.kubernetes.io/instance-type": machine.instance_type,
                    "topology.kubernetes.io/zone": ZONE,
                },
                "ownerReferences": [
                    {
                        "apiVersion": "karpenter.sh/v1",
                        "kind": "NodePool",
                        "name": machine.pool,
                        "uid": pool["metadata"]["uid"],
                        "blockOwnerDeletion": True,
                    }
                ],
                "finalizers": ["karpenter.sh/termination"],
            },
            "spec": {**template["spec"], "resources": {"requests": requests}},
            "status": {
                "providerID": machine.provider_id,
                "nodeName": machine.node_name,
                "imageID": "ami-0123456789abcdef0",
                "capacity": capacity,
                "allocatable": capacity,
                "conditions": [
                    {
                        "type": kind,
                        "status": status,
                        "reason": reason,
                        "message": message,
                        "lastTransitionTime": since,
                        "observedGeneration": 1,
                    }
                    for kind, (status, reason, message) in conditions.items()
                ],
            },
        }
        assert conformance_errors(claim) == [] and cel_violations(claim) == []
        stored = self._store("nodeclaims", claim)
        self.backdate("nodeclaims", machine.claim_name, machine.minutes_old)
        return stored

    # reading

    def claim_deleting(self, machine: Machine) -> bool:
        claim = self.api.read("nodeclaims", "", machine.claim_name, group=GROUP)
        return bool(claim["metadata"].get("deletionTimestamp"))

    def events(self, machine: Machine) -> list[dict]:
        return [
            e
            for e in self.api.objects("events", "default")
            if e["involvedObject"]["name"] == machine.node_name
        ]

    def watcher_requests(self) -> set[str]:
        return {request for who, request in self.api.requests if who == self.account.name}


@pytest.fixture
def cluster(dev_plan, tmp_path):
    found = Cluster(dev_plan, tmp_path)
    yield found
    found.api.stop()


# The dev stack's CronJob: GPU pools gpu-small (g5.12xlarge) and gpu-large (p4d.24xlarge), a 9
# minute timeout (p4d's modelled launch with margin), one deletion per run.
STUCK_LONGEST = Machine("stuck", 11, "gpu-small", "g5.12xlarge", 30, gpus=None)
STUCK_NOT_READY = Machine("notready", 12, "gpu-large", "p4d.24xlarge", 20, gpus="0", ready=False)
HEALTHY = Machine("healthy", 13, "gpu-small", "g5.12xlarge", 40, gpus="4")
YOUNG = Machine("young", 14, "gpu-large", "p4d.24xlarge", 5, gpus=None)
CPU = Machine("cpu", 15, "cpu", "m6i.2xlarge", 30, gpus=None)
# A GPU node no NodeClaim owns (a hybrid node, say): not Karpenter's to replace.
UNOWNED = Machine("unowned", 16, None, "g5.12xlarge", 30, gpus=None)
# A GPU node of a NodePool someone added by hand: not the stack's to judge.
OTHER_POOL = Machine("other", 17, "by-hand", "g5.12xlarge", 30, gpus=None)


def test_the_cronjob_runs_the_watcher_with_the_stacks_gpu_pools_and_timeout(cluster):
    assert cluster.container["args"] == [
        "--pools=gpu-small,gpu-large",
        "--node-selector=nvidia.com/gpu.present=true",
        "--timeout-seconds=540",
        "--max-deletions=1",
    ]


def test_stuck_gpu_nodes_are_replaced_one_per_run_and_nothing_else_is_touched(cluster):
    machines = [STUCK_LONGEST, STUCK_NOT_READY, HEALTHY, YOUNG, CPU, UNOWNED, OTHER_POOL]
    cluster.add_node_pool(OTHER_POOL.pool, like="gpu-small")
    for machine in machines:
        cluster.launch(machine)
    cluster.api.settle()

    first = cluster.run_watcher()
    # The longest stuck goes, the other stuck one is left by the cap and says so.
    assert [m.name for m in machines if m.pool and cluster.claim_deleting(m)] == ["stuck"]
    (deleted,) = cluster.events(STUCK_LONGEST)
    node = cluster.api.read("nodes", "", STUCK_LONGEST.node_name)
    assert deleted["type"] == "Warning" and deleted["reason"] == "GPUNotRegistered"
    assert deleted["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Node",
        "name": STUCK_LONGEST.node_name,
        "uid": node["metadata"]["uid"],
    }
    assert deleted["source"] == {"component": "gpu-registration-watch"}
    assert re.fullmatch(
        r"nvidia\.com/gpu is absent in allocatable 30m(\d+s)? after the node was created "
        rf"\({node['metadata']['creationTimestamp']}\), past the 9m timeout: deleted NodeClaim "
        r"gpu-small-stuck \(NodePool gpu-small\); Karpenter drains the node and replaces the "
        r"capacity",
        deleted["message"],
    ), deleted["message"]
    (left,) = cluster.events(STUCK_NOT_READY)
    assert left["reason"] == "GPUNotRegisteredDeletionCapped"
    assert left["message"].startswith("nvidia.com/gpu is 0 in allocatable 20m")
    assert (
        "NodeClaim gpu-large-notready (NodePool gpu-large) left in place: 2 nodes are stuck and "
        "one run deletes at most 1 (gpuRegistrationMaxDeletions)"
    ) in left["message"]
    for kept in (HEALTHY, YOUNG, CPU, UNOWNED, OTHER_POOL):
        assert cluster.events(kept) == [], kept.name
    assert "deleted 1 NodeClaim(s)" in first

    # The next run takes the next; the first, being deleted, is not touched again.
    cluster.run_watcher()
    assert [m.name for m in machines if m.pool and cluster.claim_deleting(m)] == [
        "stuck",
        "notready",
    ]
    assert len(cluster.events(STUCK_LONGEST)) == 1
    assert [e["reason"] for e in cluster.events(STUCK_NOT_READY)] == [
        "GPUNotRegisteredDeletionCapped",
        "GPUNotRegistered",
    ]
    assert cluster.watcher_requests() == {
        "list /api/v1/nodes",
        "list /apis/karpenter.sh/v1/nodeclaims",
        "delete /apis/karpenter.sh/v1/nodeclaims/gpu-small-stuck",
        "delete /apis/karpenter.sh/v1/nodeclaims/gpu-large-notready",
        "create /api/v1/namespaces/default/events",
    }
    # Least privilege: the plan grants its ServiceAccount exactly what it used, where it used it.
    assert granted(cluster.plan, cluster.account_name, cluster.namespace) == used(
        cluster.api, cluster.account.name
    )


def test_outside_a_pod_without_a_kubeconfig_it_says_so_in_one_line(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "KUBECONFIG": str(tmp_path / "none")}
    args = ["--pools", "gpu-small", "--node-selector", "nvidia.com/gpu.present=true"]
    done = subprocess.run(
        [sys.executable, "-m", "gpuwatch.watcher", *args, "--timeout-seconds", "540",
         "--max-deletions", "1"],  # fmt: skip
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith("gpuwatch: no cluster credentials (not in a pod, no kubeconfig)")
    assert done.stderr.count("\n") == 1
