"""The NCCL fabric check: its stack config, the MPIJob it renders, and its verdict.

The parser and verdict read sample launcher logs we wrote in the output format of nccl-tests
v2.19.6, NCCL and aws-ofi-nccl (tests/fixtures/nccl, how in its SOURCES.md), checked line by line
against nccl-tests' printf formats (workloads/tests/nccl_tests_output.py). The rendered MPIJob is
checked against the MPI operator's CRD and run through OpenMPI's real mpirun over two real sshd (the
tests/integration/test_mpi_launch.py launcher), with a CPU stand-in for all_reduce_perf
(workloads/tests/nccl_stand_in.py) whose output the check then judges.
"""

import copy
import re
import time
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from kubernetes.config import kube_config

from infra.core.catalog import load_catalog, load_published_busbw
from infra.core.config import ConfigError
from infra.core.tests.crd_schema import conformance_errors
from infra.karpenter.fabric_check import FABRIC_MAX_BYTES, fabric_sizes
from infra.stack.config import StackConfig
from infra.stack.loading import load_stack_file, parse_stack_config
from tests.integration.test_mpi_launch import Launcher
from tests.kube_api import ADMIN, KubeAPI
from tests.kube_api.rbac import Authorizer
from tests.kube_api.server import BUILTIN
from tests.openssh import OpenSsh
from tests.plugin import NO_DEV_SERVERS, ROOT, stack_values
from workloads import nccl_check
from workloads.nccl_check import (
    PREFIX,
    CheckError,
    check_manifests,
    judge,
    newest_pod,
    parse_output,
    report,
    resolve,
)
from workloads.tests.nccl_stand_in import STAND_IN_LINE
from workloads.tests.nccl_tests_output import Half, footer_lines, header_lines, row_line
from workloads.tests.test_workloads import job_of

FIXTURES = ROOT / "tests" / "fixtures" / "nccl"
# The sample launcher logs (tests/fixtures/nccl/SOURCES.md): the check's own log on two
# p4d.24xlarge with EFA in use; the same over sockets under mpirun --tag-output; two p5.48xlarge
# under srun -l without NCCL lines; a p4d run with wrong results.
EFA_RUN = "efa-p4d-2node.log"
SOCKET_RUN = "socket-p4d-2node-tag-output.log"
SRUN_RUN = "p5-2node-srun.log"
WRONG_RUN = "wrong-p4d-2node.log"
IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/tp-dev/trainer@sha256:" + "a" * 64
# What NCCL logs for aws-ofi-nccl, behind its INFO prefix "<host>:<pid>:<tid> [<dev>] NCCL INFO "
# (NVIDIA/nccl v2.30.7-1 src/debug.cc) and "Using network %s" (src/init.cc): before plugin
# v1.13 "Selected Provider is %s (found %d nics)" and the name "AWS Libfabric" (aws/aws-ofi-nccl
# v1.11.0-aws src/nccl_ofi_net.c, src/nccl_ofi_interface_nvidia.c); since v1.14.0 "Selected
# provider is %s, fabric is %s (found %d nics)" (v1.21.1 src/nccl_ofi_net.cpp) and "Libfabric"
# (src/nccl_ofi_interface_nvidia.cpp).
OLD_PLUGIN_LINES = (
    "node-0:61:61 [0] NCCL INFO NET/OFI Selected Provider is efa (found 4 nics)\n"
    "node-0:61:61 [0] NCCL INFO Using network AWS Libfabric\n"
)
CURRENT_PLUGIN_LINES = (
    "node-0:61:61 [0] NCCL INFO NET/OFI Selected provider is efa, fabric is efa (found 4 nics)\n"
    "node-0:61:61 [0] NCCL INFO Using network Libfabric\n"
)


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def dev_with_pool(name: str, **fields) -> dict:
    """The dev stack's values with `fields` (camelCase) set on node pool `name`."""
    values = stack_values("dev")
    pools = copy.deepcopy(values["training-platform:nodePools"])
    for pool in pools:
        if pool["name"] == name:
            pool.update(fields)
    values["training-platform:nodePools"] = pools
    return values


