"""The policy pack config a real preview takes (`--policy-pack-config`), shipped per stack file:
what `make plan` hands the rules offline, in the shape the engine hands it to each rule."""

import json

import jsonschema
import pytest
from google.protobuf import json_format, struct_pb2
from pulumi.runtime import proto

from infra.stack.loading import load_stack_file
from policies.pack_config import main, pack_config, policy_settings, render
from policies.rules import POLICIES
from policies.rules.base import DEFAULTS
from tests.e2e.test_policy_server import server
from tests.plugin import ROOT

STACKS = sorted(p.name.split(".")[1] for p in ROOT.glob("Pulumi.*.yaml"))


@pytest.mark.parametrize("stack", STACKS)
def test_each_stack_ships_its_policy_pack_config(stack):
    shipped = ROOT / f"policies/policy-config.{stack}.json"
    assert shipped.is_file() and shipped.read_text() == render(load_stack_file(stack)), (
        f"regenerate: .venv/bin/python -m policies.pack_config --stack {stack} --out {shipped}"
    )


@pytest.mark.parametrize("stack", STACKS)
def test_the_shipped_config_fits_each_rules_schema(stack):
    """As the engine validates it (ValidatePolicyPackConfig: each rule's JSON schema), and
    stricter: no key a rule does not declare, no rule the pack does not have."""
    config = json.loads((ROOT / f"policies/policy-config.{stack}.json").read_text())
    schemas = {p.name: p.config_schema for p in POLICIES if p.config_schema}
    assert set(config) == set(schemas)
    for name, properties in config.items():
        schema = {
            "type": "object",
            "properties": schemas[name].properties,
            "required": list(schemas[name].properties),
            "additionalProperties": False,
        }
        jsonschema.validate(properties, schema)


def test_every_setting_the_rules_read_is_in_some_schema():
    """config_of falls back to DEFAULTS for a key the file lacks: a key no schema declares would
    never reach a rule from the file, and the real preview would judge by the default."""
    declared = {key for p in POLICIES if p.config_schema for key in p.config_schema.properties}
    assert declared == set(DEFAULTS) | {"region"} == set(policy_settings(load_stack_file("dev")))


def configured_server(config: dict):
    """The policy server after the engine's Configure call with `config` (Pulumi's format)."""
    analyzer = server()
    request = proto.ConfigureAnalyzerRequest()
    for name, properties in config.items():
        struct = struct_pb2.Struct()
        json_format.ParseDict(properties, struct)
        request.policyConfig[name].CopyFrom(proto.PolicyConfig(properties=struct))
    analyzer.Configure(request, None)
    return analyzer


def cost_verdict(analyzer, plan) -> list[str]:
    resources = []
    for r in plan.resources:
        properties = struct_pb2.Struct()
        json_format.ParseDict(json.loads(json.dumps(r.inputs)), properties)
        resources.append(
            proto.AnalyzerResource(type=r.type, properties=properties, urn=r.urn, name=r.name)
        )
    response = analyzer.AnalyzeStack(proto.AnalyzeStackRequest(resources=resources), None)
    return [d.message for d in response.diagnostics if d.policyName == "cost-budget"]


def test_the_server_judges_by_the_file_as_the_offline_check_by_the_stack(dev_plan):
    """The dev file's budget passes the dev plan through the policy server; the same file with a
    budget below the plan's ceiling fails it there, as the offline check fails it."""
    from policies.offline import check

    config = pack_config(load_stack_file("dev"))
    assert cost_verdict(configured_server(config), dev_plan) == []
    low = {**config, "cost-budget": {**config["cost-budget"], "budgetUsdPerHour": 100}}
    assert "exceeds the budget $100.00/hour" in " ".join(
        cost_verdict(configured_server(low), dev_plan)
    )
    offline = check(dev_plan, {**policy_settings(load_stack_file("dev")), "budgetUsdPerHour": 100})
    assert {v.policy for v in offline} == {"cost-budget"}


def test_the_command_prints_or_writes_the_file(tmp_path, capsys):
    assert main(["--stack", "prod"]) == 0
    assert capsys.readouterr().out == (ROOT / "policies/policy-config.prod.json").read_text()
    assert main(["--stack", "prod", "--out", str(tmp_path / "c.json")]) == 0
    assert (tmp_path / "c.json").read_text() == render(load_stack_file("prod"))
    assert main(["--stack", "nope"]) == 2
    assert "No stack file Pulumi.nope.yaml" in capsys.readouterr().err
