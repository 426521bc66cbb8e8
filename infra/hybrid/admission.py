"""What the API server refuses around the hybrid machines (ValidatingAdmissionPolicies, GA since
Kubernetes 1.30; CEL over the request): four rules a machine owner, root on her machine and
holding its kubelet's and Cilium agent's credentials, or a tenant writing her own pods, would
otherwise break.

- hybrid-node-registration: a hybrid node (a request of its kubelet) registers and stays with
  the hybrid label EKS selects on (eks.amazonaws.com/compute-type=hybrid: the VPC CNI and the
  EBS and EFS CSI node agents keep off such nodes), the hybrid taint and a hybrid provider ID,
  and changes no label outside what its kubelet and nodeadm set. NodeRestriction already bars
  it from the node-restriction.kubernetes.io labels pods select by (node_pools.py); this keeps
  it from the rest: the system nodes' role label, Karpenter's, the GPU pools'. Its taints are
  fixed at registration (NodeRestriction refuses a node's own taint changes), but it may
  register again: the policy holds on create and update alike.
- hybrid-gateway-node-labels: the gateway (its IAM role's group) changes only the two labels it
  sets, POOL_LABEL=hybrid and MACHINE_LABEL=<a machine>, and only on hybrid nodes.
- hybrid-node-fields: nobody else changes a hybrid node's labels, platform taints or provider
  ID (a token of a node agent that may write Nodes, elsewhere in the cluster, included).
- machine-tolerations: a pod in a tenant namespace (one labelled with its team) tolerates a
  machine's taint only if that machine admits the namespace's team or user (its owner or allow).
  A machine whose owner keeps her taint on thus runs only the workloads she admitted, however a
  tenant writes her own pods.
- ciliumnode-pod-cidrs: only the Cilium operator sets a CiliumNode's pod CIDRs (in cluster-pool
  IPAM it allocates them; an agent leaves them as they are: cilium/cilium
  pkg/nodediscovery/nodediscovery.go, mutateNodeResource), so an agent's credentials, which may
  write every CiliumNode, cannot claim another node's pods for the gateway to route.

The request's user (request.userInfo) is the node's: EKS maps a hybrid node's IAM session to
`system:node:<session name>` (its HYBRID_LINUX access entry), the managed instance ID mi-<id>
with SSM, the certificate's CN (the machine's name) with IAM Roles Anywhere.
"""

import json

import pulumi
import pulumi_kubernetes as k8s

from infra.core.config import HYBRID_POOL
from infra.core.context import ClusterContext
from infra.core.nodes import COMPUTE_TYPE, GPU_NODE_LABELS, MACHINE_LABEL, POOL_LABEL
from infra.hybrid.config import HybridConfig
from infra.hybrid.gateway import GATEWAY_GROUP
from infra.hybrid.machines import HYBRID_NODE_LABELS, HYBRID_TAINT, MACHINE_TAINT_KEY
from infra.kueue.queues import TEAM_LABEL

# What a hybrid node's kubelet sets on its Node: its own labels (kubernetes/kubelet
# pkg/apis/well_known_labels.go at v0.35.0: those a kubelet may set in kubernetes.io; a
# hybrid node has no cloud provider to add zones or instance types), nodeadm's (aws/eks-hybrid
# v1.0.20 internal/kubelet/config.go, withHybridNodeLabels), and the machine's NodeConfig's
# (hybrid_machines.node_labels).
KUBELET_LABELS = (
    "kubernetes.io/hostname",
    "kubernetes.io/os",
    "kubernetes.io/arch",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/arch",
)
NODEADM_LABELS = (COMPUTE_TYPE, "eks.amazonaws.com/hybrid-credential-provider")
HYBRID_NODE_LABEL_KEYS = (
    *KUBELET_LABELS,
    *NODEADM_LABELS,
    *HYBRID_NODE_LABELS,
    *GPU_NODE_LABELS,
)
((ROLE_LABEL, HYBRID_ROLE),) = HYBRID_NODE_LABELS.items()
CILIUM_OPERATOR = "system:serviceaccount:kube-system:cilium-operator"


def resource_rules(group: str, resources: list[str], operations: list[str]) -> dict:
    """matchConstraints for `operations` on `resources` of `group`, every version. A resource
    does not match its subresources: each is named (admissionregistration/v1)."""
    rule = {"apiGroups": [group], "apiVersions": ["*"], "operations": operations}
    return {"resourceRules": [{**rule, "resources": resources}]}