def config_with_pool(name: str, **fields) -> StackConfig:
    return parse_stack_config(dev_with_pool(name, **fields), "Pulumi.dev.yaml")


def pool_of(config: StackConfig, name: str):
    return {p.name: p for p in config.node_pools}[name]


def plan_for(max_bytes: int, floors=None, nodes: int = 2):
    check = {"nodes": nodes, "maxBytes": max_bytes, "floors": floors or []}
    return pool_of(
        config_with_pool("gpu-large", fabricCheck=check), "gpu-large"
    ).fabric_check_plan()


# -- stack config ------------------------------------------------------------------------------


def test_default_floors_come_from_the_published_figure_of_the_pools_family():
    pools = {p.name: p for p in load_stack_file("dev").node_pools}
    large = pools["gpu-large"].fabric_check_plan()
    (floor,) = large.floors
    assert (floor.from_bytes, floor.min_busbw) == (1 << 30, 29.44)  # 90 % of p4d's 32.71
    assert "aws-samples/aws-efa-eks" in large.basis and large.max_bytes == 1 << 30
    small = pools["gpu-small"].fabric_check_plan()
    assert small.floors == () and "no published all_reduce_perf figure for g5" in small.basis
    # A published two-node figure says nothing about four nodes.
    assert pools["gpu-large"].fabric_check_plan(4).floors == ()


@pytest.mark.parametrize("family", sorted(load_published_busbw()))
def test_each_published_figure_is_the_default_floor_of_its_familys_pools(family):
    """The catalog holds together: a two-node figure at a size the check sweeps, its source
    pinned to a commit, and a pool of that family gets 90 % of it from that size up (the share
    at which nccl-tests' own NCCL_TESTS_MIN_BW check fails: src/util.cu writeResultFooter)."""
    published = load_published_busbw()[family]
    assert published.nodes == 2 and published.bytes in fabric_sizes(FABRIC_MAX_BYTES)
    assert re.search(r"^https://github.com/[^/]+/[^/]+/blob/[0-9a-f]{40}/", published.source)
    catalog = load_catalog()
    instance_type = next(n for n in catalog.names(gpu=True) if catalog[n].family == family)
    config = config_with_pool("gpu-large", instanceTypes=[instance_type], efa=True)
    plan = pool_of(config, "gpu-large").fabric_check_plan()
    (floor,) = plan.floors
    assert (floor.from_bytes, floor.to_bytes) == (published.bytes, None)
    assert floor.min_busbw == round(0.9 * published.busbw, 2)
    assert published.source in plan.basis and published.bytes in plan.sizes


def test_floors_from_stack_config_replace_the_default():
    floors = [{"fromBytes": 1 << 20, "toBytes": 1 << 28, "minBusbw": 12.5}]
    plan = plan_for(1 << 28, floors)
    assert [(f.from_bytes, f.to_bytes, f.min_busbw) for f in plan.floors] == [
        (1 << 20, 1 << 28, 12.5)
    ]
    assert plan.basis == "floors from stack config" and plan.sizes[-1] == 1 << 28


