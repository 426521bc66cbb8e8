"""`policy`: the policy pack's settings, what the stack opens to the internet on purpose, and the
documentation placeholders `pulumi up` refuses."""

import ipaddress
from typing import TYPE_CHECKING

from pydantic import (
    Field,
    model_validator,
)

from infra.config.base import Model, key_path

if TYPE_CHECKING:  # stack.py builds on this module
    from infra.config.stack import StackConfig

# Stacks whose mandatory guards no stack file can switch off: `policy.productionStacks` may add
# stacks to this list, never drop one.
MANDATORY_PRODUCTION_STACKS = ("prod",)


class PolicyConfig(Model):
    """Policy pack settings; a real preview takes the same keys via --policy-pack-config."""

    budget_usd_per_hour: float = Field(default=1000, gt=0, allow_inf_nan=False)
    allowed_public_ingress: list[str] = Field(default_factory=list)  # resource names
    production_stacks: list[str] = Field(default_factory=lambda: list(MANDATORY_PRODUCTION_STACKS))

    @model_validator(mode="after")
    def _guards_stay_on(self) -> "PolicyConfig":
        dropped = [s for s in MANDATORY_PRODUCTION_STACKS if s not in self.production_stacks]
        if dropped:
            raise ValueError(
                f"productionStacks leaves out {', '.join(dropped)}; allowed: a list that "
                f"includes {', '.join(MANDATORY_PRODUCTION_STACKS)} (a stack file may add "
                "production stacks, not switch their guards off)"
            )
        return self


HYBRID_GATEWAY = "hybrid-gateway"


def public_ingress_resources(config: "StackConfig") -> list[str]:
    """What this stack opens to the internet on purpose, by resource name: the WireGuard
    gateway's security group of the hybrid section. policy.allowedPublicIngress names these."""
    return [HYBRID_GATEWAY] if config.hybrid else []


# Documentation values (RFC 5737 networks, AWS's example account) that Pulumi.prod.yaml ships as
# placeholders: a real deployment with them would lock the real admins out of the cluster.
DOCUMENTATION_CIDRS = [
    ipaddress.IPv4Network(c) for c in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24")
]


DOCUMENTATION_ACCOUNT = "123456789012"


def placeholder_errors(config: "StackConfig") -> list[str]:
    """`key: message` per key still holding a documentation placeholder; the engine refuses them."""
    endpoint = ("cluster", "endpoint", "publicAccessCidrs")
    problems = [
        ((*endpoint, i), f"{cidr} is a documentation range (RFC 5737); allowed: your own CIDRs")
        for i, cidr in enumerate(config.cluster.endpoint.public_access_cidrs)
        if any(cidr.subnet_of(doc) for doc in DOCUMENTATION_CIDRS)
    ]
    problems += [
        (
            ("cluster", "adminPrincipalArns", i),
            f"{arn} is in AWS's documentation account {DOCUMENTATION_ACCOUNT}; "
            "allowed: a role or user of your account",
        )
        for i, arn in enumerate(config.cluster.admin_principal_arns)
        if f":{DOCUMENTATION_ACCOUNT}:" in arn
    ]
    return [f"{key_path(loc)}: {message}" for loc, message in problems]