# A kubelet writes its Node's labels through the object and through its status subresource
# (PATCH nodes/<self>/status: kubernetes pkg/kubelet/kubelet_node_status.go
# updateNodeStatus, and NodeRestriction admits a node's own status): both are held.
NODE_WRITES = ["nodes", "nodes/status"]


def cel(value) -> str:
    """A JSON value as a CEL literal: JSON strings, lists and maps are CEL's too."""
    return json.dumps(value, sort_keys=True)


def hybrid_node_name(config: HybridConfig, name: str) -> str:
    """Whether the node called `name` (a CEL string) is a hybrid machine's, by the names EKS
    gives them."""
    if config.credential_provider == "ssm":
        return f"{name}.startsWith('mi-')"
    return f"{name} in {cel([m.name for m in config.machines])}"


def hybrid_node(config: HybridConfig) -> str:
    """Whether the request is a hybrid node's own."""
    user = "request.userInfo.username"
    if config.credential_provider == "ssm":
        return f"{user}.startsWith('system:node:mi-')"
    return f"{user} in {cel([f'system:node:{m.name}' for m in config.machines])}"


LABELS = "object.metadata.labels"
# A label a request leaves as it was is not one it sets.
LABEL_VARIABLES = [
    {"name": "labels", "expression": f"has({LABELS}) ? {LABELS} : {{}}"},
    {
        "name": "oldLabels",
        "expression": "oldObject == null ? {} : has(oldObject.metadata.labels) ? "
        "oldObject.metadata.labels : {}",
    },
    {
        "name": "changed",
        "expression": "variables.labels.filter(k, !(k in variables.oldLabels) || "
        "variables.oldLabels[k] != variables.labels[k]) + variables.oldLabels.filter(k, "
        "!(k in variables.labels))",
    },
]


def node_registration_policy(config: HybridConfig) -> dict:
    taint = HYBRID_TAINT
    return {
        "failurePolicy": "Fail",
        "matchConstraints": resource_rules("", NODE_WRITES, ["CREATE", "UPDATE"]),
        "matchConditions": [{"name": "hybrid-node", "expression": hybrid_node(config)}],
        "variables": LABEL_VARIABLES,
        "validations": [
            {
                "expression": f"variables.changed.all(k, k in {cel(HYBRID_NODE_LABEL_KEYS)})",
                "messageExpression": "'a hybrid node sets only its kubelet\\'s and nodeadm\\'s "
                "labels, not ' + variables.changed.filter(k, !(k in "
                f"{cel(HYBRID_NODE_LABEL_KEYS)})).join(', ')",
            },
            {
                "expression": f"'{COMPUTE_TYPE}' in variables.labels && "
                f"variables.labels['{COMPUTE_TYPE}'] == 'hybrid'",
                "message": f"a hybrid node carries {COMPUTE_TYPE}=hybrid",
            },
            {
                "expression": f"!('{ROLE_LABEL}' in variables.labels) || "
                f"variables.labels['{ROLE_LABEL}'] == '{HYBRID_ROLE}'",
                "message": f"a hybrid node's {ROLE_LABEL} is {HYBRID_ROLE}",
            },
            # Its provider ID is nodeadm's (aws/eks-hybrid v1.0.20 internal/kubelet/config.go,
            # getHybridProviderId): not an EC2 instance's, by which Karpenter and the GPU
            # registration watcher match Nodes to their NodeClaims.
            {
                "expression": "has(object.spec.providerID) && "
                "object.spec.providerID.startsWith('eks-hybrid:///') && "
                "object.spec.providerID.endsWith('/' + object.metadata.name)",
                "message": "a hybrid node's provider ID is eks-hybrid:///<region>/<cluster>/<its "
                "name>",
            },
            {
                "expression": "has(object.spec.taints) && object.spec.taints.exists(t, "
                f"t.key == '{taint['key']}' && has(t.value) && t.value == '{taint['value']}' "
                f"&& t.effect == '{taint['effect']}')",
                "message": f"a hybrid node carries the taint "
                f"{taint['key']}={taint['value']}:{taint['effect']}",
            },
        ],
    }