@pytest.mark.parametrize(
    ("pool", "check", "message"),
    [
        ("cpu", {"nodes": 2}, "fabricCheck is set on a CPU pool; allowed: only on GPU pools"),
        ("gpu-small", {"nodes": 5}, "fabricCheck.nodes 5 exceeds maxNodes 4; allowed: 2 to 4"),
        ("gpu-small", {"nodes": 1}, "greater than or equal to 2"),
        (
            "gpu-small",
            {"maxBytes": 1 << 20, "floors": [{"fromBytes": 1 << 21, "minBusbw": 1.0}]},
            "fabricCheck.floors[0] covers no size the check runs",
        ),
        (
            "gpu-small",
            {"floors": [{"fromBytes": 4096, "toBytes": 1024, "minBusbw": 1.0}]},
            "toBytes 1024 < fromBytes 4096; allowed: fromBytes <= toBytes",
        ),
        ("gpu-small", {"floors": [{"fromBytes": 4096, "minBusbw": 0}]}, "greater than 0"),
        ("gpu-small", {"flors": []}, "unknown key; did you mean 'floors'?"),
    ],
)
def test_bad_fabric_checks_are_one_clear_config_error(pool, check, message):
    with pytest.raises(ConfigError) as error:
        config_with_pool(pool, fabricCheck=check)
    text = str(error.value)
    assert f"training-platform:nodePools[{pool}]" in text and message in text
    assert "Traceback" not in text


# -- the MPIJob ----------------------------------------------------------------------------------


