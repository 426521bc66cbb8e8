"""The contract (infra/core/facts.py) and the engines that read it: a kind, chart, add-on or
overlay belongs to one integration, a kind says one of price, free or usage, and no engine names a
type token itself."""

import ast
import re

import pytest

from infra.core.cost import classify
from infra.core.facts import Facts, Integration, Kind
from infra.core.pods import OverlayPods
from infra.integrations import FACTS, INTEGRATIONS
from tests.plugin import ROOT

TOKEN = re.compile(r"^(aws|kubernetes|eks|docker-build|random):\S+:\S+$")
ENGINES = ["capacity", "cost", "replacement", "steps", "day_two", "change", "bill", "pods"]


def test_a_kind_says_one_of_price_free_or_usage():
    with pytest.raises(ValueError, match="one of price, free or usage"):
        Kind("aws:s3/bucket:Bucket", free="configuration", usage="storage")
    assert Kind("aws:ebs/volume:Volume").free == ""


def test_two_integrations_cannot_claim_one_kind_or_overlay():
    a = Integration("a", kinds=(Kind("aws:s3/bucket:Bucket", free="x"),))
    b = Integration("b", kinds=(Kind("aws:s3/bucket:Bucket", usage="y"),))
    with pytest.raises(ValueError, match="aws:s3/bucket:Bucket: both a and b"):
        Facts([a, b])
    c = Integration("c", overlays={"manifests/x": [OverlayPods("x", "source")]})
    with pytest.raises(ValueError, match="manifests/x: both c and c"):
        Facts([c, c])


def test_a_type_nobody_declares_is_unpriced_never_free():
    assert classify("aws:rds/instance:Instance", FACTS) == "unpriced"
    assert classify("training-platform:infra:Cluster", FACTS) == "free"


def test_every_integration_of_the_list_is_its_packages_contribution():
    names = [integration.name for integration in INTEGRATIONS]
    assert len(names) == len(set(names))
    packages = {p.parent.name for p in (ROOT / "infra").glob("*/facts.py")} | {"core"}
    assert set(names) == packages


@pytest.mark.parametrize("engine", ENGINES)
def test_no_engine_names_a_type_token(engine):
    tree = ast.parse((ROOT / "infra" / "core" / f"{engine}.py").read_text())
    tokens = [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and TOKEN.match(node.value)
    ]
    assert tokens == []
