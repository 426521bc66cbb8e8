"""Jobs on the hybrid machines (`nodePool: hybrid`) through the offline plan: placement, pod
resources, the Kueue flavor they get and its quota, the config refusals, and the local twin."""

import json

import pytest
import yaml

from deploy.program import build_platform
from infra.core.config import ConfigError
from infra.core.nodes import MACHINE_LABEL, POOL_LABEL
from infra.core.offline import run_offline
from infra.hybrid.machines import HYBRID_TAINT, machine_taint
from infra.hybrid.tests.test_hybrid import HYBRID, PRIVATE_ENDPOINT_OFF
from infra.stack.loading import load_stack_file, parse_stack_config, read_stack_file
from tests.plugin import stack_values
from workloads import local

POOL = POOL_LABEL
RESOURCE_FLAVOR = "kubernetes:kueue.x-k8s.io/v1beta2:ResourceFlavor"
CLUSTER_QUEUE = "kubernetes:kueue.x-k8s.io/v1beta2:ClusterQueue"
PYTORCHJOB = "kubernetes:kubeflow.org/v1:PyTorchJob"
MPIJOB = "kubernetes:kubeflow.org/v2beta1:MPIJob"
HYBRID_TOLERATION = {**HYBRID_TAINT, "operator": "Equal"}
# Both machines admit team-a (infra.hybrid.tests.test_hybrid HYBRID): its pods tolerate both and
# select them.
TEAM_A_TOLERATIONS = [
    HYBRID_TOLERATION,
    *({**machine_taint(m), "operator": "Equal"} for m in ("alice-4090", "bob-cpu")),
]
TEAM_A_AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {
                    "matchExpressions": [
                        {
                            "key": MACHINE_LABEL,
                            "operator": "In",
                            "values": ["alice-4090", "bob-cpu"],
                        }
                    ]
                }
            ]
        }
    }
}
# HYBRID's machines: alice-4090 (1 GPU, 16 vCPU, 64 GiB) and bob-cpu (8 vCPU, 32 GiB).
HYBRID_JOBS = [
    # One pod: sized for the largest machine, alice-4090.
    {
        "name": "on-alice",
        "kind": "PyTorchJob",  # a fixed size: no TrainJob runs on the machines
        "nodePool": "hybrid",
        "queue": "team-a",
        "args": ["--model", "tiny", "--steps", "100", "--global-batch", "8", "--micro-batch", "4"],
    },
    # Two pods: sized for the smaller of the two machines, bob-cpu, so gloo on CPU.
    {
        "name": "on-both",
        "kind": "MPIJob",
        "nodePool": "hybrid",
        "minNodes": 2,
        "maxNodes": 2,
        "queue": "team-a",
        "args": ["--model", "tiny", "--steps", "100"],
    },
]


def hybrid_values(**sections) -> dict:
    """The dev stack with HYBRID's machines; jobs: dev's own, then HYBRID_JOBS, unless given."""
    sections.setdefault("jobs", [*read_stack_file("dev")["training-platform:jobs"], *HYBRID_JOBS])
    values = stack_values("dev", cluster=PRIVATE_ENDPOINT_OFF, **sections)
    values["training-platform:hybrid"] = HYBRID
    return values


@pytest.fixture(scope="module")
def plan():
    values = hybrid_values()
    config = parse_stack_config(values, "Pulumi.dev.yaml")
    return run_offline(lambda: build_platform(config), "dev", values)


def job_names(plan) -> list[str]:
    return [r.inputs["metadata"]["name"] for r in plan.of_type(PYTORCHJOB) + plan.of_type(MPIJOB)]


def job_of(plan, name: str) -> dict:
    (job,) = [
        r.inputs
        for r in plan.of_type(PYTORCHJOB) + plan.of_type(MPIJOB)
        if r.inputs["metadata"]["name"] == name
    ]
    return job


