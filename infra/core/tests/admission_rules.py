"""How the API server applies a ValidatingAdmissionPolicy to one request, written down from the
Kubernetes API reference (admissionregistration.k8s.io/v1, ValidatingAdmissionPolicySpec) and
docs (reference/access-authn-authz/validating-admission-policy), with the CEL evaluated for real
by cel-python:

- the policy applies to a request its matchConstraints match (resource, operation; for a
  namespaced object, the namespaceSelector against the namespace's labels) and for which every
  matchCondition is true; a resourceRule's "*" matches any group or resource, never a
  subresource (`nodes` does not match a request to `nodes/status`: _resource_names);
- `object` is the new object (null on DELETE), `oldObject` the existing one (null on CREATE),
  `request` the AdmissionRequest (its userInfo: username, groups), `namespaceObject` the
  namespace of a namespaced object (null for cluster-scoped ones), `variables` the policy's
  variables, each evaluated from those before it;
- the request is admitted only if every validation is true; with failurePolicy Fail (the
  policies here), an expression that errors denies it too.
"""

from functools import cache

import celpy
from celpy import celtypes

ENV = celpy.Environment()


@cache
def _program(expression: str):
    return ENV.program(ENV.compile(expression))


def _evaluate(expression: str, activation: dict):
    try:
        return _program(expression).evaluate(activation)
    except celpy.CELEvalError as error:
        return error


def _names(listed: list[str], name: str) -> bool:
    return name in listed or "*" in listed


def _resource_names(listed: list[str], requested: str) -> bool:
    """A rule's resources against `requested` (`nodes`, or `nodes/status` for a subresource):
    "'*' means all resources, but not subresources. 'pods/*' means all subresources of pods.
    '*/scale' means all scale subresources. '*/*' means all resources and their subresources"
    (API reference, admissionregistration.k8s.io/v1 NamedRuleWithOperations.resources)."""
    resource, _, sub = requested.partition("/")
    for entry in listed:
        want_resource, _, want_sub = entry.partition("/")
        if want_resource not in ("*", resource):
            continue
        if (want_sub or "") == sub or (sub and want_sub == "*"):
            return True
    return False


def _matches_labels(selector: dict, labels: dict) -> bool:
    """A LabelSelector's matchLabels and matchExpressions (In, NotIn, Exists, DoesNotExist)."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator = expression["key"], expression["operator"]
        values = expression.get("values", [])
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[operator]
        if not ok:
            return False
    return True


def refusals(
    policy: dict,
    operation: str,
    obj: dict | None,
    old: dict | None = None,
    username: str = "",
    groups: tuple[str, ...] = (),
    namespace: dict | None = None,
    resource: tuple[str, str] | None = None,
    name: str = "",
) -> list[str] | None:
    """None if the policy does not apply to the request; else the messages of the validations
    that refuse it (an empty list: admitted). `resource`: the (group, plural) requested; None
    takes `obj` for one the policy's rules name. `name`: the request's (the object's, or for a
    subresource such as pods/exec, its pod's)."""
    spec = policy
    rules = spec["matchConstraints"]["resourceRules"]
    if not any(
        operation in rule["operations"]
        and (resource is None or _names(rule["apiGroups"], resource[0]))
        and (resource is None or _resource_names(rule["resources"], resource[1]))
        for rule in rules
    ):
        return None
    selector = spec["matchConstraints"].get("namespaceSelector")
    if selector is not None and namespace is not None:
        if not _matches_labels(selector, namespace["metadata"].get("labels", {})):
            return None
    request = {
        "userInfo": {"username": username, "groups": list(groups)},
        "operation": operation,
        "name": name,
    }
    activation = {
        "object": celpy.json_to_cel(obj),
        "oldObject": celpy.json_to_cel(old),
        "request": celpy.json_to_cel(request),
        "namespaceObject": celpy.json_to_cel(namespace),
    }
    for condition in spec.get("matchConditions", []):
        result = _evaluate(condition["expression"], activation)
        if not (isinstance(result, celtypes.BoolType) and result):
            return None
    variables = {}
    for variable in spec.get("variables", []):
        activation["variables"] = celtypes.MapType(variables)
        variables[celtypes.StringType(variable["name"])] = _evaluate(
            variable["expression"], activation
        )
    activation["variables"] = celtypes.MapType(variables)
    refused = []
    for validation in spec["validations"]:
        result = _evaluate(validation["expression"], activation)
        if not (isinstance(result, celtypes.BoolType) and result):
            refused.append(validation.get("message") or validation["expression"])
    return refused


def admitted(policy: dict, operation: str, obj: dict | None, **request) -> bool:
    found = refusals(policy, operation, obj, **request)
    return found is None or found == []
