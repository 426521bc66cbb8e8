"""Kubernetes RBAC building blocks shared by the components that grant people and controllers
rights: rules, group subjects, bindings, and the verbs of reading and of connecting to pods."""

READ = ["get", "list", "watch"]
# The kubernetes client's exec and port-forward are websocket GETs, authorized as `get`; from
# Kubernetes 1.35 the API server also checks `create` on the upgrade (KEP-4006,
# AuthorizePodWebsocketUpgradeCreatePermission), the verb of the SPDY POST kubectl falls back to.
CONNECT = ["get", "create"]


def rule(groups: list[str], resources: list[str], verbs: list[str]) -> dict:
    return {"apiGroups": groups, "resources": resources, "verbs": verbs}


def group(name: str) -> dict:
    return {"kind": "Group", "name": name, "apiGroup": "rbac.authorization.k8s.io"}


def binding(cls, resource_name: str, metadata: dict, role: tuple[str, str], subjects, opts):
    """A RoleBinding or ClusterRoleBinding (`cls`) of `role` (kind, name) to `subjects`."""
    kind, name = role
    return cls(
        resource_name,
        metadata=metadata,
        role_ref={"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name},
        subjects=subjects,
        opts=opts,
    )
