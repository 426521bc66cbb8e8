"""The pull-request gate over a real `pulumi preview --json`: the same rule as the offline plan.

No Pulumi CLI or cloud account runs here, so the previews are written in the engine's JSON shape
as pulumi/pulumi defines it (pkg/display/json.go PreviewDigest and PreviewStep; each state an
apitype.ResourceV3, sdk/go/common/apitype/core.go; a replacement is one `replace` step with both
states unless --show-replacement-steps; unchanged resources are left out), from the steps of two
offline plans.
"""

import json
import shutil
from pathlib import Path

import pytest
import yaml

from deploy.preview_gate import main
from infra.core.change import DELETE, REPLACE
from infra.core.offline import RecordedResource
from infra.integrations import plan_steps
from tests.plugin import ROOT, plan_of, stack_values


def state(resource: RecordedResource) -> dict:
    return {
        "urn": resource.urn,
        "custom": resource.custom,
        "type": resource.type,
        "id": resource.outputs.get("id", ""),
        "inputs": resource.inputs,
        "outputs": resource.outputs,
        "parent": resource.parent,
        "protect": resource.protect,
        "dependencies": resource.dependencies,
        "provider": resource.provider,
    }


def preview_of(old, new) -> dict:
    steps = []
    for step in plan_steps(old, new):
        raw = {"op": step.op, "urn": step.urn, "provider": ""}
        if step.old:
            raw["oldState"] = state(step.old)
        if step.new:
            raw["newState"] = state(step.new)
        raw["replaceReasons" if step.op == REPLACE else "diffReasons"] = [
            r.split(" ", 1)[0] for r in step.reasons
        ]
        steps.append(raw)
    summary = {}
    for raw in steps:
        summary[raw["op"]] = summary.get(raw["op"], 0) + 1
    return {"steps": steps, "diagnostics": [], "changeSummary": summary, "duration": 0}


def write_stack(folder: Path, **sections) -> None:
    values = stack_values("prod", **sections)
    (folder / "Pulumi.prod.yaml").write_text(yaml.safe_dump({"config": values}))


def test_a_previewed_file_system_replacement_is_refused_until_acknowledged(tmp_path, capsys):
    smaller = {"fsx": {"enabled": True, "storageCapacityGib": 2400}}
    preview = preview_of(plan_of("prod"), plan_of("prod", storage=smaller))
    fsx = "aws:fsx/lustreFileSystem:LustreFileSystem"
    assert [s["op"] for s in preview["steps"] if s["oldState"]["type"] == fsx] == [REPLACE]
    path = tmp_path / "preview.json"
    path.write_text(json.dumps(preview))
    write_stack(tmp_path, storage=smaller)
    args = ["--stack", "prod", "--project-dir", str(tmp_path), str(path)]
    assert main(args) == 1
    printed = capsys.readouterr().out
    assert "[mandatory] data-loss: fsx (storage.fsx) would be replaced" in printed
    assert "DataRepositoryAssociation fsx" in printed  # what goes with it, from the engine
    acknowledged = [{"holder": "storage.fsx", "reason": "checkpoints are in S3"}]
    write_stack(tmp_path, storage=smaller, acknowledgeDataLoss=acknowledged)
    assert main(args) == 0


def test_a_previewed_user_removal_and_engine_errors_fail_the_gate(tmp_path, capsys):
    without_carol = {"users": []}
    preview = preview_of(plan_of("prod"), plan_of("prod", devServers=without_carol))
    deleted = [s for s in preview["steps"] if s["op"] == DELETE and "ns-carol" in s["urn"]]
    assert len(deleted) == 1 and deleted[0]["oldState"]["protect"] is True
    preview["diagnostics"] = [
        {
            "urn": deleted[0]["urn"],
            "prefix": "error: ",
            "message": f'resource "{deleted[0]["urn"]}" cannot be deleted\n'
            "because it is protected.",
            "severity": "error",
        }
    ]
    path = tmp_path / "preview.json"
    path.write_text(json.dumps(preview))
    write_stack(tmp_path, devServers=without_carol)
    assert main(["--stack", "prod", "--project-dir", str(tmp_path), str(path)]) == 1
    printed = capsys.readouterr().out
    assert "(devServers.users[carol]) would be deleted" in printed
    assert "[engine] resource" in printed


@pytest.mark.parametrize("text", ["{not json", "{}", "[]", '{"resources": []}'])
def test_not_a_preview_is_one_clear_error(text, tmp_path, capsys):
    """A file that is no preview is refused, never read as one that replaces nothing."""
    shutil.copy(ROOT / "Pulumi.prod.yaml", tmp_path)
    path = tmp_path / "preview.json"
    path.write_text(text)
    assert main(["--stack", "prod", "--project-dir", str(tmp_path), str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert "is not a `pulumi preview --json` output" in err


def test_a_preview_that_changes_nothing_passes(tmp_path, capsys):
    """What the engine writes for a stack it leaves as it is: counts, no steps."""
    shutil.copy(ROOT / "Pulumi.prod.yaml", tmp_path)
    path = tmp_path / "preview.json"
    path.write_text(json.dumps({"changeSummary": {"same": 244}, "duration": 9000000000}))
    assert main(["--stack", "prod", "--project-dir", str(tmp_path), str(path)]) == 0
    assert "What this change does to what exists (prod, from the real preview):" in (
        capsys.readouterr().out
    )


def test_the_workflow_previews_with_the_cli_of_the_pinned_sdk():
    workflow = yaml.safe_load((ROOT / ".github/workflows/pull-request.yml").read_text())
    pins = dict(
        line.split("==")
        for line in (ROOT / "requirements/platform.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    preview = workflow["jobs"]["preview"]
    assert preview["env"]["PULUMI_CLI_VERSION"] == pins["pulumi"]
    commands = " ".join(step.get("run", "") for step in preview["steps"])
    assert "pulumi preview" in commands and "--json" in commands
    assert "deploy.preview_gate" in commands and "policies/policy-config.$STACK.json" in commands
