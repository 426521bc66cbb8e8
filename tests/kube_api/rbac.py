"""Who may do what: Kubernetes' request attributes and RBAC, written down from upstream.

Every function names the upstream file it follows (kubernetes/kubernetes, v1.35):

- request_info: staging/src/k8s.io/apiserver/pkg/endpoints/request/requestinfo.go
  (NewRequestInfo: the verb of a request from its method, path and query)
- Authorizer: plugin/pkg/auth/authorizer/rbac/rbac.go (RuleAllows) with the helpers of
  pkg/apis/rbac/v1/evaluation_helpers.go, and the binding walk of
  pkg/registry/rbac/validation/rule.go (VisitRulesFor, appliesToUser)
- BOOTSTRAP: plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go, the roles and bindings
  every cluster has for all authenticated users
- forbidden: staging/src/k8s.io/apiserver/pkg/endpoints/handlers/responsewriters/errors.go
  (forbiddenMessage) and staging/src/k8s.io/apimachinery/pkg/api/errors/errors.go (NewForbidden)
"""

import re
from dataclasses import dataclass
from urllib.parse import parse_qs

AUTHENTICATED = "system:authenticated"
# staging/src/k8s.io/apiserver/pkg/authentication/user/user.go: SystemPrivilegedGroup
MASTERS = "system:masters"


@dataclass(frozen=True)
class User:
    name: str
    groups: tuple[str, ...]


def user(name: str, groups: list[str] | tuple[str, ...] = ()) -> User:
    """An authenticated user: every authenticator adds system:authenticated."""
    return User(name, (*groups, AUTHENTICATED))


def service_account(namespace: str, name: str) -> User:
    """staging/src/k8s.io/apiserver/pkg/authentication/serviceaccount/util.go: UserInfo."""
    return user(
        f"system:serviceaccount:{namespace}:{name}",
        ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"],
    )


@dataclass(frozen=True)
class RequestInfo:
    path: str
    verb: str
    is_resource: bool = False
    api_group: str = ""
    api_version: str = ""
    namespace: str = ""
    resource: str = ""
    subresource: str = ""
    name: str = ""

    @property
    def qualified_resource(self) -> str:
        """schema.GroupResource.String(): `pods`, `devservers.dev.training-platform.io`."""
        return f"{self.resource}.{self.api_group}" if self.api_group else self.resource

    def with_verb(self, verb: str) -> "RequestInfo":
        return RequestInfo(**{**self.__dict__, "verb": verb})


_SPECIAL_VERBS = {"proxy", "watch"}
_NAMESPACE_SUBRESOURCES = {"status", "finalize"}
_METHOD_VERBS = {
    "POST": "create",
    "GET": "get",
    "HEAD": "get",
    "PUT": "update",
    "PATCH": "patch",
    "DELETE": "delete",
}


def request_info(method: str, path: str, query: str = "") -> RequestInfo:
    """requestinfo.go NewRequestInfo, with API prefixes `api` (groupless) and `apis`."""
    params = parse_qs(query, keep_blank_values=True)
    parts = [p for p in path.strip("/").split("/") if p]
    nonresource = RequestInfo(path=path, verb=method.lower())
    if len(parts) < 3 or parts[0] not in ("api", "apis"):
        return nonresource
    prefix, parts = parts[0], parts[1:]
    group = ""
    if prefix == "apis":
        if len(parts) < 3:
            return nonresource
        group, parts = parts[0], parts[1:]
    version, parts = parts[0], parts[1:]
    if parts[0] in _SPECIAL_VERBS:
        if len(parts) < 2:
            return nonresource  # upstream: an error, served as a non-resource request
        verb, parts = parts[0], parts[1:]
    else:
        verb = _METHOD_VERBS.get(method, "")
    namespace = ""
    if parts[0] == "namespaces":
        if len(parts) > 1:
            namespace = parts[1]
            if len(parts) > 2 and parts[2] not in _NAMESPACE_SUBRESOURCES:
                parts = parts[2:]
    resource = parts[0]
    name = parts[1] if len(parts) >= 2 else ""
    subresource = parts[2] if len(parts) >= 3 and verb != "proxy" else ""
    if not name and verb == "get":
        watch = params.get("watch", [None])[0]
        verb = "watch" if watch is not None and watch.lower() not in ("false", "0") else "list"
        # A list or watch of one object by field selector is authorized as that object.
        for term in params.get("fieldSelector", [""])[0].split(","):
            exact = re.fullmatch(r"metadata\.name==?([^=!].*)", term.strip())
            if exact:
                name = exact.group(1)
    if not name and verb == "delete":
        verb = "deletecollection"
    return RequestInfo(
        path=path,
        verb=verb,
        is_resource=True,
        api_group=group,
        api_version=version,
        namespace=namespace,
        resource=resource,
        subresource=subresource,
        name=name,
    )


def _rule(verbs, groups=None, resources=None, urls=None) -> dict:
    rule = {"verbs": verbs}
    if urls is not None:
        rule["nonResourceURLs"] = urls
    else:
        rule |= {"apiGroups": groups, "resources": resources}
    return rule


def _cluster_binding(role: str, groups: list[str]) -> dict:
    return {
        "kind": "ClusterRoleBinding",
        "metadata": {"name": role},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "Group", "name": g} for g in groups],
    }


