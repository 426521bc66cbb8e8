"""The NCCL fabric check: its stack config, the MPIJob it renders, and its verdict.

The parser and verdict read published all_reduce_perf launcher logs (tests/fixtures/nccl, with
their sources in SOURCES.md) and NCCL_DEBUG lines written from the format strings in NCCL's and
aws-ofi-nccl's source. The rendered MPIJob is checked against the MPI operator's CRD and run
through OpenMPI's real mpirun over two real sshd (the tests/test_mpi_launch.py launcher), with a
CPU stand-in for all_reduce_perf (tests/nccl_stand_in.py) whose output the check then judges.
"""

import copy
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from infra.catalog import load_published_busbw
from infra.config import ConfigError, StackConfig, load_stack_file, parse_stack_config
from tests.conftest import ROOT, stack_values
from tests.crd_schema import conformance_errors
from tests.nccl_stand_in import STAND_IN_LINE
from tests.openssh import OpenSsh
from tests.test_mpi_launch import Launcher
from workloads import nccl_check
from workloads.nccl_check import (
    CheckError,
    check_manifests,
    judge,
    parse_output,
    report,
    resolve,
)

FIXTURES = Path(__file__).parent / "fixtures" / "nccl"
IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/tp-dev/trainer@sha256:" + "a" * 64
# Lines as NCCL and aws-ofi-nccl print them today: NVIDIA/nccl src/init.cc ("Using network %s"),
# aws/aws-ofi-nccl src/nccl_ofi_net.cpp ("NET/OFI Selected provider is %s, fabric is %s (found
# %d nics)", v1.15.0 and later) and src/nccl_ofi_interface_nvidia.cpp (the plugin's name,
# "Libfabric"), behind NCCL's INFO prefix "<host>:<pid>:<tid> [<dev>] NCCL INFO ".
CURRENT_EFA_LINES = (
    "node-0:172:172 [0] NCCL INFO NET/OFI Selected provider is efa, fabric is efa-direct "
    "(found 32 nics)\n"
    "node-0:172:172 [0] NCCL INFO Using network Libfabric\n"
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


@pytest.mark.parametrize("family", ["p4de", "p5"])
def test_published_figures_are_the_rows_of_the_published_runs(family):
    """The catalog's figures are what the cited launcher logs print at that size."""
    published = load_published_busbw()[family]
    out = parse_output(fixture(f"awsome-{family}-2node.log"))
    (row,) = [r for r in out.rows if r.size == published.bytes]
    assert row.out_of_place.busbw == published.busbw


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


def test_dry_run_prints_the_manifests_and_a_missing_image_is_a_usage_error(capsys):
    assert nccl_check.main(["--pool", "gpu-large", "--queue", "research", "--dry-run"]) == 2
    assert "pass --image with the trainer image's efa target" in capsys.readouterr().err
    args = ["--pool", "gpu-large", "--queue", "research", "--image", IMAGE, "--dry-run"]
    assert nccl_check.main(args) == 0
    policy, mpijob = yaml.safe_load_all(capsys.readouterr().out)
    assert (policy["kind"], mpijob["kind"]) == ("NetworkPolicy", "MPIJob")


# -- parsing and verdicts on published logs -----------------------------------------------------


def test_the_table_of_a_published_run_parses_row_by_row():
    out = parse_output(fixture("awsome-p5-2node.log"))  # srun -l's "0: " prefix on every line
    assert [r.size for r in out.rows] == [8 << i for i in range(32)]
    last = out.rows[-1]
    assert (last.count, last.type, last.redop) == (4294967296, "float", "sum")
    assert (last.out_of_place.time_us, last.out_of_place.algbw) == (66132, 259.78)
    assert (last.out_of_place.busbw, last.in_place.busbw, last.wrong) == (487.09, 487.26, 0)


def test_efa_in_use_passes_on_an_efa_pool():
    """aws-do-eks' EFA run (mpirun --tag-output prefixes, aws-ofi-nccl before 1.12's names)."""
    out = parse_output(fixture("aws-do-eks-efa.log"))
    assert (out.networks, out.providers) == ({"AWS Libfabric"}, {"efa"})
    assert out.average_busbw == 0.960456 and out.out_of_bounds == 0
    verdict = judge(out, plan_for(1 << 30), efa=True)
    assert verdict == nccl_check.Verdict(True, "efa", [])


def test_efa_in_use_still_fails_below_the_floor():
    verdict = judge(
        parse_output(fixture("aws-do-eks-efa.log")),
        plan_for(1 << 30, [{"fromBytes": 1 << 28, "minBusbw": 2.83}]),
        efa=True,
    )
    assert not verdict.passed and verdict.network == "efa"
    assert verdict.findings == ["busbw below the 2.83 GB/s floor at 1073741824 B (2.82)"]


def test_socket_fallback_fails_an_efa_pool_even_when_busbw_passes():
    out = parse_output(fixture("aws-do-eks-socket.log"))
    assert out.networks == {"Socket"} and out.providers == set()
    plan = plan_for(1 << 30, [{"fromBytes": 1 << 30, "minBusbw": 1.0}])
    verdict = judge(out, plan, efa=True)
    assert not verdict.passed and verdict.network == "socket"
    (finding,) = verdict.findings
    assert finding.startswith("NCCL fell back to TCP sockets ('Using network Socket')")
    text = report(out, plan, verdict)
    assert "network: socket" in text and text.endswith("FAILED")
    # Without EFA, sockets are what NCCL should use.
    assert judge(out, plan, efa=False).passed


def test_wrong_results_fail_whatever_the_bandwidth():
    """nccl-tests issue 369: #wrong 96 and 32 at 1 MiB, 'Out of bounds values : 4 FAILED'."""
    out = parse_output(fixture("nccl-tests-369-wrong.log") + CURRENT_EFA_LINES)
    verdict = judge(out, plan_for(1 << 27), efa=True)
    assert verdict.network == "efa" and not verdict.passed
    assert verdict.findings == [
        "wrong results (#wrong > 0) at 1048576 B (128 elements)",
        "all_reduce_perf counts 4 out of bounds value(s)",
    ]


def test_current_plugin_lines_tell_efa_from_another_libfabric_provider():
    out = parse_output(CURRENT_EFA_LINES)
    assert (out.networks, out.providers) == ({"Libfabric"}, {"efa"})
    tcp = CURRENT_EFA_LINES.replace(
        "provider is efa, fabric is efa-direct", "provider is tcp, fabric is 10.0.0.0/16"
    )
    verdict = judge(
        parse_output(tcp + fixture("nccl-tests-369-wrong.log")), plan_for(1 << 27), True
    )
    assert verdict.network == "libfabric (tcp)"
    assert "aws-ofi-nccl's libfabric provider is tcp, not efa" in verdict.findings[0]


def test_a_log_without_nccl_info_lines_cannot_pass():
    """The published p5 table has no NCCL_DEBUG lines: busbw clears its default floor, and the
    check still fails because it cannot tell EFA from sockets."""
    out = parse_output(fixture("awsome-p5-2node.log"))
    config = config_with_pool("gpu-large", instanceTypes=["p5.48xlarge"], efa=True)
    plan = pool_of(config, "gpu-large").fabric_check_plan()
    assert [(f.from_bytes, f.min_busbw) for f in plan.floors] == [(1 << 31, 399.35)]
    verdict = judge(out, plan, efa=True)
    assert verdict.network == "unknown"
    (finding,) = verdict.findings
    assert finding.startswith("cannot tell which network NCCL used")


def test_a_run_that_stopped_early_fails():
    out = parse_output(fixture("aws-do-eks-efa.log"))
    verdict = judge(out, plan_for(1 << 31), efa=True)
    assert verdict.findings == ["no result for 1 size(s), from 2147483648 B"]
    assert not judge(parse_output(CURRENT_EFA_LINES), plan_for(1 << 20), True).passed


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
        launcher = Launcher(site, mpijob)
        program = ROOT / "tests" / "nccl_stand_in.py"
        # The stand-in where the image has all_reduce_perf: on the image's PATH only.
        conda = Path(launcher.image_env["PATH"].split(":")[0])
        site.write(conda / "all_reduce_perf", f'#!/bin/sh\nexec python {program} "$@"\n').chmod(
            0o755
        )
        yield launcher, pool.fabric_check_plan()


def test_the_rendered_command_runs_all_reduce_perf_on_two_hosts_and_is_judged(stand_in_launcher):
    launcher, plan = stand_in_launcher
    result = launcher.run(launcher.sized(launcher.command))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(STAND_IN_LINE)
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