# The labels the node lifecycle controller keeps on every node: the deprecated beta OS and
# architecture labels, copied from kubernetes.io/os and /arch (kubernetes pkg/controller/
# nodelifecycle/node_lifecycle_controller.go, labelReconcileInfo).
RECONCILED_LABELS = ("beta.kubernetes.io/os", "beta.kubernetes.io/arch")
PLATFORM_TAINTS = "{o}.spec.taints.filter(t, t.key.startsWith('training-platform/'))"
PROVIDER_ID = "(has({o}.spec.providerID) ? {o}.spec.providerID : '')"


def node_fields_policy(config: HybridConfig) -> dict:
    """Everyone but the node itself (node_registration_policy) and the gateway
    (gateway_labels_policy) leaves a hybrid node's labels, platform taints and provider ID as
    they are, on the Node and its status alike: a token that may write Nodes (a CSI node agent's
    on an EC2 node, a controller's) cannot turn a machine into a pool or the system nodes, or
    untaint it. Others' taints (the node lifecycle controller's unreachable and not-ready, an
    admin's cordon) and annotations stay theirs."""
    taints = "has({o}.spec.taints) ? " + PLATFORM_TAINTS + " : []"
    return {
        "failurePolicy": "Fail",
        "matchConstraints": resource_rules("", NODE_WRITES, ["UPDATE"]),
        "matchConditions": [
            {"name": "hybrid-node", "expression": hybrid_node_name(config, "object.metadata.name")},
            {"name": "not-the-node", "expression": f"!({hybrid_node(config)})"},
            {
                "name": "not-the-gateway",
                "expression": f"!('{GATEWAY_GROUP}' in request.userInfo.groups)",
            },
        ],
        "variables": [
            *LABEL_VARIABLES,
            {"name": "taints", "expression": taints.format(o="object")},
            {"name": "oldTaints", "expression": taints.format(o="oldObject")},
        ],
        "validations": [
            {
                "expression": f"variables.changed.all(k, k in {cel(RECONCILED_LABELS)})",
                "messageExpression": "'only the node and the gateway label a hybrid node, not ' "
                f"+ variables.changed.filter(k, !(k in {cel(RECONCILED_LABELS)})).join(', ')",
            },
            {
                "expression": "variables.taints == variables.oldTaints",
                "message": "only a hybrid node registers its training-platform/ taints",
            },
            {
                "expression": f"{PROVIDER_ID.format(o='object')} == "
                f"{PROVIDER_ID.format(o='oldObject')}",
                "message": "a hybrid node's provider ID stays nodeadm's",
            },
        ],
    }


def gateway_labels_policy(config: HybridConfig) -> dict:
    ours = cel([POOL_LABEL, MACHINE_LABEL])
    machines = cel([m.name for m in config.machines])
    return {
        "failurePolicy": "Fail",
        "matchConstraints": resource_rules("", NODE_WRITES, ["UPDATE"]),
        "matchConditions": [
            {"name": "gateway", "expression": f"'{GATEWAY_GROUP}' in request.userInfo.groups"}
        ],
        "variables": LABEL_VARIABLES,
        "validations": [
            {
                "expression": "object.spec == oldObject.spec",
                "message": "the gateway changes no node's spec",
            },
            {
                "expression": f"variables.changed.all(k, k in {ours})",
                "message": f"the gateway changes no node label but {POOL_LABEL} and "
                f"{MACHINE_LABEL}",
            },
            {
                "expression": f"!('{POOL_LABEL}' in variables.changed) || "
                f"!('{POOL_LABEL}' in variables.labels) || "
                f"variables.labels['{POOL_LABEL}'] == '{HYBRID_POOL}'",
                "message": f"the gateway sets {POOL_LABEL} to {HYBRID_POOL} only",
            },
            {
                "expression": f"!('{MACHINE_LABEL}' in variables.changed) || "
                f"!('{MACHINE_LABEL}' in variables.labels) || "
                f"variables.labels['{MACHINE_LABEL}'] in {machines}",
                "message": f"the gateway sets {MACHINE_LABEL} to a machine of the stack only",
            },
            {
                "expression": f"!variables.labels.exists(k, k in {ours} && k in variables.changed)"
                f" || {hybrid_node_name(config, 'object.metadata.name')}",
                "message": "the gateway labels hybrid nodes only",
            },
        ],
    }