# policy.go clusterRoles() and clusterRoleBindings(): what every authenticated user may do (the
# apiserver's own bootstrap; EKS adds its eks:* roles for its components, none for users), and
# cluster-admin for system:masters (the test's own administrator).
BOOTSTRAP = [
    {
        "kind": "ClusterRole",
        "metadata": {"name": "system:discovery"},
        "rules": [
            _rule(
                ["get"],
                urls=[
                    "/livez",
                    "/readyz",
                    "/healthz",
                    "/version",
                    "/version/",
                    "/openapi",
                    "/openapi/*",
                    "/api",
                    "/api/*",
                    "/apis",
                    "/apis/*",
                ],
            )
        ],
    },
    {
        "kind": "ClusterRole",
        "metadata": {"name": "system:basic-user"},
        "rules": [
            _rule(
                ["create"],
                ["authorization.k8s.io"],
                ["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
            ),
            _rule(["create"], ["authentication.k8s.io"], ["selfsubjectreviews"]),
        ],
    },
    {
        "kind": "ClusterRole",
        "metadata": {"name": "system:public-info-viewer"},
        "rules": [_rule(["get"], urls=["/livez", "/readyz", "/healthz", "/version", "/version/"])],
    },
    {
        "kind": "ClusterRole",
        "metadata": {"name": "cluster-admin"},
        "rules": [_rule(["*"], ["*"], ["*"]), _rule(["*"], urls=["*"])],
    },
    _cluster_binding("system:discovery", [AUTHENTICATED]),
    _cluster_binding("system:basic-user", [AUTHENTICATED]),
    _cluster_binding("system:public-info-viewer", [AUTHENTICATED, "system:unauthenticated"]),
    _cluster_binding("cluster-admin", [MASTERS]),
]


def _matches(allowed: list[str], wanted: str) -> bool:
    """VerbMatches and APIGroupMatches: an exact entry or `*`."""
    return "*" in allowed or wanted in allowed


def _resource_matches(allowed: list[str], resource: str, subresource: str) -> bool:
    """ResourceMatches: `*`, the exact `resource[/subresource]`, or `*/subresource`."""
    combined = f"{resource}/{subresource}" if subresource else resource
    return any(
        r == "*" or r == combined or (subresource and r == f"*/{subresource}") for r in allowed
    )


def _url_matches(allowed: list[str], path: str) -> bool:
    """NonResourceURLMatches: `*`, the exact path, or a prefix ending in `*`."""
    return any(
        u == "*" or u == path or (u.endswith("*") and path.startswith(u.rstrip("*")))
        for u in allowed
    )


def rule_allows(info: RequestInfo, rule: dict) -> bool:
    """rbac.go RuleAllows."""
    if not _matches(rule.get("verbs", []), info.verb):
        return False
    if not info.is_resource:
        return _url_matches(rule.get("nonResourceURLs", []), info.path)
    names = rule.get("resourceNames") or []
    return (
        _matches(rule.get("apiGroups", []), info.api_group)
        and _resource_matches(rule.get("resources", []), info.resource, info.subresource)
        and (not names or info.name in names)
    )


def _applies(subject: dict, who: User, binding_namespace: str) -> bool:
    """rule.go appliesToUser."""
    kind = subject.get("kind")
    if kind == "User":
        return subject["name"] == who.name
    if kind == "Group":
        return subject["name"] in who.groups
    if kind == "ServiceAccount":
        namespace = subject.get("namespace") or binding_namespace
        return (
            bool(namespace) and who.name == f"system:serviceaccount:{namespace}:{subject['name']}"
        )
    return False


class Authorizer:
    """RBAC over a fixed set of Roles, ClusterRoles and their bindings (manifests as dicts)."""

    def __init__(self, manifests: list[dict]):
        self.manifests = [*BOOTSTRAP, *manifests]

    def _role(self, kind: str, name: str, namespace: str) -> list[dict]:
        for m in self.manifests:
            meta = m["metadata"]
            if m["kind"] == kind and meta["name"] == name:
                if kind == "ClusterRole" or meta.get("namespace") == namespace:
                    return m.get("rules") or []
        return []  # upstream: a resolution error, which allows nothing

    def rules_for(self, who: User, namespace: str) -> list[dict]:
        """rule.go VisitRulesFor: ClusterRoleBindings everywhere, RoleBindings of `namespace`."""
        rules = []
        for m in self.manifests:
            meta = m["metadata"]
            if m["kind"] == "ClusterRoleBinding":
                scope = ""
            elif m["kind"] == "RoleBinding" and namespace and meta.get("namespace") == namespace:
                scope = namespace
            else:
                continue
            if any(_applies(s, who, scope) for s in m.get("subjects") or []):
                ref = m["roleRef"]
                rules += self._role(ref["kind"], ref["name"], scope)
        return rules

    def allows(self, who: User, info: RequestInfo) -> bool:
        return any(rule_allows(info, r) for r in self.rules_for(who, info.namespace))


def forbidden(who: User, info: RequestInfo, reason: str | None = None) -> dict:
    """The 403 Status the API server answers: responsewriters.Forbidden's message, or with
    `reason` (the connect check of pods/exec, attach, portforward in
    pkg/registry/core/pod/rest/authorize.go passes the authorizer's reason, empty for RBAC)."""
    if reason is None:
        if not info.is_resource:
            reason = f'User "{who.name}" cannot {info.verb} path "{info.path}"'
        else:
            resource = f"{info.resource}/{info.subresource}" if info.subresource else info.resource
            scope = (
                f'in the namespace "{info.namespace}"' if info.namespace else "at the cluster scope"
            )
            reason = (
                f'User "{who.name}" cannot {info.verb} resource "{resource}" '
                f'in API group "{info.api_group}" {scope}'
            )
    if not info.is_resource:
        message = f"forbidden: {reason}"
    elif info.name:
        message = f'{info.qualified_resource} "{info.name}" is forbidden: {reason}'
    else:
        message = f"{info.qualified_resource} is forbidden: {reason}"
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "Forbidden",
        "details": {"name": info.name, "group": info.api_group, "kind": info.resource},
        "code": 403,
    }
