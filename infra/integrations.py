"""The integrations the platform is made of, in the order the program composes them, and the
engines bound to their facts.

Each package under infra/ owns one upstream system (docs/design/architecture.md has the map):
its stack-config section, its components, and in its facts.py what the engines need to know
about the kinds it declares. This list is the one place that names them all; the engines in
infra/core read only what is listed here.
"""

from collections.abc import Sequence
from typing import Any

from infra.billing import BILLING
from infra.core import capacity, cost, replacement, steps
from infra.core.catalog import RegionPrices, load_prices
from infra.core.declared import Declared, declared_in
from infra.core.facts import Facts
from infra.core.kinds import CORE
from infra.core.offline import Plan
from infra.eks import EKS
from infra.gpu import GPU
from infra.hybrid import HYBRID
from infra.images import IMAGES
from infra.karpenter import KARPENTER
from infra.kueue import KUEUE
from infra.operators import OPERATORS
from infra.storage import STORAGE
from infra.vpc import VPC

# The order of the program (deploy/program.py), the core's generic kinds last: the cost table
# lists its lines in this order.
INTEGRATIONS = (VPC, EKS, KARPENTER, GPU, OPERATORS, KUEUE, STORAGE, HYBRID, IMAGES, BILLING, CORE)
FACTS = Facts(INTEGRATIONS)


def classify(kind: str) -> str:
    return cost.classify(kind, FACTS)


def stack_cost(prices: RegionPrices, stack: Sequence[Declared]) -> cost.StackCost:
    return cost.stack_cost(prices, stack, FACTS)


def plan_cost(region: str, plan: Plan) -> cost.StackCost:
    return stack_cost(load_prices(region), declared_in(plan))


def system_fit(stack: Sequence[Declared]) -> capacity.SystemFit | None:
    return capacity.system_fit(stack, FACTS)


def replacing_paths(resource_type: str, old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    return replacement.replacing_paths(resource_type, old, new, FACTS)


def plan_steps(old: Plan, new: Plan) -> list[steps.Step]:
    return steps.plan_steps(old, new, FACTS)


def preview_steps(preview: dict) -> list[steps.Step]:
    return steps.preview_steps(preview, FACTS)