def replicas(plan, name: str) -> dict[str, dict]:
    """A job's pod sets by role: {role: {"replicas": n, "template": pod template}}."""
    spec = job_of(plan, name)["spec"]
    return spec.get("pytorchReplicaSpecs") or spec["mpiReplicaSpecs"]


def test_a_one_pod_job_takes_the_largest_machine_whole(plan):
    job = job_of(plan, "on-alice")
    assert job["spec"]["nprocPerNode"] == "1"  # alice-4090's one GPU
    pod = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    assert pod["nodeSelector"] == {POOL: "hybrid"}
    assert pod["affinity"] == TEAM_A_AFFINITY
    assert pod["tolerations"] == TEAM_A_TOLERATIONS
    (container,) = pod["containers"]
    # pod_room of 16 vCPU and 64 GiB: min(15, 14.4) vCPU, 85 % of the memory.
    limits = {"memory": "54Gi", "nvidia.com/gpu": "1"}
    assert container["resources"] == {"requests": {"cpu": "14", **limits}, "limits": limits}
    # No EFS or FSx on the machines (their CSI node agents avoid hybrid nodes), though dev has
    # EFS on and every job on a NodePool mounts it; no EFA settings either.
    assert [v["name"] for v in pod["volumes"]] == ["dshm"]
    assert [e["name"] for e in container["env"]] == ["PYTHONUNBUFFERED"]
    assert container["image"] == plan.outputs["trainerImages"]["runtime"]


def test_a_two_pod_job_is_sized_for_the_smaller_machine_and_runs_gloo(plan):
    pod_sets = replicas(plan, "on-both")
    worker = pod_sets["Worker"]["template"]["spec"]
    launcher = pod_sets["Launcher"]["template"]["spec"]
    for spec in (worker, launcher):  # every pod set: Kueue assigns a flavor to each
        assert spec["nodeSelector"] == {POOL: "hybrid"}
        assert spec["affinity"] == TEAM_A_AFFINITY
        assert spec["tolerations"] == TEAM_A_TOLERATIONS
    (container,) = worker["containers"]
    assert container["resources"] == {  # bob-cpu: 8 vCPU, 32 GiB, no GPU
        "requests": {"cpu": "7", "memory": "27Gi"},
        "limits": {"memory": "27Gi"},
    }
    (command,) = [c["command"] for c in launcher["containers"]]
    assert command[:6] == ["mpirun", "-np", "2", "--map-by", "ppr:1:node", "--bind-to"]


