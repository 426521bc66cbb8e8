"""`python -m deploy.roll` with the real kubernetes client against the local Kubernetes API: the
drifted nodes of a pool, the jobs on them deactivated once, their pods gone, the NodeClaims
deleted and the jobs activated again; a node with a DevServer left alone.

Neither Kueue nor Karpenter runs here. The test plays what Kueue (KUEUE_CHART) does when a Workload
is deactivated (pkg/controller/core/workload_controller.go evicts it with reason Deactivated; the
job reconciler suspends the job, pkg/controller/jobframework/reconciler.go stopJob, and the training
operator deletes its pods, kubeflow/trainer v1.9.4 pkg/controller.v1/common/job.go), nothing more.
"""

import threading

import yaml
from kubernetes import config as kube_config

from deploy import roll
from infra.kueue.tests.kueue_rules import workload_crd
from tests.kube_api import ADMIN
from tests.kube_api.rbac import Authorizer
from tests.kube_api.server import BUILTIN, Kind, KubeAPI
from tests.plugin import ROOT

NODECLAIM_CRD = ROOT / "tests/crds/karpenter/karpenter.sh_nodeclaims.yaml"
PYTORCHJOB_CRD = ROOT / "tests/crds/training-operator/kubeflow.org_pytorchjobs.yaml"
MPIJOB_CRD = ROOT / "tests/crds/mpi-operator/kubeflow.org_mpijobs.yaml"
MPIJOB = {
    "apiVersion": "kubeflow.org/v2beta1",
    "kind": "MPIJob",
    "metadata": {"name": "gpt-mpi"},
    "spec": {
        "mpiReplicaSpecs": {
            "Launcher": {
                "replicas": 1,
                "template": {"spec": {"containers": [{"name": "launcher", "image": "i"}]}},
            }
        }
    },
}
# The MPI operator runs an MPIJob's launcher as a batch Job the MPIJob owns.
LAUNCHER_SPEC = {
    "template": {
        "spec": {"restartPolicy": "Never", "containers": [{"name": "launcher", "image": "i"}]}
    }
}
BATCH_JOB = Kind("batch", "v1", "Job", "jobs", True, ("status",))
PYTORCHJOB = {
    "apiVersion": "kubeflow.org/v1",
    "kind": "PyTorchJob",
    "metadata": {"name": "gpt-large"},
    "spec": {
        "pytorchReplicaSpecs": {
            "Worker": {
                "replicas": 2,
                "template": {"spec": {"containers": [{"name": "pytorch", "image": "i"}]}},
            }
        }
    },
}
STATEFULSET = {
    "metadata": {"name": "box"},
    "spec": {
        "replicas": 0,
        "serviceName": "box",
        "selector": {"matchLabels": {"app": "box"}},
        "template": {
            "metadata": {"labels": {"app": "box"}},
            "spec": {"containers": [{"name": "c", "image": "i"}]},
        },
    },
}


def kind(api: KubeAPI, plural: str, group: str = ""):
    return next(
        k
        for k in api.call(lambda: list(api.kinds.values()))
        if (k.group, k.plural) == (group, plural)
    )


def create(api, plural, namespace, body, group=""):
    return api.call(api.create, kind(api, plural, group), namespace, body)


def claim(name: str, node: str, pool: str, drifted: bool) -> dict:
    return {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodeClaim",
        "metadata": {"name": name, "labels": {"karpenter.sh/nodepool": pool}},
        "spec": {
            "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": pool},
            "requirements": [],
        },
    }, {
        "nodeName": node,
        "conditions": [
            {
                "type": "Drifted",
                "status": "True" if drifted else "False",
                "reason": "AMIDrift" if drifted else "NotDrifted",
                "message": "",
                "lastTransitionTime": "2026-11-26T00:00:00Z",
            }
        ],
    }


def owned(name: str, owner: dict) -> dict:
    reference = {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
    }
    return {"name": name, "ownerReferences": [reference]}


def pod(name: str, node: str, owner: dict, labels: dict | None = None) -> dict:
    metadata = {**owned(name, owner), "labels": labels or {}}
    return {
        "metadata": metadata,
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]},
    }


class StandInKueue(threading.Thread):
    """Deletes the pods of a job whose Workload was deactivated (see the module docstring)."""

    def __init__(self, api: KubeAPI):
        super().__init__(daemon=True)
        self.api, self.stop, self.deactivations = api, threading.Event(), []

    def run(self):
        while not self.stop.wait(0.2):
            for workload in self.api.objects("workloads", group="kueue.x-k8s.io"):
                if workload["spec"].get("active") is False:
                    name = workload["metadata"]["name"]
                    if name not in self.deactivations:
                        self.deactivations.append(name)
                    jobs = {o["uid"] for o in workload["metadata"]["ownerReferences"]}
                    # The launcher's batch Job is the MPIJob's: its pods go too.
                    for job in self.api.objects("jobs", "team-a", group="batch"):
                        if {o["uid"] for o in job["metadata"]["ownerReferences"]} & jobs:
                            jobs.add(job["metadata"]["uid"])
                    for p in self.api.objects("pods", "team-a"):
                        if {o["uid"] for o in p["metadata"].get("ownerReferences", [])} & jobs:
                            self.api.call(self.api.delete, kind(self.api, "pods"), p)


