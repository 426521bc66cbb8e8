"""`policy`: the policy pack's settings, what the stack opens to the internet on purpose, and the
documentation placeholders `pulumi up` refuses."""

import ipaddress
import re
from typing import Any

from pydantic import (
    Field,
    model_validator,
)

from infra.core.config import Model, key_path

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
        "ceilings, USD per hour. Unset (1000), an edit that raises the ceiling more than 25 % "
        "over the plan before it is refused until the same change sets this.",
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


# Documentation values that the stack files ship as placeholders, wherever they appear in a value:
# a deployment with them would lock the real admins out of the cluster, pull images from a
# registry nobody runs, or give access entries and SSH to addresses nobody owns.
DOCUMENTATION_RANGES = {
    ipaddress.ip_network(cidr): rfc
    for cidr, rfc in (
        ("192.0.2.0/24", "RFC 5737"),
        ("198.51.100.0/24", "RFC 5737"),
        ("203.0.113.0/24", "RFC 5737"),
        ("2001:db8::/32", "RFC 3849"),
        ("3fff::/20", "RFC 9637"),
    )
}
# AWS's documentation accounts: 123456789012 throughout its guides, 111122223333, 444455556666
# and 777788889999 in its cross-account examples, 012345678901 in the Account Management
# reference, 987654321098 in ARC's cross-account example.
DOCUMENTATION_ACCOUNTS = (
    "123456789012",
    "111122223333",
    "444455556666",
    "777788889999",
    "012345678901",
    "987654321098",
)
ACCOUNT = re.compile(rf"(?<!\w)(?:{'|'.join(DOCUMENTATION_ACCOUNTS)})(?!\w)")
# RFC 2606's example domains and reserved top-level names (RFC 6761 keeps them out of real DNS):
# example.com, .net and .org and any name under .example, .test or .invalid.
DOMAIN = re.compile(
    r"(?<![\w.-])(?:[a-z0-9-]+\.)*(?:example\.(?:com|net|org)|[a-z0-9-]+\.(?:example|test|invalid))"
    r"(?![\w-]|\.[a-z0-9])",
    re.IGNORECASE,
)
# Candidates for an IPv4 or IPv6 address or CIDR inside a longer value; ip_network() decides.
ADDRESS = re.compile(
    r"(?<![\d.])\d{1,3}(?:\.\d{1,3}){3}(?:/\d{1,2})?(?!\.?\d)"
    r"|(?<![\w:])[0-9a-f]{0,4}(?::[0-9a-f]{0,4}){2,7}(?:/\d{1,3})?(?![\w:])",
    re.IGNORECASE,
)


def _documentation_range(found: str) -> str | None:
    """The RFC reserving the documentation range `found` (an address or CIDR) lies in, or None."""
    try:
        network = ipaddress.ip_network(found, strict=False)
    except ValueError:
        return None
    return next(
        (
            rfc
            for doc, rfc in DOCUMENTATION_RANGES.items()
            if doc.version == network.version and network.subnet_of(doc)
        ),
        None,
    )


def _placeholder(value: Any) -> str | None:
    """Why `value` is a documentation placeholder, else None."""
    if isinstance(value, ipaddress.IPv4Address | ipaddress.IPv4Network):
        rfc = _documentation_range(str(value))
        return rfc and f"{value} is a documentation range ({rfc}); allowed: your own CIDRs"
    if not isinstance(value, str):
        return None
    for found in ADDRESS.findall(value):
        if rfc := _documentation_range(found):
            return f"{value} holds {found}, a documentation address ({rfc}); allowed: yours"
    if account := ACCOUNT.search(value):
        return f"{value} is in AWS's documentation account {account[0]}; allowed: your own account"
    if DOMAIN.search(value):
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


def placeholder_errors(config: Model) -> list[str]:
    """`key: message` per key anywhere in the stack holding a documentation placeholder (a range,
    an ARN of AWS's example account, an address at an example domain); `pulumi preview` and
    `pulumi up` refuse them, in every stack. The offline plan lists them and plans on."""
    dumped = config.model_dump(by_alias=True, exclude={"region"})
    return [
        f"{key_path(loc, dumped)}: {message}"
        for loc, value in _values(dumped)
        if (message := _placeholder(value))
    ]
