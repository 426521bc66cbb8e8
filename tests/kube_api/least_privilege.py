"""What a controller's ServiceAccount may do by the plan's RBAC, and what it did on the local API:
a test of least privilege asserts the two are equal."""

from tests.kube_api.rbac import request_info

ROLE_TYPE = "kubernetes:rbac.authorization.k8s.io/v1:"


def used(api, account_name: str) -> set[tuple[str, str, str, str]]:
    """(namespace, group, resource, verb) of every request the account made."""
    found = set()
    for who, request in api.requests:
        if who != account_name:
            continue
        verb, path = request.split(" ", 1)
        info = request_info("GET", path)
        found.add((info.namespace, info.api_group, info.resource, verb))
    return found


def granted(plan, name: str, namespace: str) -> set[tuple[str, str, str, str]]:
    """(namespace, group, resource, verb) the plan's RBAC grants ServiceAccount `name` of
    `namespace` ("" namespace: cluster-wide, through a ClusterRoleBinding)."""
    account = {"kind": "ServiceAccount", "name": name, "namespace": namespace}
    found = set()
    for binding in plan.resources:
        kind = binding.type.rsplit(":", 1)[-1]
        if kind not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        if account not in binding.inputs.get("subjects", []):
            continue
        where = binding.inputs["metadata"].get("namespace", "")
        ref = binding.inputs["roleRef"]
        (role,) = [
            r
            for r in plan.of_type(f"{ROLE_TYPE}{ref['kind']}")
            if r.inputs["metadata"]["name"] == ref["name"]
            and r.inputs["metadata"].get("namespace", "") == where
        ]
        for rule in role.inputs["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    found |= {(where, group, resource, verb) for verb in rule["verbs"]}
    return found