def test_the_check_is_an_mpijob_of_the_jobs_renderer_that_conforms_to_the_crd():
    config = load_stack_file("dev")
    policy, mpijob = check_manifests(config, pool_of(config, "gpu-large"), "research", 2, IMAGE)
    assert conformance_errors(mpijob) == []
    kubernetes_validate.validate(policy, "1.34", strict=True)
    meta = mpijob["metadata"]
    assert meta["namespace"] == "research" and meta["name"] == "nccl-gpu-large"
    assert meta["labels"]["kueue.x-k8s.io/queue-name"] == "research"
    assert meta["labels"]["training-platform/fabric-check"] == "gpu-large"
    spec = mpijob["spec"]
    assert spec["slotsPerWorker"] == 8 and spec["mpiReplicaSpecs"]["Worker"]["replicas"] == 2
    assert spec["runPolicy"]["backoffLimit"] == 0
    launcher = spec["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
    (container,) = launcher["containers"]
    command = container["command"]
    assert command[:5] == ["mpirun", "-np", "16", "--map-by", "ppr:8:node"]
    assert command[-9:] == ["all_reduce_perf", "-b", "8", "-e", str(1 << 30), "-f", "2", "-g", "1"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["NCCL_DEBUG"] == "INFO" and env["FI_PROVIDER"] == "efa"
    assert len(container["env"]) == len(env)  # the check's NCCL_DEBUG replaced the jobs' WARN
    forwarded = {command[i + 1] for i, a in enumerate(command) if a == "-x"}
    assert {
        "NCCL_DEBUG",
        "NCCL_DEBUG_SUBSYS",
        "FI_PROVIDER",
        "PATH",
        "LD_LIBRARY_PATH",
    } <= forwarded
    (worker,) = spec["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    assert worker["resources"]["limits"]["vpc.amazonaws.com/efa"] == "4"
    assert launcher["serviceAccountName"] == "default"
    # That ServiceAccount has no Pod Identity: EKS injects no AWS_CONTAINER_* into its pods, and
    # mpirun would warn of each one it was told to forward, into the log the check parses.
    assert not [name for name in forwarded if name.startswith("AWS_")]


# mpi-operator v0.8.0 (pkg/controller/mpi_job_controller.go) runs an MPIJob's launcher as a Job:
# newLauncherJob copies runPolicy.backoffLimit, setRestartPolicy gives the Job's pod template the
# Launcher replica's restartPolicy (ExitCode becoming Never); pkg/apis/kubeflow/validation/
# validation.go accepts Never and OnFailure only.
VALID_RESTART_POLICIES = {"Never", "OnFailure"}


def launcher_job(mpijob: dict) -> dict:
    policy = mpijob["spec"]["mpiReplicaSpecs"]["Launcher"]["restartPolicy"]
    return {
        "backoffLimit": mpijob["spec"]["runPolicy"]["backoffLimit"],
        "restartPolicy": "Never" if policy == "ExitCode" else policy,
    }


def after_first_failure(job: dict) -> tuple[bool, bool]:
    """(the Job failed, its launcher pod kept) once the launcher's container exits non-zero.

    kubernetes pkg/controller/job/job_controller.go, syncJob: with OnFailure the kubelet restarts
    the container in its pod, which stays Running with restartCount 1; with Never the pod goes
    Failed. The Job fails when its failed pods exceed backoffLimit, or (pastBackoffLimitOnFailure,
    OnFailure only) when the restarts of its Running and Pending pods reach backoffLimit, or pass
    0 where it is 0. A failed Job's active pods, neither Succeeded nor Failed
    (controller.FilterActivePods), are deleted (deleteActivePods); a Failed pod is kept.
    """
    on_failure = job["restartPolicy"] == "OnFailure"
    phase, restarts = ("Running", 1) if on_failure else ("Failed", 0)
    limit = job["backoffLimit"]
    counted = restarts if on_failure and phase in ("Running", "Pending") else 0
    past_on_failure = counted > 0 if limit == 0 else counted >= limit
    failed = int(phase == "Failed") > limit or past_on_failure
    active = phase not in ("Succeeded", "Failed")
    return failed, not (failed and active)


def test_a_failed_check_ends_at_once_and_keeps_its_launcher_pod_and_log(dev_plan):
    config = load_stack_file("dev")
    _, mpijob = check_manifests(config, pool_of(config, "gpu-large"), "research", 2, IMAGE)
    replicas = mpijob["spec"]["mpiReplicaSpecs"]
    assert {r["restartPolicy"] for r in replicas.values()} <= VALID_RESTART_POLICIES
    check = launcher_job(mpijob)
    assert check == {"backoffLimit": 0, "restartPolicy": "Never"}
    assert after_first_failure(check) == (True, True)
    # Not vacuous: a launcher restarted OnFailure under backoffLimit 0 ends the Job as fast and
    # loses its pod, the failed run's log with it.
    assert after_first_failure({**check, "restartPolicy": "OnFailure"}) == (True, False)
    # Jobs keep theirs: a failed run is restarted in its pod, up to maxRestarts (3).
    job = launcher_job(job_of(dev_plan, "gpt-large-mpi").inputs)
    assert job == {"backoffLimit": 3, "restartPolicy": "OnFailure"}
    assert after_first_failure(job) == (False, True)


def launcher_pod(name: str, created: str, state: dict) -> dict:
    """A launcher pod as the API lists it (core/v1 Pod), labelled as mpi-operator v0.8.0 labels
    the launcher of MPIJob nccl-gpu-large (pkg/controller, defaultLabels)."""
    return {
        "metadata": {
            "name": name,
            "namespace": "research",
            "creationTimestamp": created,
            "labels": {
                "training.kubeflow.org/job-name": "nccl-gpu-large",
                "training.kubeflow.org/job-role": "launcher",
            },
        },
        "spec": {"containers": [{"name": "launcher", "image": IMAGE}]},
        "status": {
            "phase": "Failed" if "terminated" in state else "Pending",
            "containerStatuses": [
                {
                    "name": "launcher",
                    "restartCount": 0,
                    "containerID": f"containerd://{name}" if "terminated" in state else "",
                    "state": state,
                    "lastState": {},
                }
            ],
        },
    }


# The check's launcher as it fails (restartPolicy Never: one run, the pod Failed), an older
# check's of the same name, and one still waiting for its image.
FAILED = {"terminated": {"exitCode": 1, "reason": "Error", "containerID": "containerd://l-new"}}
NEW = launcher_pod("l-new", "2026-11-22T10:00:00Z", FAILED)
OLD = launcher_pod("l-old", "2026-11-22T09:00:00Z", {**FAILED, "terminated": {
    **FAILED["terminated"], "containerID": "containerd://l-old"}})  # fmt: skip
WAITING = launcher_pod("l-waiting", "2026-11-22T10:00:00Z", {"waiting": {"reason": "ErrImagePull"}})


@pytest.mark.parametrize(
    ("pods", "newest"), [([], None), ([NEW], "l-new"), ([NEW, OLD], "l-new"), ([OLD, NEW], "l-new")]
)
def test_the_log_read_is_the_newest_launchers(pods, newest):
    assert newest_pod(pods) == newest


def local_api_with(pods: list[dict], logs: dict[str, str], tmp_path, monkeypatch):
    """The local API holding `pods` (created in that order, each a second after the one before:
    the API server sets creationTimestamp, to the second), each container ID's log, and a
    KubeCluster of the real client on it."""
    api = KubeAPI(Authorizer([])).start()
    namespaces, pod_kind = (
        next(k for k in BUILTIN if k.plural == p) for p in ("namespaces", "pods")
    )
    api.call(api.create, namespaces, "", {"metadata": {"name": "research"}})
    for index, pod in enumerate(pods):
        if index:
            time.sleep(1.05)
        stored = api.call(
            api.create, pod_kind, "research", {k: pod[k] for k in ("metadata", "spec")}
        )
        api.call(api.replace, pod_kind, stored, {**stored, "status": pod["status"]})
    api.container_logs = logs
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(api.kubeconfig(api.add_token(ADMIN))))
    # The client reads $KUBECONFIG once, on import (kube_config.KUBE_CONFIG_DEFAULT_LOCATION).
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
    return api, nccl_check.KubeCluster()


def test_the_cli_reads_the_newest_launchers_log_through_the_kubernetes_client(
    tmp_path, monkeypatch
):
    """KubeCluster.launcher_log with the real client against the local API, whose pods/log picks
    the run as the kubelet does."""
    logs = {"containerd://l-new": "the failed run: NCCL lines, table, error\n"}
    api, cluster = local_api_with(
        [OLD, NEW], logs | {"containerd://l-old": "older\n"}, tmp_path, monkeypatch
    )
    try:
        assert cluster.launcher_log("research", "nccl-gpu-large") == logs["containerd://l-new"]
        assert cluster.launcher_log("research", "nccl-other") == ""
    finally:
        api.stop()


def test_a_launcher_that_never_ran_is_a_failed_check_in_one_line(tmp_path, monkeypatch):
    """The MPIJob failed (a worker evicted) while its launcher waited for its image: the API
    refuses its log (400, waiting to start), and the check says so rather than a traceback."""
    api, cluster = local_api_with([WAITING], {}, tmp_path, monkeypatch)
    try:
        with pytest.raises(
            CheckError,
            match=r"the launcher's log \(pod l-waiting\) cannot be read: "
            r'container "launcher" in pod "l-waiting" is waiting to start: ErrImagePull',
        ):
            cluster.launcher_log("research", "nccl-gpu-large")
    finally:
        api.stop()


def test_the_check_on_a_pool_without_efa_has_no_efa_settings():
    config = load_stack_file("dev")
    _, mpijob = check_manifests(config, pool_of(config, "gpu-small"), "team-a", 2, IMAGE)
    assert conformance_errors(mpijob) == []
    (container,) = mpijob["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["NCCL_DEBUG"] == "INFO" and "FI_PROVIDER" not in env


@pytest.mark.parametrize(
    ("pool", "queue", "nodes", "message"),
    [
        ("cpu", "team-a", None, "'cpu' is not a GPU pool; allowed: gpu-large, gpu-small"),
        ("gpu-large", "nobody", None, "'nobody' is not a team queue; allowed: team-a, research"),
        ("gpu-large", "research", 17, "--nodes 17; allowed: 2 to pool gpu-large's 16"),
        # research may borrow 50 % of gpu-large's 128 GPUs: 8 nodes, not 9.
        ("gpu-large", "research", 9, "needs 72 nvidia.com/gpu in pool gpu-large but team "),
    ],
)
def test_a_check_that_could_not_run_is_refused(pool, queue, nodes, message):
    with pytest.raises(CheckError, match=message.replace("(", r"\(")):
        resolve(load_stack_file("dev"), pool, queue, nodes)


def test_a_one_node_gpu_pool_is_valid_config_but_refused_a_check():
    pool = {"name": "solo", "instanceTypes": ["g5.12xlarge"], "maxNodes": 1}
    values = stack_values("dev", nodePools=[pool], jobs=[], devServers=NO_DEV_SERVERS)
    config = parse_stack_config(values, "Pulumi.dev.yaml")
    with pytest.raises(CheckError, match="pool solo has maxNodes 1; a fabric check needs 2 nodes"):
        resolve(config, "solo", "team-a", None)


def test_no_credentials_a_refusing_or_absent_api_server_is_one_line_not_a_traceback(
    tmp_path, monkeypatch, capsys
):
    """No kubeconfig; a kubeconfig whose token the API server does not know (a 401, as when
    `aws eks get-token` found no AWS credentials); an API server that is not there: exit 2,
    nothing submitted, one line each."""
    argv = ["--stack", "dev", "--pool", "gpu-large", "--queue", "research", "--image", IMAGE]
    kubeconfig = tmp_path / "kubeconfig"
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
    capsys.readouterr()

    def refused() -> str:
        assert nccl_check.main(argv) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1, err
        return err

    assert refused().startswith("error: no cluster credentials: ")
    api = KubeAPI(Authorizer([])).start()
    try:
        kubeconfig.write_text(yaml.safe_dump(api.kubeconfig("a-token-nobody-issued")))
        assert "the API server answered 401: Unauthorized" in refused()
    finally:
        api.stop()
    assert "cannot reach the Kubernetes API server" in refused()


def test_dry_run_prints_the_manifests_and_a_missing_image_is_a_usage_error(capsys):
    assert nccl_check.main(["--pool", "gpu-large", "--queue", "research", "--dry-run"]) == 2
    assert "pass --image with the trainer image's efa target" in capsys.readouterr().err
    args = ["--pool", "gpu-large", "--queue", "research", "--image", IMAGE, "--dry-run"]
    assert nccl_check.main(args) == 0
    policy, mpijob = yaml.safe_load_all(capsys.readouterr().out)
    assert (policy["kind"], mpijob["kind"]) == ("NetworkPolicy", "MPIJob")


# -- parsing and verdicts on sample launcher logs ------------------------------------------------


@pytest.mark.parametrize("name", [EFA_RUN, SOCKET_RUN, SRUN_RUN, WRONG_RUN])
def test_the_sample_logs_are_in_nccl_tests_own_format(name):
    """Every table line of a sample log, launcher prefix removed, is what nccl-tests v2.19.6's
    printf formats print for the figures on it: the samples are nccl-tests' layout, not ours."""
    lines = [PREFIX.sub("", line) for line in fixture(name).splitlines()]
    start = lines.index(header_lines()[1])
    assert lines[start - 1 : start + 3] == header_lines()
    out = parse_output(fixture(name))
    rows = lines[start + 3 : start + 3 + len(out.rows)]
    assert rows == [
        row_line(
            r.size,
            r.count,
            r.type,
            r.redop,
            -1,
            *(Half(h.time_us, h.algbw, h.busbw, h.wrong) for h in (r.out_of_place, r.in_place)),
        )
        for r in out.rows
    ]
    end = start + 3 + len(out.rows)
    footer = footer_lines(out.out_of_bounds, out.average_busbw)
    assert lines[end : end + len(footer)] == footer


def test_the_table_of_a_run_parses_row_by_row():
    out = parse_output(fixture(SRUN_RUN))  # srun -l's "0: " prefix on every line
    assert [r.size for r in out.rows] == [8 << i for i in range(32)]
    last = out.rows[-1]
    assert (last.count, last.type, last.redop) == (4294967296, "float", "sum")
    assert (last.out_of_place.time_us, last.out_of_place.algbw) == (67843.1, 253.23)
    assert (last.out_of_place.busbw, last.in_place.busbw, last.wrong) == (474.80, 459.00, 0)
    assert (out.average_busbw, out.out_of_bounds) == (130.35, 0)


def test_srun_labels_padded_for_ten_or_more_tasks_are_stripped():
    # Slurm pads -l labels to the widest task id: " 0: " beside "15: " (src/api/step_io.c, _wid).
    lines = fixture(SRUN_RUN).splitlines()
    padded = "\n".join(" " + line if line.startswith("0: ") else line for line in lines)
    assert parse_output(padded).rows == parse_output(fixture(SRUN_RUN)).rows


def test_efa_in_use_passes_the_default_floor_on_an_efa_pool():
    out = parse_output(fixture(EFA_RUN))
    assert (out.networks, out.providers) == ({"Libfabric"}, {"efa"})
    assert out.average_busbw == 16.7568 and out.out_of_bounds == 0
    default = pool_of(load_stack_file("dev"), "gpu-large").fabric_check_plan()
    assert [(f.from_bytes, f.min_busbw) for f in default.floors] == [(1 << 30, 29.44)]
    assert judge(out, default, efa=True) == nccl_check.Verdict(True, "efa", [])


def test_efa_in_use_still_fails_below_the_floor():
    verdict = judge(
        parse_output(fixture(EFA_RUN)),
        plan_for(1 << 30, [{"fromBytes": 1 << 29, "minBusbw": 67}]),
        efa=True,
    )
    assert not verdict.passed and verdict.network == "efa"
    assert verdict.findings == ["busbw below the 67 GB/s floor at 536870912 B (66.07)"]


def test_socket_fallback_fails_an_efa_pool_even_when_busbw_passes():
    out = parse_output(fixture(SOCKET_RUN))  # mpirun --tag-output's "[1,<rank>]<stdout>:"
    assert out.networks == {"Socket"} and out.providers == set()
    assert out.rows[-1].size == 1 << 30 and out.average_busbw == 2.60704
    plan = plan_for(1 << 30, [{"fromBytes": 1 << 30, "minBusbw": 10.0}])
    verdict = judge(out, plan, efa=True)
    assert not verdict.passed and verdict.network == "socket"
    (finding,) = verdict.findings
    assert finding.startswith("NCCL fell back to TCP sockets ('Using network Socket')")
    text = report(out, plan, verdict)
    assert "network: socket" in text and text.endswith("FAILED")
    # Without EFA, sockets are what NCCL should use.
    assert judge(out, plan, efa=False).passed


def test_wrong_results_fail_whatever_the_bandwidth():
    """#wrong 64 and 32 at 2 MiB, 'Out of bounds values : 3 FAILED'."""
    out = parse_output(fixture(WRONG_RUN))
    verdict = judge(out, plan_for(1 << 27), efa=True)
    assert verdict.network == "efa" and not verdict.passed
    assert verdict.findings == [
        "wrong results (#wrong > 0) at 2097152 B (96 elements)",
        "all_reduce_perf counts 3 out of bounds value(s)",
    ]


@pytest.mark.parametrize("lines", [OLD_PLUGIN_LINES, CURRENT_PLUGIN_LINES])
def test_both_generations_of_plugin_lines_name_efa(lines):
    assert parse_output(lines).providers == {"efa"}
    assert judge(parse_output(lines + fixture(EFA_RUN)), plan_for(1 << 30), True).passed


def test_another_libfabric_provider_is_not_efa():
    tcp = fixture(EFA_RUN).replace(
        "provider is efa, fabric is efa", "provider is tcp, fabric is 10.0.0.0/16"
    )
    verdict = judge(parse_output(tcp), plan_for(1 << 30), True)
    assert verdict.network == "libfabric (tcp)"
    assert "aws-ofi-nccl's libfabric provider is tcp, not efa" in verdict.findings[0]


def test_a_log_without_nccl_info_lines_cannot_pass():
    """The p5 run has no NCCL_DEBUG lines: busbw clears its default floor, and the check still
    fails because it cannot tell EFA from sockets."""
    out = parse_output(fixture(SRUN_RUN))
    config = config_with_pool("gpu-large", instanceTypes=["p5.48xlarge"], efa=True)
    plan = pool_of(config, "gpu-large").fabric_check_plan()
    assert [(f.from_bytes, f.min_busbw) for f in plan.floors] == [(1 << 31, 399.35)]
    verdict = judge(out, plan, efa=True)
    assert verdict.network == "unknown"
    (finding,) = verdict.findings
    assert finding.startswith("cannot tell which network NCCL used")


def test_a_run_that_stopped_early_fails():
    out = parse_output(fixture(EFA_RUN))
    verdict = judge(out, plan_for(1 << 31), efa=True)
    assert verdict.findings == ["no result for 1 size(s), from 2147483648 B"]
    assert not judge(parse_output(CURRENT_PLUGIN_LINES), plan_for(1 << 20), True).passed


def test_a_table_of_another_layout_is_refused():
    """nccl-tests before 2.11 printed an 'error' column and no root: not read as #wrong."""
    old = "#  size  count  type  redop  time  algbw  busbw  error  time  algbw  busbw  error\n"
    with pytest.raises(ValueError, match="this parser reads"):
        parse_output(old)


# -- the command through real sshd and mpirun, with the CPU stand-in --------------------------


@pytest.fixture(scope="module")
def stand_in_launcher():
    """The launcher of gpu-large's check, floors set for the sizes a CPU sweeps in a second."""
    check = {"maxBytes": 1 << 18, "floors": [{"fromBytes": 1 << 18, "minBusbw": 0.001}]}
    config = config_with_pool("gpu-large", fabricCheck=check)
    pool = pool_of(config, "gpu-large")
    _, mpijob = check_manifests(config, pool, "research", 2, IMAGE)
    with OpenSsh() as site:
        # The namespace's default ServiceAccount has no Pod Identity association.
        launcher = Launcher(site, mpijob, pod_identity=False)
        # The stand-in where the image has all_reduce_perf: on the image's PATH only.
        conda = Path(launcher.image_env["PATH"].split(":")[0])
        stand_in = (
            f'#!/bin/sh\nPYTHONPATH={ROOT} exec python -m workloads.tests.nccl_stand_in "$@"\n'
        )
        site.write(conda / "all_reduce_perf", stand_in).chmod(0o755)
        yield launcher, pool.fabric_check_plan()


def test_the_rendered_command_runs_all_reduce_perf_on_two_hosts_and_is_judged(stand_in_launcher):
    launcher, plan = stand_in_launcher
    result = launcher.run(launcher.sized(launcher.command))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(STAND_IN_LINE)
    # Every variable mpirun forwards is there: no warning of a missing one in the log.
    assert "could not find environment variable" not in result.stdout + result.stderr
    out = parse_output(result.stdout)
    assert [r.size for r in out.rows] == plan.sizes == [8 << i for i in range(16)]
    assert all(r.wrong == 0 for r in out.rows) and out.out_of_bounds == 0
    floored = [r for r in out.rows if r.size >= 1 << 18]
    assert floored and all(min(r.out_of_place.busbw, r.in_place.busbw) > 0 for r in floored)
    verdict = judge(out, plan, efa=True)
    # Measured busbw clears the floor; the stand-in is not NCCL, so no network is named.
    assert verdict.network == "unknown" and len(verdict.findings) == 1
    print(result.stdout, report(out, plan, verdict), sep="\n")
    assert "PASSED" not in report(out, plan, verdict)
    strict = plan_for(1 << 18, [{"fromBytes": 1 << 18, "minBusbw": 10000}])
    assert any("below the 10000 GB/s floor" in f for f in judge(out, strict, True).findings)
