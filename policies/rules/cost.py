"""The cost rule: the hourly ceiling of every priced resource stays under the stack's budget."""

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
