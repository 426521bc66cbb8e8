"""The cost rules: the hourly ceiling of every priced resource stays under the stack's budget, and
an edit that raises it steeply says so by setting the budget in the same change."""

import math

from pulumi_policy import ReportViolation, StackValidationArgs

from infra.core.catalog import UnpricedError, load_prices
from infra.core.declared import Declared
from infra.integrations import classify, stack_cost
from policies.rules.base import config_of


def region_of(args: StackValidationArgs) -> str | None:
    """The policy config's `region`, else the stack's AWS provider's, else its subnets' AZs'."""
    regions = [config_of(args).get("region")]
    for r in args.resources:
        props = r.props or {}
        if r.resource_type == "pulumi:providers:aws":
            regions.append(props.get("region"))
        elif r.resource_type == "aws:ec2/subnet:Subnet" and props.get("availabilityZone"):
            regions.append(props["availabilityZone"][:-1])  # us-west-2a -> us-west-2
    return next(filter(None, regions), None)


def cost_budget(args: StackValidationArgs, report: ReportViolation) -> None:
    """The plan's cost table, priced by the same function: every priced resource counts."""
    budget = float(config_of(args)["budgetUsdPerHour"])
    stack = [
        Declared(
            r.urn,
            r.resource_type,
            r.name,
            r.props or {},
            tuple(d.urn for d in r.dependencies or []),
        )
        for r in args.resources
    ]
    if not any(classify(r.type) == "priced" for r in stack):
        return
    region = region_of(args)
    if region is None:
        report('no region to price the stack in: set "region" in the policy pack config')
        return
    try:
        cost = stack_cost(load_prices(region), stack)
    except UnpricedError as e:
        report(f"cannot price the stack: {e}")
        return
    for message in cost.unpriced:
        report(f"cannot price the stack: {message}")
    unbounded = [
        f"{line.item} ({line.detail})" for line in cost.lines if math.isinf(line.usd_per_hour)
    ]
    if unbounded:
        report(f"the cost has no ceiling: {', '.join(unbounded)}")
    elif cost.total_per_hour > budget:
        dearest = sorted(cost.lines, key=lambda line: -line.usd_per_hour)[:3]
        report(
            f"cost ceiling ${cost.total_per_hour:,.2f}/hour exceeds the budget ${budget:,.2f}/hour "
            f"(dearest: {', '.join(f'{line.item} ${line.usd_per_hour:,.2f}' for line in dearest)})"
        )


# How far an edit may raise the stack's cost ceiling over the plan before it while the stack file
# leaves policy.budgetUsdPerHour unset (the default budget is a backstop, far above a small
# stack): a typo in maxNodes or an instance type ten times dearer must not pass as an ordinary
# change.
CEILING_RISE = 1.25


def ceiling_rise(before_per_hour: float, after_per_hour: float, budget_set: bool) -> str | None:
    """The refusal of a rise over CEILING_RISE without a budget set in the stack file, or None."""
    unbounded = math.isinf(before_per_hour) or math.isinf(after_per_hour)  # cost_budget says so
    if budget_set or unbounded or after_per_hour <= before_per_hour * CEILING_RISE:
        return None
    times = after_per_hour / before_per_hour
    return (
        f"cost-budget: the cost ceiling rises from ${before_per_hour:,.2f} to "
        f"${after_per_hour:,.2f}/hour against the plan before (x{times:.1f}), more than "
        f"{CEILING_RISE - 1:.0%}, and the stack file sets no "
        "policy.budgetUsdPerHour; allowed: a smaller rise, or policy.budgetUsdPerHour set in this "
        f"change (at least {math.ceil(after_per_hour)})"
    )