def test_pools_jobs_keep_their_placement(plan):
    gpu = replicas(plan, "gpt-small")["Worker"]["template"]["spec"]
    assert gpu["nodeSelector"] == {POOL: "gpu-small"}
    assert gpu["tolerations"] == [
        {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule", "operator": "Equal"}
    ]
    cpu = replicas(plan, "smoke-cpu")["Worker"]["template"]["spec"]
    assert cpu["nodeSelector"] == {POOL: "cpu"} and "tolerations" not in cpu


# --- Kueue's flavor assignment, restated from upstream ---------------------------------------


def tolerates(toleration: dict, taint: dict) -> bool:
    """Toleration.ToleratesTaint (kubernetes/api v0.36.2, core/v1/toleration.go, the version
    Kueue at KUEUE_CHART builds with): an effect and a key, when given, must equal the taint's;
    Exists matches any value, Equal (the default) the same value."""
    if toleration.get("effect") and toleration["effect"] != taint["effect"]:
        return False
    if toleration.get("key") and toleration["key"] != taint["key"]:
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    return operator == "Equal" and toleration.get("value", "") == taint.get("value", "")


def kueue_may_assign(flavor_spec: dict, pod_spec: dict) -> bool:
    """Whether Kueue may assign this ResourceFlavor to a pod set, quota aside: kubernetes-sigs/
    kueue at KUEUE_CHART, pkg/scheduler/flavorassigner/flavorassigner.go: checkFlavorForPodSets
    skips the flavor when a NoSchedule or NoExecute nodeTaint is tolerated neither by the pod's
    tolerations nor by the flavor's own spec.tolerations; flavorSelector then keeps only the
    node selector keys among the flavor's nodeLabels, which must match them."""
    tolerations = [*pod_spec.get("tolerations", []), *flavor_spec.get("tolerations", [])]
    for taint in flavor_spec.get("nodeTaints", []):
        if taint["effect"] in ("NoSchedule", "NoExecute") and not any(
            tolerates(t, taint) for t in tolerations
        ):
            return False
    labels = flavor_spec.get("nodeLabels", {})
    selector = pod_spec.get("nodeSelector", {})
    return all(labels[k] == v for k, v in selector.items() if k in labels)


def flavors(plan) -> dict[str, dict]:
    return {r.inputs["metadata"]["name"]: r.inputs["spec"] for r in plan.of_type(RESOURCE_FLAVOR)}


def test_each_pod_set_gets_its_own_pools_flavor_and_only_hybrid_jobs_get_hybrid(plan):
    specs = flavors(plan)
    jobs = job_names(plan)
    assert {"on-alice", "on-both", "gpt-small", "smoke-cpu"} <= set(jobs)
    for job in jobs:
        for role, pod_set in replicas(plan, job).items():
            pod = pod_set["template"]["spec"]
            assignable = {name for name, spec in specs.items() if kueue_may_assign(spec, pod)}
            assert assignable == {pod["nodeSelector"][POOL]}, (job, role)


def test_the_hybrid_flavor_injects_no_toleration_so_other_pods_never_spill_onto_it(plan):
    """A pod set with no pool selector (a user's own GPU job in a team namespace) may take any
    flavor whose taints it or the flavor tolerates: never the machines'. Were the hybrid flavor
    to inject its toleration, as the GPU pools' flavors do, it would."""
    bare = {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    specs = flavors(plan)
    assert "tolerations" not in specs["hybrid"]
    assert {n for n, s in specs.items() if kueue_may_assign(s, bare)} == {
        "gpu-small",
        "gpu-large",
        "cpu",
    }
    injecting = {**specs["hybrid"], "tolerations": [HYBRID_TOLERATION]}
    assert kueue_may_assign(injecting, bare)


def quota(plan, queue: str, flavor: str) -> dict[str, str]:
    (spec,) = [
        r.inputs["spec"]
        for r in plan.of_type(CLUSTER_QUEUE)
        if r.inputs["metadata"]["name"] == queue
    ]
    (group,) = spec["resourceGroups"]
    (entry,) = [f for f in group["flavors"] if f["name"] == flavor]
    return {r["name"]: r["nominalQuota"] for r in entry["resources"]}


def quantity(value: str) -> float:
    return float(value.removesuffix("Gi"))


def test_the_hybrid_flavors_quota_holds_each_hybrid_job(plan):
    """team-a's jobs queue into the platform ClusterQueue, whose hybrid quota is every machine's
    vCPU, memory and GPUs (alice-4090 and bob-cpu: 24, 96Gi, 1)."""
    room = quota(plan, "platform", "hybrid")
    assert room == {"cpu": "24", "memory": "96Gi", "nvidia.com/gpu": "1"}
    for job in ("on-alice", "on-both"):
        asked = {name: 0.0 for name in room}
        for pod_set in replicas(plan, job).values():
            (container,) = pod_set["template"]["spec"]["containers"]
            for name, value in container["resources"]["requests"].items():
                asked[name] += pod_set["replicas"] * quantity(value)
        assert all(asked[n] <= quantity(room[n]) for n in room), (job, asked)


def test_the_flavor_lists_the_machines_vcpus_for_the_cost_table(plan):
    (flavor,) = [
        r for r in plan.of_type(RESOURCE_FLAVOR) if r.inputs["metadata"]["name"] == "hybrid"
    ]
    annotation = flavor.inputs["metadata"]["annotations"]["training-platform/hybrid-machines"]
    assert json.loads(annotation) == [
        {"name": "alice-4090", "vcpu": 16},
        {"name": "bob-cpu", "vcpu": 8},
    ]


# --- what stack config refuses -----------------------------------------------------------------


def error_of(values: dict) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_stack_config(values, "Pulumi.dev.yaml")
    return str(caught.value)


def one_job(**changes) -> list[dict]:
    return [{"name": "j", "kind": "PyTorchJob", "nodePool": "hybrid", "queue": "team-a", **changes}]


def admitting_research(values: dict) -> dict:
    """`values` with both machines admitting team research too."""
    machines = [{**m, "allow": [*m["allow"], "team:research"]} for m in HYBRID["machines"]]
    return {**values, "training-platform:hybrid": {**HYBRID, "machines": machines}}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            stack_values("dev", jobs=one_job()),
            "jobs[j].nodePool: hybrid names the hybrid machines but the stack has no hybrid "
            "section; allowed: gpu-small, gpu-large, cpu, or add a training-platform:hybrid "
            "section",
        ),
        (
            hybrid_values(jobs=one_job(nodePool="hybird")),
            "jobs[j].nodePool: 'hybird' is not a node pool; did you mean 'hybrid'? allowed: "
            "gpu-small, gpu-large, cpu, hybrid",
        ),
        (
            hybrid_values(jobs=one_job(maxNodes=3)),
            "jobs[j].maxNodes: 3 exceeds the 2 hybrid machines that admit team team-a (one pod "
            "each: alice-4090, bob-cpu; a machine's owner and allow say whom it admits); allowed: "
            "at most 2",
        ),
        # research borrows at most 50 % of the hybrid quota: its one GPU, but 12 of 24 vCPU,
        # and a pod on alice-4090 asks 14. Kueue admits a job only if every resource fits.
        (
            admitting_research(hybrid_values(jobs=one_job(queue="research"))),
            "jobs[j].maxNodes: needs 14 cpu in pool hybrid but team research's queue can admit "
            "at most 12",
        ),
        # No machine admits research's jobs: bob-cpu is bob's (his DevServers) and team-a's.
        (
            hybrid_values(jobs=one_job(queue="research")),
            "jobs[j].maxNodes: 1 exceeds the 0 hybrid machines that admit team research (one pod "
            "each: none;",
        ),
        (
            hybrid_values(jobs=one_job(checkpoint="efs")),
            "jobs[j].checkpoint: efs is not mounted on the hybrid machines, whose nodes run no "
            "EFS or FSx CSI agent; allowed: s3",
        ),
        (
            hybrid_values(
                nodePools=[
                    *stack_values("dev")["training-platform:nodePools"],
                    {"name": "hybrid", "instanceTypes": ["m6i.large"], "maxNodes": 1},
                ]
            ),
            "nodePools[hybrid].name: hybrid is the name of the hybrid machines' pool",
        ),
    ],
)
def test_what_config_refuses_about_the_hybrid_pool(values, message):
    assert message in error_of(values)


# --- the local twin ----------------------------------------------------------------------------


def test_the_local_twin_runs_a_hybrid_job(tmp_path, monkeypatch, capsys):
    """`make job-local JOB=on-alice` on a stack with hybrid jobs: the job's own arguments under
    torchrun here. Only where the stack file is read from differs (tmp_path, not the project)."""
    (tmp_path / "Pulumi.twin.yaml").write_text(yaml.safe_dump({"config": hybrid_values()}))
    monkeypatch.setattr(local, "load_stack_for_command", lambda s: load_stack_file(s, tmp_path))
    argv = ["on-alice", "--stack", "twin", "--steps", "2", "--nproc", "1"]
    assert local.main([*argv, "--checkpoint-dir", str(tmp_path / "local")]) == 0
    out = capsys.readouterr().out
    done = json.loads(next(line for line in out.splitlines() if '"done"' in line))
    assert done["step"] == 2
