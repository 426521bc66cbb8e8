"""The generated reference pages: every stack config key documented from its model, every
section on a page (docs/_ext/reference.py, which the strict docs build runs)."""

import re
import sys
from typing import Annotated, Any

import pytest
from pydantic import AfterValidator, BaseModel, Field

from infra.stack.config import StackConfig
from tests.plugin import ROOT

sys.path.insert(0, str(ROOT / "docs/_ext"))
from reference import rows, stack_sections  # noqa: E402


def test_every_key_has_a_type_a_default_and_a_description():
    found = rows(StackConfig, "")
    assert len({r.key for r in found}) == len(found)
    assert all(r.description and r.type and r.default for r in found)
    by_key = {r.key: r for r in found}
    assert by_key["nodePools[].maxNodes"].type == "integer"
    assert by_key["nodePools[].maxNodes"].allowed == "1 to 1000"
    assert by_key["network.natGateways"].allowed == "`single`, `perAz`"
    assert by_key["cluster.endpoint.publicAccessCidrs"].default == "[0.0.0.0/0]"
    assert by_key["hybrid.machines[].address"].type == "IPv4 address"


def test_a_key_without_a_description_or_a_type_name_stops_the_build():
    class Bare(BaseModel):
        steps: int = 3

    with pytest.raises(ValueError, match="training-platform:x.steps has no Field"):
        rows(Bare, "x")

    class Odd(BaseModel):
        value: Annotated[Any, AfterValidator(lambda v: v)] = Field(description="d")

    with pytest.raises(TypeError, match="no type name for Any"):
        rows(Odd, "x")


def test_the_reference_page_shows_every_section():
    page = (ROOT / "docs/platform/stack-config.md").read_text()
    shown = re.findall(r"^```\{stack-config\} (\S+)$", page, re.M)
    assert sorted(shown) == sorted(stack_sections())
