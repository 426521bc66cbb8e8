"""Run the CrossGuard rules over an offline plan, as `pulumi preview --policy-pack` runs them."""

from dataclasses import dataclass
from typing import Any

from pulumi_policy import (
    PolicyCustomTimeouts,
    PolicyResource,
    PolicyResourceOptions,
    ResourceValidationArgs,
    StackValidationArgs,
    StackValidationPolicy,
)
from pulumi_policy.proxy import unknown_checking_proxy

from infra.core.offline import Plan
from policies.rules import POLICIES


@dataclass(frozen=True)
class Violation:
    policy: str
    enforcement: str
    urn: str
    message: str

    def __str__(self) -> str:
        name = self.urn.rsplit("::", 1)[-1] if self.urn else "stack"
        return f"[{self.enforcement}] {self.policy}: {name}: {self.message}"


def options(protect: bool) -> PolicyResourceOptions:
    """The resource options a real preview hands the rules; the plan records `protect`."""
    return PolicyResourceOptions(protect, [], None, [], PolicyCustomTimeouts(0, 0, 0), [])


def check(plan: Plan, config: dict[str, Any] | None = None) -> list[Violation]:
    """Every violation of every rule in `plan`, with `config` as the policy pack config."""
    config = config or {}
    violations: list[Violation] = []

    def reporter(policy, default_urn: str):
        def report(message: str, urn: str | None = None) -> None:
            violations.append(
                Violation(policy.name, policy.enforcement_level.value, urn or default_urn, message)
            )

        return report

    # The same read-only proxies the policy server wraps inputs in, so rules meet here what they
    # meet in a real preview (a Mapping, not a dict; unknown values raise UnknownValueError).
    props = {r.urn: unknown_checking_proxy(r.inputs) for r in plan.resources}
    opts = {r.urn: options(r.protect) for r in plan.resources}
    policy_resources = {
        r.urn: PolicyResource(r.type, props[r.urn], r.urn, r.name, opts[r.urn], None, None, [], {})
        for r in plan.resources
    }
    for resource in plan.resources:
        policy_resources[resource.urn].parent = policy_resources.get(resource.parent)
        policy_resources[resource.urn].dependencies = [
            policy_resources[d] for d in resource.dependencies if d in policy_resources
        ]
    for policy in POLICIES:
        if isinstance(policy, StackValidationPolicy):
            policy.validate(
                StackValidationArgs(list(policy_resources.values()), config), reporter(policy, "")
            )
            continue
        for resource in plan.resources:
            args = ResourceValidationArgs(
                resource.type,
                props[resource.urn],
                resource.urn,
                resource.name,
                opts[resource.urn],
                None,
                config,
            )
            policy.validate(args, reporter(policy, resource.urn))
    return violations
