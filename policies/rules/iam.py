"""IAM rules: no wildcards, no write on any resource, no broad managed policies, trust and Pod
Identity scoped to the cluster and its namespaces."""

from collections.abc import Iterable, Mapping
from typing import Any

from pulumi_policy import ResourceValidationArgs

from infra.core.declared import dig, listed
from policies.rules.base import allows, iam_statements, statements_of

READ_VERBS = ("Describe", "Get", "List", "BatchGet", "Search", "Lookup", "View")
BROAD_MANAGED_POLICIES = ("AdministratorAccess", "PowerUserAccess", "IAMFullAccess")
POD_IDENTITY_TAGS = (
    "aws:RequestTag/eks-cluster-name",
    "aws:RequestTag/kubernetes-namespace",
    "aws:RequestTag/kubernetes-service-account",
)


def no_star(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    for statement in iam_statements(props):
        actions = set(listed(statement.get("Action")))
        if (
            allows(statement)
            and {"*", "*:*"} & actions
            and "*" in listed(statement.get("Resource"))
        ):
            yield "IAM statement allows action * on resource *"


def service_wildcards(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    for statement in filter(allows, iam_statements(props)):
        wild = sorted(
            str(a)
            for a in listed(statement.get("Action"))
            if str(a) == "*" or str(a).endswith(":*")
        )
        if wild:
            yield f"IAM statement allows whole services: {', '.join(wild)}; name the actions"


def write_on_any_resource(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    for statement in filter(allows, iam_statements(props)):
        if "*" not in listed(statement.get("Resource")):
            continue
        writes = sorted(
            str(a)
            for a in listed(statement.get("Action"))
            if not str(a).split(":", 1)[-1].startswith(READ_VERBS)
        )
        if writes:
            yield f"IAM statement allows {', '.join(writes)} on Resource *; scope it to ARNs"


def not_action(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    documents = [props.get("assumeRolePolicy")] if args.resource_type == "aws:iam/role:Role" else []
    statements = iam_statements(props) + [s for d in documents for s in statements_of(d)]
    for statement in filter(allows, statements):
        inverted = [k for k in ("NotAction", "NotResource", "NotPrincipal") if k in statement]
        if inverted:
            yield f"Allow statement uses {', '.join(inverted)} (allows everything not listed)"


def broad_managed(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    arns = listed(props.get("policyArn")) + listed(props.get("managedPolicyArns"))
    for arn in map(str, arns):
        name = arn.rsplit("/", 1)[-1]
        if name in BROAD_MANAGED_POLICIES or name.endswith("FullAccess"):
            yield f"broad managed policy {name} attached; grant the actions the role needs"


def trust_principals(props: Mapping) -> list[tuple[Mapping, Any]]:
    return [
        (s, s.get("Principal")) for s in statements_of(props.get("assumeRolePolicy")) if allows(s)
    ]


def trust_wildcard(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    for _, principal in trust_principals(props):
        aws_principals = [principal] if principal == "*" else listed(dig(principal, "AWS"))
        if "*" in map(str, aws_principals):
            yield 'trust policy lets any AWS principal ("*") assume the role'


def pod_identity_scoped(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    for statement, principal in trust_principals(props):
        if "pods.eks.amazonaws.com" not in map(str, listed(dig(principal, "Service"))):
            continue
        equals = dig(statement, "Condition", "StringEquals") or {}
        missing = [k for k in POD_IDENTITY_TAGS if not equals.get(k)]
        if missing:
            yield (
                "Pod Identity trust must be conditioned on the cluster, namespace and service "
                f"account; missing {', '.join(missing)}"
            )


def queue_policy_scoped(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    for statement in filter(allows, statements_of(props.get("policy"))):
        if dig(statement, "Principal", "Service") is None:
            continue
        condition = statement.get("Condition") or {}
        keys = {k for block in condition.values() if isinstance(block, Mapping) for k in block}
        if not keys & {"aws:SourceArn", "aws:SourceAccount"}:
            yield "a service may send to the queue only on behalf of named sources (aws:SourceArn)"
