"""What the platform passes the CSI drivers' EKS add-ons (their configurationValues), and why. One
function serves the add-ons (infra/core/iam.py csi_driver_addon) and deploy.preflight, which
checks every key against the configuration schema EKS has for the pinned build: CreateAddon
refuses a key outside it.

Each driver's node agent is a DaemonSet that tolerates every taint, and its ServiceAccount may
patch every Node (its chart's node ClusterRole: the agent removes its own start-up taint). A
hybrid machine's owner holds the tokens of the pods on her machine, so such an agent must never
run there: with its token she could untaint and relabel any node, hers as a GPU pool included,
and draw other tenants' pods to it (infra/hybrid/tests/node_agent_rules.py lists every
DaemonSet's placement and node rights at the pins).

- EBS (kubernetes-sigs/aws-ebs-csi-driver): the node agent keeps off hybrid nodes by its chart's
  own affinity (`eks.amazonaws.com/compute-type NotIn [fargate, auto, hybrid]`), and from chart
  2.52.0 (driver v1.52.0, PR #2723) `node.serviceAccount.disableMutation` drops its `nodes:
  patch, list, watch` (charts/aws-ebs-csi-driver/templates/clusterrole-csi-node.yaml at
  helm-chart-aws-ebs-csi-driver-2.57.1), in the chart's values.schema.json, which the add-on's
  schema follows (PR #2286). Set where the build has it: the EKS user guide's RBAC hardening page
  recommends it unless the taint removal is used, and the platform's nodes carry no
  `ebs.csi.aws.com/agent-not-ready` start-up taint. Its controller goes to the system nodes.
- EFS (kubernetes-sigs/aws-efs-csi-driver v2.1.13, chart 3.2.4): the node agent keeps off hybrid
  nodes by its chart's affinity (`NotIn [fargate, hybrid]`); the same switch came with chart
  3.2.6 and driver v2.2.0, after the pinned build: nothing to pass.
- FSx (kubernetes-sigs/aws-fsx-csi-driver v1.7.0, chart 1.14.0 at 20b004e4): its node agent's
  affinity excludes only `fargate`, it tolerates every taint, and its role has `nodes: get,
  patch` and `pods: get, list, watch` cluster-wide with no switch (none up to v1.9.0). EKS does
  not support FSx on hybrid nodes (user guide, fsx-csi-create). So its affinity is passed with
  `hybrid` beside `fargate` (the chart's `node.affinity`): with FSx on, no machine runs it.
"""

import re

from infra.core.nodes import COMPUTE_TYPE, SYSTEM_NODE_LABEL

EBS_ADDON = "aws-ebs-csi-driver"
EFS_ADDON = "aws-efs-csi-driver"
FSX_ADDON = "aws-fsx-csi-driver"
# The first EBS driver whose chart (and add-on schema) has node.serviceAccount.disableMutation.
EBS_DISABLE_MUTATION_FROM = (1, 52, 0)
# Nodes no CSI node agent may run on: Fargate's (the charts' own exclusion) and hybrid machines.
NOT_ON = ["fargate", "hybrid"]
# Values the charts take whole (a Kubernetes object), not as settings of their own.
OPAQUE = {"affinity", "nodeSelector"}
NODE_AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": COMPUTE_TYPE, "operator": "NotIn", "values": NOT_ON}]}
            ]
        }
    }
}


def driver_version(build: str) -> tuple[int, int, int]:
    """`v1.57.1-eksbuild.1` -> (1, 57, 1): an add-on build carries its driver's version."""
    match = re.fullmatch(r"v(\d+)\.(\d+)\.(\d+)-eksbuild\.\d+", build)
    if match is None:
        raise ValueError(f"{build!r} is not an EKS add-on build (vX.Y.Z-eksbuild.N)")
    major, minor, patch = (int(part) for part in match.groups())
    return major, minor, patch


def addon_configuration(addon: str, build: str) -> dict | None:
    """The configurationValues of CSI add-on `addon` at `build`; None: nothing to pass."""
    if addon == EBS_ADDON:
        configuration: dict = {"controller": {"nodeSelector": SYSTEM_NODE_LABEL}}
        if driver_version(build) >= EBS_DISABLE_MUTATION_FROM:
            configuration["node"] = {"serviceAccount": {"disableMutation": True}}
        return configuration
    if addon == FSX_ADDON:
        return {"node": {"affinity": NODE_AFFINITY}}
    return None


def key_paths(values: dict, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every key path of `values` down to a value that is no object of settings: a toleration
    list or an affinity is one value to a schema's `properties`, checked as a whole."""
    paths = []
    for key, value in values.items():
        path = (*prefix, key)
        if isinstance(value, dict) and key not in OPAQUE:
            paths += key_paths(value, path)
        else:
            paths.append(path)
    return paths


def schema_lacks(schema: dict, path: tuple[str, ...]) -> bool:
    """Whether a JSON schema (an add-on's configuration schema) has no property at `path`."""
    for key in path:
        properties = schema.get("properties") or {}
        if key not in properties:
            return True
        schema = properties[key]
    return False
