"""`policy`: the policy pack's settings, what the stack opens to the internet on purpose, and the
documentation placeholders `pulumi up` refuses."""

import ipaddress
import re
from typing import TYPE_CHECKING, Any

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
    """The policy pack's settings: make plan applies them offline; a real preview takes them
    from policies/policy-config.<stack>.json (python -m policies.pack_config writes it)."""

    budget_usd_per_hour: float = Field(
        default=1000,
        gt=0,
        allow_inf_nan=False,
        description="The cost-budget policy's ceiling: the plan's whole cost table at its "
        "ceilings, USD per hour.",
    )
    allowed_public_ingress: list[str] = Field(
        default_factory=list,
        description="Resources the stack opens to the internet on purpose, by name: only "
        "`hybrid-gateway` (with a hybrid section); never honoured in a production stack.",
    )
    production_stacks: list[str] = Field(
        default_factory=lambda: list(MANDATORY_PRODUCTION_STACKS),
        description="Stacks held to the production guards; may add stacks, always includes prod.",
    )

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


# Documentation values that the stack files ship as placeholders: the RFC 5737 networks, AWS's
# example account and the RFC 2606 example domains. A real deployment with them would lock the
# real admins out of the cluster, or give access entries and SSH to addresses nobody owns.
DOCUMENTATION_CIDRS = [
    ipaddress.IPv4Network(c) for c in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24")
]


DOCUMENTATION_ACCOUNT = "123456789012"


DOCUMENTATION_DOMAINS = ("example.com", "example.net", "example.org")


def _placeholder(value: Any) -> str | None:
    """Why `value` is a documentation placeholder, else None."""
    if isinstance(value, ipaddress.IPv4Address):
        value = ipaddress.IPv4Network(value)
    if isinstance(value, ipaddress.IPv4Network):
        if any(value.subnet_of(doc) for doc in DOCUMENTATION_CIDRS):
            return f"{value} is a documentation range (RFC 5737); allowed: your own CIDRs"
    elif isinstance(value, str):
        if re.fullmatch(rf"arn:aws[a-z-]*:iam::{DOCUMENTATION_ACCOUNT}:\S+", value):
            return (
                f"{value} is in AWS's documentation account {DOCUMENTATION_ACCOUNT}; "
                "allowed: a role or user of your account"
            )
        user, at, domain = value.rpartition("@")
        domain = domain.lower()
        if (
            user
            and at
            and any(domain == d or domain.endswith(f".{d}") for d in DOCUMENTATION_DOMAINS)
        ):
            return f"{value} is in a documentation domain (RFC 2606); allowed: a real address"
    return None


def _values(value: Any, loc: tuple = ()):
    """(location, value) of every leaf of a dumped config, lists and mappings walked through."""
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _values(child, (*loc, key))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            yield from _values(child, (*loc, i))
    else:
        yield loc, value


def placeholder_errors(config: "StackConfig") -> list[str]:
    """`key: message` per key anywhere in the stack holding a documentation placeholder (a range,
    an ARN of AWS's example account, an address at an example domain); `pulumi preview` and
    `pulumi up` refuse them, in every stack. The offline plan lists them and plans on."""
    dumped = config.model_dump(by_alias=True, exclude={"region"})
    return [
        f"{key_path(loc, dumped)}: {message}"
        for loc, value in _values(dumped)
        if (message := _placeholder(value))
    ]
