"""The offline plan CLI: plan.json and manifests, deterministic, clean failure on bad config."""

import json
import re
import subprocess
import sys

import pytest
import yaml

from deploy.plan import main, write_plan
from infra.stack.loading import load_stack_file
from tests.plugin import ROOT, stack_values


def run_plan_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "deploy.plan", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_plan_writes_plan_json_with_the_foundation(stack, tmp_path, capsys):
    assert main(["--stack", stack, "--out", str(tmp_path)]) == 0
    entries = json.loads((tmp_path / "plan.json").read_text())
    assert all(
        set(e)
        == {"urn", "type", "name", "parent", "provider", "dependencies", "inputs"}
        | {"custom", "protect", "deleteBeforeReplace", "ignoreChanges", "outputs"}
        for e in entries
    )
    types = {e["type"] for e in entries}
    for expected in [
        "aws:ec2/vpc:Vpc",
        "aws:ec2/subnet:Subnet",
        "aws:ec2/natGateway:NatGateway",
        "aws:kms/key:Key",
        "eks:index:Cluster",
        "aws:eks/nodeGroup:NodeGroup",
        "aws:eks/addon:Addon",
        "pulumi:providers:kubernetes",
        "training-platform:infra:Network",
        "training-platform:infra:Cluster",
    ]:
        assert expected in types
    assert (tmp_path / "manifests").is_dir()
    printed = capsys.readouterr().out
    assert f"Stack {stack} (us-west-2): {len(entries)} resources" in printed
    assert printed.index("NodePools") < printed.index("Cost (USD") < printed.index("Storage:")
    assert "eks:index:Cluster" not in printed  # resource counts only with --resources
    # The retired training operator is named for exactly the stack's PyTorchJobs, all elastic.
    jobs = load_stack_file(stack).jobs
    warned = re.findall(r"WARNING: job (\S+) is an elastic PyTorchJob: .* v1\.9\.4", printed)
    assert warned == [j.name for j in jobs if j.kind == "PyTorchJob"]
    assert warned == [j.name for j in jobs if j.min_nodes < j.max_nodes]


def test_a_job_without_kind_is_a_trainjob_and_the_plan_names_no_retired_operator_for_it(
    tmp_path, capsys
):
    fixed = {"name": "fixed", "nodePool": "cpu", "minNodes": 2, "maxNodes": 2,
             "queue": "team-a", "checkpoint": "efs", "args": ["--model", "tiny"]}  # fmt: skip
    values = stack_values("dev", jobs=[*stack_values("dev")["training-platform:jobs"], fixed])
    (tmp_path / "Pulumi.dev.yaml").write_text(yaml.safe_dump({"config": values}))
    out = str(tmp_path / "out")
    assert main(["--stack", "dev", "--project-dir", str(tmp_path), "--out", out]) == 0
    printed = capsys.readouterr().out
    table = printed.split("Jobs (start")[1].splitlines()[1:]
    kinds = [line.split()[:2] for line in table if line.startswith("  fixed ")]
    assert kinds[0] == ["fixed", "TrainJob"]  # the table's row; "fixed runs ..." follows
    warned = re.findall(r"WARNING: job (\S+) is", printed)
    assert warned == ["gpt-small", "smoke-cpu"]  # the stack's elastic PyTorchJobs alone


def test_plan_is_deterministic_across_processes(tmp_path, prod_plan):
    """The command's plan and this process's (another hash seed, other threads) are the same
    bytes; tests/bench_plan_determinism.py plans each stack many times under load."""
    result = run_plan_cli("--stack", "prod", "--out", str(tmp_path / "a"))
    assert result.returncode == 0, result.stderr
    write_plan(prod_plan, tmp_path / "b")
    for written in ("plan.json", "outputs.json"):
        assert (tmp_path / "a" / written).read_bytes() == (tmp_path / "b" / written).read_bytes()


def test_bad_config_exits_2_with_the_message_and_no_traceback(tmp_path):
    (tmp_path / "Pulumi.broken.yaml").write_text(
        "config:\n  aws:region: us-west-2\n  training-platform:network:\n    azCount: 7\n"
    )
    result = run_plan_cli(
        "--stack", "broken", "--project-dir", str(tmp_path), "--out", str(tmp_path / "out")
    )
    assert result.returncode == 2
    assert (
        "training-platform:network.azCount: Input should be less than or equal to 3"
        in result.stderr
    )
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


def test_unknown_stack_names_the_stacks_there_are(capsys):
    assert main(["--stack", "staging"]) == 2
    assert "allowed stacks: dev, prod" in capsys.readouterr().err


def test_yaml_syntax_error_is_a_config_error(tmp_path, capsys):
    (tmp_path / "Pulumi.bad.yaml").write_text("config: [unclosed\n")
    assert main(["--stack", "bad", "--project-dir", str(tmp_path)]) == 2
    assert "not YAML" in capsys.readouterr().err


def test_a_program_edit_dropping_node_pool_limits_is_reported_not_a_traceback(
    tmp_path, monkeypatch, capsys
):
    """The CLI as `make plan` runs it, after a program edit: no traceback, every unbounded pool
    named by the policy pack, and the plan's cost saying it has no ceiling."""
    from infra.karpenter import node_pools

    spec_with_limits = node_pools.node_pool_spec

    def without_limits(pool, zone=None):
        spec = spec_with_limits(pool, zone)
        del spec["limits"]
        return spec

    out = tmp_path / "out"
    assert main(["--stack", "dev", "--out", str(out)]) == 0
    monkeypatch.setattr(node_pools, "node_pool_spec", without_limits)
    capsys.readouterr()
    assert main(["--stack", "dev", "--out", str(out)]) == 1
    printed = capsys.readouterr().out
    for pool, gpu in (("gpu-small", True), ("gpu-large", True), ("cpu", False)):
        needed = "nodes, cpu, memory" + (", nvidia.com/gpu" if gpu else "")
        assert f"nodepool-limits: nodepools-{pool}: NodePool needs limits {needed}" in printed
        assert f"NodePool {pool} limits.nodes " in printed  # a change: the limit is gone
    assert "[mandatory] cost-budget: stack: " in printed
