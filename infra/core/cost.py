"""What a stack costs at list prices in its region, priced from the resources it declares.

One pricing path: the plan's cost table and the policy pack's budget rule both call stack_cost
on the declared resources (the plan's records offline, the engine's inputs in a real preview), so
an edit to the program or to stack config moves both alike.

Every resource type is one of three things (`classify`), as the integration that declares it says
(its `Kind`, infra/core/facts.py): priced by its pricer, free (with the reason), or usage-priced
(billed per GB or request, estimated from the stack's own jobs in infra/jobs/usage.py). A type that
is none of them is listed as unpriced, never counted as $0. Each priced line is one part of the
bill:
  floor     billed from `pulumi up` on, whether or not a job runs: what runs, at its size (the
            system node group at desiredSize, static NodePools, reservations, the control plane)
  headroom  what a node group may add above its desiredSize, up to maxSize (ceiling only)
  pool      a dynamic NodePool at limits.nodes of its dearest type (ceiling only)
  quota     claims of a storage class, and DevServer SSH load balancers, up to a ResourceQuota:
            billed only as they exist (a plan cannot know which a cluster will hold)
The floor plus everything else is the ceiling; infra/jobs/expected.py prices what lies between.
"""

from collections import Counter
from collections.abc import Sequence

from infra.core.bill import PriceBook, StackCost
from infra.core.catalog import RegionPrices, UnpricedError
from infra.core.declared import Declared
from infra.core.facts import Facts

# The program's own components group resources and create nothing themselves; `pulumi:` types are
# the engine's (the stack, providers).
COMPONENT_PREFIXES = ("training-platform:", "pulumi:")


def classify(kind: str, facts: Facts) -> str:
    """`priced`, `usage`, `free` or `unpriced`: what the plan does with a resource type."""
    known = facts.kind(kind)
    if known and known.price:
        return "priced"
    if known and known.usage:
        return "usage"
    if (known and known.free) or kind.startswith(COMPONENT_PREFIXES):
        return "free"
    return "unpriced"


def stack_cost(prices: RegionPrices, stack: Sequence[Declared], facts: Facts) -> StackCost:
    """Every priced resource of `stack` as a line of its part of the bill; what cannot be priced
    is named instead."""
    book = PriceBook(prices)
    lines, unpriced = [], []
    for kind in (k for k in facts.kinds.values() if k.price):
        for resource in (r for r in stack if r.type == kind.type):
            try:
                lines += kind.price(resource, stack, book)
            except UnpricedError as e:
                unpriced.append(f"{resource.name}: {e}")
    for integration in facts.integrations:
        if integration.stack_lines:
            try:
                lines += integration.stack_lines(stack, book, facts)
            except UnpricedError as e:
                unpriced.append(str(e))
    counts = Counter(r.type for r in stack)
    unpriced_types = [
        f"{kind} ({n}): no pricer, not known to be free"
        for kind, n in sorted(counts.items())
        if classify(kind, facts) == "unpriced"
    ]
    usage_types = sorted(kind for kind in counts if classify(kind, facts) == "usage")
    return StackCost(prices, lines, unpriced, unpriced_types, usage_types, book)