def test_roll_moves_each_job_once_and_leaves_devservers_alone(tmp_path, monkeypatch, capsys):
    api = KubeAPI(Authorizer([]), [*BUILTIN, BATCH_JOB]).start()
    kueue = StandInKueue(api)
    try:
        crds = [yaml.safe_load(p.read_text()) for p in (NODECLAIM_CRD, PYTORCHJOB_CRD, MPIJOB_CRD)]
        for crd in [*crds, workload_crd()]:
            create(api, "customresourcedefinitions", "", crd, "apiextensions.k8s.io")
        api.settle()
        create(api, "namespaces", "", {"metadata": {"name": "team-a"}})
        # Two drifted nodes: one runs a job's two workers, the other a DevServer; one node
        # of the pool is current, and another pool's drifted node is not this roll's.
        claims = {}
        for name, node, pool, drifted in (
            ("a", "node-a", "gpu-large", True),
            ("b", "node-b", "gpu-large", True),
            ("c", "node-c", "gpu-large", False),
            ("d", "node-d", "cpu", True),
        ):
            body, status = claim(name, node, pool, drifted)
            stored = create(api, "nodeclaims", "", body, "karpenter.sh")
            claims[name] = api.call(
                api.replace,
                kind(api, "nodeclaims", "karpenter.sh"),
                stored,
                {**stored, "status": status},
            )
        job = create(api, "pytorchjobs", "team-a", PYTORCHJOB, "kubeflow.org")
        workload = {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "Workload",
            "metadata": owned("pytorchjob-gpt-large-1", job),
            "spec": {"active": True, "queueName": "team-a", "podSets": []},
        }
        create(api, "workloads", "team-a", workload, "kueue.x-k8s.io")
        for i, node in enumerate(("node-a", "node-a", "node-c")):
            create(api, "pods", "team-a", pod(f"gpt-large-worker-{i}", node, job))
        # An MPIJob whose launcher (a pod of its batch Job) runs on a drifted node.
        mpi = create(api, "mpijobs", "team-a", MPIJOB, "kubeflow.org")
        mpi_workload = {**workload, "metadata": owned("mpijob-gpt-mpi-1", mpi)}
        create(api, "workloads", "team-a", mpi_workload, "kueue.x-k8s.io")
        launcher = create(
            api,
            "jobs",
            "team-a",
            {"metadata": owned("gpt-mpi-launcher", mpi), "spec": LAUNCHER_SPEC},
            "batch",
        )
        create(api, "pods", "team-a", pod("gpt-mpi-launcher-x", "node-a", launcher))
        server_set = create(api, "statefulsets", "team-a", STATEFULSET, "apps")
        create(
            api,
            "pods",
            "team-a",
            pod("box-0", "node-b", server_set, {roll.SERVER_LABEL: "box"}),
        )
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump(api.kubeconfig(api.add_token(ADMIN))))
        args = ["--stack", "prod", "--pool", "gpu-large", "--kubeconfig", str(kubeconfig)]

        assert roll.main(args) == 0  # without --yes: says what it would do
        printed = capsys.readouterr().out
        assert "pool gpu-large: 1 drifted nodes (a); jobs that restart once from their " in printed
        assert "team-a/mpijob-gpt-mpi-1, team-a/pytorchjob-gpt-large-1" in printed
        assert "nothing done" in printed
        assert "left alone: node node-b runs DevServer pods box-0" in printed
        assert len(api.objects("pods", "team-a")) == 5

        kueue.start()
        assert roll.main([*args, "--yes", "--timeout", "60"]) == 0
        remaining = {c["metadata"]["name"] for c in api.objects("nodeclaims", group="karpenter.sh")}
        assert remaining == {"b", "c", "d"}
        stored = api.objects("workloads", "team-a", group="kueue.x-k8s.io")
        assert all(w["spec"]["active"] is True for w in stored)
        assert sorted(kueue.deactivations) == ["mpijob-gpt-mpi-1", "pytorchjob-gpt-large-1"]
        # The job's pods all stopped (the whole job restarts, once); the DevServer runs on.
        assert [p["metadata"]["name"] for p in api.objects("pods", "team-a")] == ["box-0"]
        assert api.refusals == []
    finally:
        kueue.stop.set()
        api.stop()


def test_roll_without_a_cluster_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(
        kube_config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(tmp_path / "none")
    )
    monkeypatch.delenv("KUBECONFIG", raising=False)
    assert roll.main(["--stack", "prod", "--pool", "gpu-large"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no cluster to talk to") and err.count("\n") == 1


def test_roll_names_the_pools_it_knows(capsys):
    assert roll.main(["--stack", "prod", "--pool", "gpu-huge"]) == 2
    assert "allowed: gpu-small, gpu-large, cpu" in capsys.readouterr().err