def machine_tolerations_policy(config: HybridConfig, user_label: str) -> dict:
    """Kubernetes' toleration rule (k8s.io/api core/v1 toleration.go at v0.35.0,
    ToleratesTaint): an empty effect matches every effect, an empty key (with Exists) every key,
    Exists every value, Equal (or none) an equal value, Lt and Gt numeric values. Here Lt and
    Gt count as tolerating every machine, whatever its name."""
    tenants = cel({m.name: list(m.tenants()) for m in config.machines})
    namespace = "namespaceObject.metadata.labels"
    tolerates = (
        "(!has(t.effect) || t.effect == '' || t.effect == 'NoSchedule') && "
        "((!has(t.key) || t.key == '') ? (has(t.operator) && t.operator == 'Exists') : "
        f"(t.key == '{MACHINE_TAINT_KEY}' && ((has(t.operator) && !(t.operator in "
        "['', 'Equal'])) || (has(t.value) && t.value == m))))"
    )
    return {
        "failurePolicy": "Fail",
        "matchConstraints": {
            "namespaceSelector": {"matchExpressions": [{"key": TEAM_LABEL, "operator": "Exists"}]},
            **resource_rules("", ["pods"], ["CREATE", "UPDATE"]),
        },
        "variables": [
            {"name": "tenants", "expression": tenants},
            {
                "name": "namespaceTenants",
                "expression": f"['team:' + {namespace}['{TEAM_LABEL}']] + "
                f"('{user_label}' in {namespace} ? ['user:' + {namespace}['{user_label}']] "
                ": [])",
            },
            {
                "name": "closed",
                "expression": "variables.tenants.filter(m, !variables.tenants[m].exists(x, "
                "x in variables.namespaceTenants))",
            },
            {
                "name": "tolerations",
                "expression": "has(object.spec.tolerations) ? object.spec.tolerations : []",
            },
        ],
        "validations": [
            {
                "expression": "!variables.tolerations.exists(t, variables.closed.exists(m, "
                f"{tolerates}))",
                "messageExpression": "'the hybrid machines ' + variables.closed.filter(m, "
                f"variables.tolerations.exists(t, {tolerates})).join(', ') + ' do not admit "
                "this namespace: its pods may not tolerate their taints'",
            }
        ],
    }


def ciliumnode_policy() -> dict:
    cidrs = "has({o}.spec) && has({o}.spec.ipam) && has({o}.spec.ipam.podCIDRs) ? "
    return {
        "failurePolicy": "Fail",
        "matchConstraints": resource_rules("cilium.io", ["ciliumnodes"], ["CREATE", "UPDATE"]),
        "matchConditions": [
            {
                "name": "not-the-operator",
                "expression": f"request.userInfo.username != '{CILIUM_OPERATOR}'",
            }
        ],
        "variables": [
            {
                "name": "podCIDRs",
                "expression": cidrs.format(o="object") + "object.spec.ipam.podCIDRs : []",
            },
            {
                "name": "oldPodCIDRs",
                "expression": "oldObject == null ? [] : "
                + cidrs.format(o="oldObject")
                + "oldObject.spec.ipam.podCIDRs : []",
            },
        ],
        "validations": [
            {
                "expression": "variables.podCIDRs == variables.oldPodCIDRs",
                "message": "only the Cilium operator sets a CiliumNode's pod CIDRs",
            }
        ],
    }


def policies(config: HybridConfig, user_label: str) -> dict[str, dict]:
    """Policy name -> ValidatingAdmissionPolicy spec."""
    return {
        "hybrid-node-registration": node_registration_policy(config),
        "hybrid-gateway-node-labels": gateway_labels_policy(config),
        "hybrid-node-fields": node_fields_policy(config),
        "machine-tolerations": machine_tolerations_policy(config, user_label),
        "ciliumnode-pod-cidrs": ciliumnode_policy(),
    }


def hybrid_admission(
    owner: pulumi.Resource,
    config: HybridConfig,
    cluster: ClusterContext,
    user_label: str,
    after: pulumi.Resource,
) -> None:
    """The policies and their bindings (Deny), once Cilium's CRDs (`after`) exist."""
    for name, spec in policies(config, user_label).items():
        policy = k8s.admissionregistration.v1.ValidatingAdmissionPolicy(
            f"admission-{name}",
            metadata={"name": name},
            spec=spec,
            opts=cluster.in_cluster(owner, after),
        )
        k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding(
            f"admission-{name}",
            metadata={"name": name},
            spec={"policyName": name, "validationActions": ["Deny"]},
            opts=cluster.in_cluster(owner, policy),
        )
