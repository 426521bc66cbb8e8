"""IAM's decision on one request, as the IAM User Guide states it, for tests of resource policies.

Written down from (IAM User Guide):
- "Policy evaluation logic" and "Policy evaluation for requests within a single account":
  every request is denied unless allowed; "An explicit deny in any of the policies overrides the
  allow"; "If either the identity-based policy or the resource-based policy within the same
  account allows the request and the other doesn't, the request is still allowed". A role's
  session is limited by a permissions boundary or session policy: the roles here have neither.
- "Cross-account policy evaluation logic": a principal of another account needs an allow in its
  own identity-based policy and in the resource-based policy.
- "AWS JSON policy elements: Principal": `"*"` or `{"AWS": "*"}` is everyone, anonymous requests
  included; a role's ARN stands for the sessions of that role; an account (its ID or
  `arn:...:root`) for the account's principals.
- "IAM JSON policy elements: Condition operators": "If the key that you specify in a policy
  condition is not present in the request context, the values do not match and the condition
  is false" (the negated operators are then true), except for `...IfExists` (true when the key is
  absent) and `Null` (which tests presence). Condition keys are case-insensitive, values of
  StringEquals case-sensitive, Bool compares "true"/"false".
- "IAM JSON policy elements: Condition", multiple keys or values: several operators, or several
  keys under one operator, are ANDed; several values for one key are ORed.
- Action names are case-insensitive and `*`/`?` wildcards match in Action, Resource, StringLike
  and ArnLike.
NotAction, NotResource and NotPrincipal are not used by the policies tested and are refused.
"""

import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

NEGATED = {"StringNotEquals", "StringNotLike", "ArnNotEquals", "ArnNotLike"}


@dataclass(frozen=True)
class Principal:
    """An authenticated caller: a role's session (`role_arn` its role) in `account`."""

    role_arn: str
    # The role's identity-based policies (documents).
    policies: tuple[Mapping, ...] = ()

    @property
    def account(self) -> str:
        return self.role_arn.split(":")[4]


@dataclass(frozen=True)
class Request:
    action: str
    resource: str
    principal: Principal | None  # None: anonymous
    context: Mapping[str, str] = field(default_factory=dict)


def _listed(value: Any) -> list:
    return value if isinstance(value, list) else [value]


def _glob(pattern: str, value: str, case: bool = True) -> bool:
    if not case:
        pattern, value = pattern.lower(), value.lower()
    return fnmatch.fnmatchcase(value, pattern)


def _principal_matches(element: Any, principal: Principal | None) -> bool:
    if element == "*":
        return True
    entries = [str(p) for p in _listed(element.get("AWS", []))]
    if "*" in entries:
        return True
    if principal is None:
        return False
    account = principal.account
    return any(
        entry == principal.role_arn or entry in (account, f"arn:aws:iam::{account}:root")
        for entry in entries
    )


def _condition_holds(operator: str, key: str, wanted: Any, context: Mapping[str, str]) -> bool:
    found = {k.lower(): v for k, v in context.items()}.get(key.lower())
    base = operator.removesuffix("IfExists")
    if base == "Null":
        return (found is None) == (str(_listed(wanted)[0]).lower() == "true")
    if found is None:
        return operator.endswith("IfExists") or base in NEGATED
    values = [str(v) for v in _listed(wanted)]
    if base == "Bool":
        matched = any(found.lower() == v.lower() for v in values)
    elif base in ("StringEquals", "StringNotEquals", "ArnEquals", "ArnNotEquals"):
        matched = found in values
    elif base in ("StringLike", "StringNotLike", "ArnLike", "ArnNotLike"):
        matched = any(_glob(v, found) for v in values)
    else:
        raise NotImplementedError(f"condition operator {operator}")
    return not matched if base in NEGATED else matched


def _applies(statement: Mapping, request: Request, resource_policy: bool) -> bool:
    for unsupported in ("NotAction", "NotResource", "NotPrincipal"):
        if unsupported in statement:
            raise NotImplementedError(unsupported)
    if resource_policy and not _principal_matches(statement["Principal"], request.principal):
        return False
    if not any(_glob(a, request.action, case=False) for a in _listed(statement["Action"])):
        return False
    if not any(_glob(r, request.resource) for r in _listed(statement.get("Resource", "*"))):
        return False
    return all(
        _condition_holds(operator, key, wanted, request.context)
        for operator, block in (statement.get("Condition") or {}).items()
        for key, wanted in block.items()
    )


def _matching(documents: Iterable[Mapping], request: Request, resource_policy: bool) -> list:
    return [
        s
        for document in documents
        for s in _listed(document.get("Statement", []))
        if _applies(s, request, resource_policy)
    ]


def allowed(request: Request, resource_policy: Mapping | None, resource_account: str) -> bool:
    """Whether IAM allows `request` on a resource of `resource_account` with `resource_policy`."""
    identity = _matching(request.principal.policies, request, False) if request.principal else []
    resource = _matching([resource_policy] if resource_policy else [], request, True)
    if any(s["Effect"] == "Deny" for s in identity + resource):
        return False
    identity_allows = any(s["Effect"] == "Allow" for s in identity)
    resource_allows = any(s["Effect"] == "Allow" for s in resource)
    if request.principal is None:
        return resource_allows
    if request.principal.account == resource_account:
        return identity_allows or resource_allows
    return identity_allows and resource_allows
