"""Hybrid machines as tenant boundaries. A machine's owner is root on it and controls its kubelet
and its Cilium agent; a tenant writes her own pods. Neither gets a workload onto a machine whose
owner did not admit that workload's team or user, and no machine passes for an EC2 pool, the
system nodes or another machine.

Checked here against upstream's rules, written down below and cited: what a kubelet may set on its
own Node (the NodeRestriction admission plugin), where the scheduler may put a pod (its NodeAffinity
and TaintToleration filters), which ResourceFlavor Kueue may give a pod set (tests.
test_hybrid_jobs), and the platform's admission policies, whose CEL cel-python evaluates
(infra.core.tests.admission_rules). The pods are every pod template the dev stack with two machine
owners renders: every job's pod sets, every DevServer flavor's pod in every user's namespace, and
the system controllers'; the nodes are the platform's and every node a machine owner could make.
"""

import itertools
import json

import pytest

from devservers.api import OWNER_LABEL
from infra.core.nodes import MACHINE_LABEL, POOL_LABEL, SYSTEM_PLACEMENT
from infra.core.pods import SYSTEM_LABELS, SYSTEM_TAINT
from infra.core.tests.admission_rules import ENV, admitted, refusals
from infra.eks.facts import CLUSTER_ADDONS, EKS_ADDON
from infra.hybrid.admission import policies
from infra.hybrid.config import HybridConfig
from infra.hybrid.gateway import GATEWAY_GROUP
from infra.hybrid.machines import node_labels, node_taints
from infra.hybrid.tests import node_agent_rules
from infra.hybrid.tests.test_hybrid import HYBRID
from infra.hybrid.tests.test_hybrid_devservers import plan_of_values
from infra.hybrid.tests.test_hybrid_jobs import (
    MPIJOB,
    PYTORCHJOB,
    flavors,
    hybrid_values,
    kueue_may_assign,
)
from infra.kueue.queues import TEAM_LABEL
from infra.teams.access import POLICIES

NAMESPACE = "kubernetes:core/v1:Namespace"
DEVSERVER_FLAVOR = "kubernetes:dev.training-platform.io/v1alpha1:DevServerFlavor"
NODEPOOL = "kubernetes:karpenter.sh/v1:NodePool"
# DevServer flavors on the machines: alice's GPU, and bob's CPU box.
RTX = {"name": "rtx-1", "nodePool": "hybrid", "gpus": 1, "cpu": 12, "memoryGib": 48}
BOX = {"name": "bob-box", "nodePool": "hybrid", "cpu": 4, "memoryGib": 16}
FLAVORS = [{**RTX, "machine": "alice-4090"}, {**BOX, "machine": "bob-cpu"}]
CONFIG = HybridConfig.model_validate(HYBRID)
MACHINES = {m.name: m for m in CONFIG.machines}


# --- NodeRestriction: what a kubelet may set on its own Node ---------------------------------
# kubernetes plugin/pkg/admission/noderestriction/admission.go (admitNode, getForbiddenLabels;
# the copy stored in the index, commit 01467da7): on create and on update a node may set, change
# or remove no label in node-restriction.kubernetes.io or a subdomain of it, and no label in
# kubernetes.io or k8s.io (or a subdomain) that kubeletapis.IsKubeletLabel refuses; any taints
# at create (on update none may change); only the Node named after its own credentials.
# kubernetes/kubelet pkg/apis/well_known_labels.go at v0.35.0 (Kubernetes 1.35.0), with the
# keys of k8s.io/api core/v1 well_known_labels.go at v0.35.0:
KUBELET_LABELS = {
    "kubernetes.io/hostname",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "beta.kubernetes.io/instance-type",
    "node.kubernetes.io/instance-type",
    "kubernetes.io/os",
    "kubernetes.io/arch",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/arch",
}
KUBELET_LABEL_NAMESPACES = ("kubelet.kubernetes.io", "node.kubernetes.io")


def _namespace(key: str) -> str:
    return key.split("/", 1)[0] if "/" in key else ""


def _in_domain(namespace: str, domain: str) -> bool:
    return namespace == domain or namespace.endswith("." + domain)


def kubelet_may_set(key: str) -> bool:
    namespace = _namespace(key)
    if _in_domain(namespace, "node-restriction.kubernetes.io"):
        return False
    if _in_domain(namespace, "kubernetes.io") or _in_domain(namespace, "k8s.io"):
        return key in KUBELET_LABELS or any(
            _in_domain(namespace, allowed) for allowed in KUBELET_LABEL_NAMESPACES
        )
    return True


def test_the_noderestriction_rule_as_written_down():
    assert kubelet_may_set("training-platform/pool")  # what pools were selected by until now
    assert kubelet_may_set("karpenter.sh/nodepool")  # Karpenter's own: a kubelet may set it
    assert kubelet_may_set("kubernetes.io/hostname") and kubelet_may_set("node.kubernetes.io/x")
    assert not kubelet_may_set("node-role.kubernetes.io/gpu")
    assert not kubelet_may_set(POOL_LABEL) and not kubelet_may_set(MACHINE_LABEL)
    assert not kubelet_may_set("node-restriction.kubernetes.io/anything")


# --- the scheduler: where a pod may go --------------------------------------------------------


def tolerates(toleration: dict, taint: dict) -> bool:
    """k8s.io/api core/v1 toleration.go at v0.35.0, ToleratesTaint, with the comparison
    operators on (the machine owner's best case): an effect and a key, when given, must equal
    the taint's; Exists matches any value, Equal (or none) an equal one, Lt and Gt compare
    integers."""
    if toleration.get("effect") and toleration["effect"] != taint["effect"]:
        return False
    if toleration.get("key") and toleration["key"] != taint["key"]:
        return False
    operator = toleration.get("operator") or "Equal"
    value, against = toleration.get("value", ""), taint.get("value", "")
    if operator == "Exists":
        return True
    if operator == "Equal":
        return value == against
    if operator in ("Lt", "Gt") and value.isdigit() and against.isdigit():
        return int(against) < int(value) if operator == "Lt" else int(against) > int(value)
    return False


def taints_allow(pod: dict, node: dict) -> bool:
    """The TaintToleration filter (kubernetes pkg/scheduler/framework/plugins/tainttoleration/
    taint_toleration.go, Filter; FindMatchingUntoleratedTaint in kubernetes/component-helpers
    scheduling/corev1/helpers.go at v0.35.0): every NoSchedule and NoExecute taint of the node
    tolerated by one of the pod's tolerations."""
    return all(
        any(tolerates(t, taint) for t in pod.get("tolerations", []))
        for taint in node["spec"].get("taints", [])
        if taint["effect"] in ("NoSchedule", "NoExecute")
    )


def _requirement(labels: dict, requirement: dict) -> bool:
    """A NodeSelectorRequirement on labels (component-helpers nodeaffinity.go at v0.35.0,
    nodeSelectorRequirementsAsSelector, to apimachinery's label selector)."""
    key, operator, values = requirement["key"], requirement["operator"], requirement.get("values")
    if operator == "In":
        return key in labels and labels[key] in values
    if operator == "NotIn":
        return key not in labels or labels[key] not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    if key not in labels or not labels[key].isdigit():
        return False
    return (
        int(labels[key]) > int(values[0]) if operator == "Gt" else int(labels[key]) < int(values[0])
    )


def affinity_allows(pod: dict, node: dict) -> bool:
    """The NodeAffinity filter (component-helpers nodeaffinity.go at v0.35.0,
    GetRequiredNodeAffinity and Match): every nodeSelector label equal on the node, and, if the
    pod has required node affinity, one of its terms matched: all its matchExpressions on the
    labels and its matchFields (metadata.name, In or NotIn one value) on the node; an empty term
    matches nothing."""
    labels = node["metadata"].get("labels", {})
    if any(labels.get(k) != v for k, v in pod.get("nodeSelector", {}).items()):
        return False
    required = (
        (pod.get("affinity") or {})
        .get("nodeAffinity", {})
        .get("requiredDuringSchedulingIgnoredDuringExecution")
    )
    if required is None:
        return True
    fields = {"metadata.name": node["metadata"]["name"]}
    for term in required["nodeSelectorTerms"]:
        expressions, matched_fields = term.get("matchExpressions", []), term.get("matchFields", [])
        if not expressions and not matched_fields:
            continue
        if all(_requirement(labels, r) for r in expressions) and all(
            _requirement(fields, r) for r in matched_fields
        ):
            return True
    return False


def schedulable(pod: dict, node: dict) -> bool:
    return affinity_allows(pod, node) and taints_allow(pod, node)


# --- the stack: two owners, their jobs and flavors --------------------------------------------


@pytest.fixture(scope="module")
def plan():
    dev = hybrid_values()["training-platform:devServers"]
    # FSx on: its CSI node agent is the one whose chart would put it on the machines.
    values = hybrid_values(
        devServers={**dev, "flavors": [*dev["flavors"], *FLAVORS]},
        storage={"fsx": {"enabled": True}},
    )
    return plan_of_values(values)


@pytest.fixture(scope="module")
def admission(plan):
    found = {
        r.inputs["metadata"]["name"]: r.inputs["spec"]
        for r in plan.of_type(
            "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy"
        )
    }
    # Beside the hybrid policies, those every stack has (infra/teams/access.py).
    teams = {name: spec() for name, (_, spec) in POLICIES.items()}
    assert {name: found.pop(name) for name in teams} == teams
    assert found == policies(CONFIG, OWNER_LABEL)
    bindings = plan.of_type(
        "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding"
    )
    assert {
        b.inputs["spec"]["policyName"]: b.inputs["spec"]["validationActions"] for b in bindings
    } == {name: ["Deny"] for name in [*found, *teams]}
    return found


def namespaces(plan) -> dict[str, dict]:
    return {r.inputs["metadata"]["name"]: r.inputs for r in plan.of_type(NAMESPACE)}


def tenant_of(namespace: dict) -> tuple[str, str | None]:
    labels = namespace["metadata"]["labels"]
    return labels[TEAM_LABEL], labels.get(OWNER_LABEL)


def kueue_admitted(pod: dict, flavor_specs: dict) -> list[dict]:
    """The pod as each ResourceFlavor Kueue may give its pod set leaves it: the flavor's
    nodeLabels added to its nodeSelector, its tolerations to its tolerations (Kueue,
    pkg/podset/podset.go, Merge of the admission's node selector and tolerations)."""
    placed = []
    for spec in flavor_specs.values():
        if kueue_may_assign(spec, pod):
            placed.append(
                {
                    **pod,
                    "nodeSelector": {**pod.get("nodeSelector", {}), **spec.get("nodeLabels", {})},
                    "tolerations": [*pod.get("tolerations", []), *spec.get("tolerations", [])],
                }
            )
    return placed


def rendered_pods(plan) -> list[tuple[str, str, dict]]:
    """(what, namespace, pod spec) for every pod the stack's jobs, flavors and controllers make:
    jobs' pod sets in their team's namespace, each flavor's pod in each user's namespace (any
    user may name any flavor), the controllers on the system nodes."""
    specs = flavors(plan)
    pods = []
    for job in plan.of_type(PYTORCHJOB) + plan.of_type(MPIJOB):
        spec = job.inputs["spec"]
        sets = spec.get("pytorchReplicaSpecs") or spec["mpiReplicaSpecs"]
        for role, pod_set in sets.items():
            for placed in kueue_admitted(pod_set["template"]["spec"], specs):
                metadata = job.inputs["metadata"]
                pods.append((f"{metadata['name']} {role}", metadata["namespace"], placed))
    users = [n for n, ns in namespaces(plan).items() if OWNER_LABEL in ns["metadata"]["labels"]]
    for flavor in plan.of_type(DEVSERVER_FLAVOR):
        pod = {k: flavor.inputs["spec"][k] for k in ("nodeSelector", "tolerations")}
        for user, placed in itertools.product(users, kueue_admitted(pod, specs)):
            pods.append((f"flavor {flavor.inputs['metadata']['name']}", user, placed))
    pods.append(("controllers", "kube-system", dict(SYSTEM_PLACEMENT)))
    return pods


# --- the nodes: the platform's, and every one a machine's owner can make -----------------------

NODEADM = {
    "eks.amazonaws.com/compute-type": "hybrid",
    "eks.amazonaws.com/hybrid-credential-provider": "ssm",
}


def node(name: str, labels: dict, taints: list[dict], provider: str | None = None) -> dict:
    spec = {"taints": taints, "providerID": provider or f"eks-hybrid:///us-west-2/tp-dev/{name}"}
    return {"metadata": {"name": name, "labels": labels}, "spec": spec}


def platform_nodes(plan) -> list[tuple[str | None, dict]]:
    """(the hybrid machine it is, or None; the Node) for the nodes the platform makes: a node of
    each NodePool as Karpenter labels it, a system node, and each machine's node once the
    gateway has labelled it."""
    nodes = []
    for pool in plan.of_type(NODEPOOL):
        template = pool.inputs["spec"]["template"]
        labels = {
            **template["metadata"]["labels"],
            "karpenter.sh/nodepool": pool.inputs["metadata"]["name"],
            "kubernetes.io/os": "linux",
        }
        nodes.append(
            (
                None,
                node(
                    f"ip-10-20-0-{len(nodes)}",
                    labels,
                    template["spec"].get("taints", []),
                    f"aws:///us-west-2a/i-0{len(nodes):016x}",
                ),
            )
        )
    system = node("ip-10-20-9-9", dict(SYSTEM_LABELS), [SYSTEM_TAINT], "aws:///us-west-2a/i-09")
    nodes.append((None, system))
    for machine in CONFIG.machines:
        labels = {
            **node_labels(machine),
            **NODEADM,
            "kubernetes.io/hostname": f"mi-{machine.name}",
            POOL_LABEL: "hybrid",
            MACHINE_LABEL: machine.name,
        }
        nodes.append((machine.name, node(f"mi-{machine.name}", labels, node_taints(machine))))
    return nodes


def impostors(owner: str, nodes: list[tuple[str | None, dict]]) -> list[dict]:
    """Nodes `owner`'s machine could register as (mi-<owner>: the name its credentials give
    it): each other node's labels a kubelet may set, and all of them at once, with and without
    nodeadm's labels; with that node's taints, none, or the hybrid taint alone. Then each as the
    gateway leaves it: labelled as her machine (it matches her node by its credentials), or not
    yet."""
    settable = [
        ({k: v for k, v in n["metadata"]["labels"].items() if kubelet_may_set(k)}, n["spec"])
        for _, n in nodes
    ]
    everything = {k: v for labels, _ in settable for k, v in labels.items()}
    hybrid_taint = node_taints(MACHINES[owner])[0]
    made = []
    for labels, copied in [*settable, (everything, {"taints": []})]:
        for taints in (copied["taints"], [], [hybrid_taint]):
            for own, gateway in itertools.product(
                ({}, NODEADM), ({}, {POOL_LABEL: "hybrid", MACHINE_LABEL: owner})
            ):
                made.append(node(f"mi-{owner}", {**labels, **own, **gateway}, taints))
    return made


def registered(admission, candidate: dict) -> bool:
    """Whether the API server lets the machine's kubelet create the Node (the gateway's labels
    come after, from the gateway)."""
    labels = candidate["metadata"]["labels"]
    own = {k: v for k, v in labels.items() if k not in (POOL_LABEL, MACHINE_LABEL)}
    assert all(kubelet_may_set(k) for k in own)
    as_created = {**candidate, "metadata": {**candidate["metadata"], "labels": own}}
    return admitted(
        admission["hybrid-node-registration"],
        "CREATE",
        as_created,
        username=f"system:node:{candidate['metadata']['name']}",
    )


def machine_admits(machine: str, team: str, user: str | None) -> bool:
    return MACHINES[machine].admits(team, user)


def test_no_pod_lands_on_a_machine_its_owner_did_not_admit(plan, admission):
    spaces = {**namespaces(plan), "kube-system": None}
    pods = rendered_pods(plan)
    platform = platform_nodes(plan)
    cluster = list(platform)
    for owner in MACHINES:
        made = [n for n in impostors(owner, platform) if registered(admission, n)]
        assert made, owner
        cluster += [(owner, n) for n in made]
    landed, refused = set(), set()
    for what, namespace, pod in pods:
        space = spaces[namespace]
        if space is not None and not admitted(
            admission["machine-tolerations"], "CREATE", {"spec": pod}, namespace=space
        ):
            refused.add((what, namespace))
            continue
        for machine, candidate in cluster:
            if not schedulable(pod, candidate):
                continue
            if machine is not None:
                assert space is not None, (what, candidate)
                assert machine_admits(machine, *tenant_of(space)), (what, namespace, candidate)
                landed.add((what, namespace, machine))
    # Not vacuous: the hybrid pods do land on the machines that admit them...
    assert ("on-alice Worker", "team-a", "alice-4090") in landed
    assert ("on-both Worker", "team-a", "bob-cpu") in landed
    assert ("flavor rtx-1", "dev-alice", "alice-4090") in landed
    assert ("flavor bob-box", "dev-bob", "bob-cpu") in landed
    assert ("flavor bob-box", "dev-alice", "bob-cpu") in landed  # bob-cpu admits team-a
    # ...and a flavor on a machine that does not admit a user is refused in her namespace.
    assert ("flavor rtx-1", "dev-bob") in refused


# --- node agents: no ServiceAccount that may write Nodes on a machine --------------------------


def test_no_node_agent_that_may_write_nodes_runs_on_a_machine(plan):
    """A machine owner holds the tokens of the pods on her machine: an agent there whose
    ServiceAccount may patch Nodes would let her untaint and relabel any node (hers as a GPU
    pool), drawing other tenants' pods to it. Every add-on's DaemonSets, placed by their charts'
    defaults and the configuration the plan passes (node_agent_rules, cited), and every Helm
    release's, whose charts grant no Node writes at all."""
    addons = {a.inputs["addonName"]: a.inputs for a in plan.of_type(EKS_ADDON)}
    assert {*addons, *CLUSTER_ADDONS} <= set(node_agent_rules.ADDON_AGENTS)
    releases = {r.name for r in plan.of_type("kubernetes:helm.sh/v3:Release")}
    assert releases <= node_agent_rules.RELEASES_WITHOUT_NODE_WRITES, releases
    machines = [n for machine, n in platform_nodes(plan) if machine is not None]
    on_machines, writers = set(), set()
    for name in [*addons, *CLUSTER_ADDONS]:
        raw = addons.get(name, {}).get("configurationValues")
        configuration = json.loads(raw) if raw else {}
        for agent in node_agent_rules.ADDON_AGENTS[name]:
            if not agent.made(configuration):
                continue
            if agent.writes_nodes(configuration):
                writers.add(agent.daemonset)
            if any(schedulable(agent.pod(configuration), n) for n in machines):
                on_machines.add(agent.daemonset)
    assert not on_machines & writers, on_machines & writers
    # Not vacuous: the machines do run agents, and agents that may write Nodes exist.
    assert on_machines == {"kube-proxy", "eks-pod-identity-agent-hybrid"}
    assert writers == {"efs-csi-node", "fsx-csi-node", "eks-node-monitoring-agent"}
    # The releases' charts grant no Node write with the values the platform passes: the switches
    # that would add one stay off (node_agent_rules), and the EFA plugin keeps off the machines.
    values = {r.name: r.inputs["values"] for r in plan.of_type("kubernetes:helm.sh/v3:Release")}
    assert "annotateK8sNode" not in values["cilium"]
    assert "kubeRBACProxy" not in values.get("kube-prometheus-stack", {}).get(
        "prometheus-node-exporter", {}
    )
    plugin = values["nvidia-device-plugin"]
    assert not plugin.get("config") and not plugin.get("gfd", {}).get("enabled")
    efa = {"tolerations": values["aws-efa-k8s-device-plugin"]["tolerations"]}
    assert not any(taints_allow(efa, n) for n in machines)


def test_jobs_and_flavors_select_nodes_by_a_label_no_kubelet_sets(plan):
    """What keeps them off impostors whatever taints those carry: today's pool label,
    training-platform/pool, any kubelet may set on itself."""
    for what, _, pod in rendered_pods(plan):
        if what == "controllers":  # the system nodes' label: the registration policy guards it
            continue
        assert not all(kubelet_may_set(k) for k in pod["nodeSelector"]), what


def test_every_expression_of_the_policies_parses_as_cel(admission):
    """The messages included, which the evaluations above never need; the API server refuses a
    policy whose CEL does not compile."""
    for spec in admission.values():
        for item in (*spec.get("matchConditions", []), *spec["variables"], *spec["validations"]):
            for key in ("expression", "messageExpression"):
                if key in item:
                    ENV.compile(item[key])


# --- the registration policy itself --------------------------------------------------------------


def hybrid_node(**labels) -> dict:
    machine = MACHINES["bob-cpu"]
    return node("mi-0bob", {**NODEADM, **node_labels(machine), **labels}, node_taints(machine))


@pytest.mark.parametrize(
    ("change", "allowed"),
    [
        ({}, True),
        ({"training-platform/node-role": "system"}, False),  # the system nodes' selector
        ({"karpenter.sh/nodepool": "gpu-small"}, False),
        ({"training-platform/pool": "gpu-small"}, False),
        ({"eks.amazonaws.com/compute-type": "ec2"}, False),  # the VPC CNI's and CSI agents'
        ({"nvidia.com/gpu.present": "true"}, True),
    ],
)
def test_a_hybrid_node_registers_with_its_own_labels_only(admission, change, allowed):
    policy = admission["hybrid-node-registration"]
    candidate = hybrid_node(**change)
    assert admitted(policy, "CREATE", candidate, username="system:node:mi-0bob") is allowed
    # The same node by an EC2 node's credentials: not this policy's business.
    assert admitted(policy, "CREATE", candidate, username="system:node:ip-10-20-1-1.ec2.internal")


def test_a_hybrid_node_keeps_its_hybrid_label_taint_and_provider_id(admission):
    policy = admission["hybrid-node-registration"]
    user = {"username": "system:node:mi-0bob"}
    bare = hybrid_node()
    without_taint = {**bare, "spec": {**bare["spec"], "taints": []}}
    assert refusals(policy, "CREATE", without_taint, **user)
    # An EC2 node's provider ID would match that node's NodeClaim (Karpenter, the GPU
    # registration watcher); another hybrid node's is not its own.
    for provider in (
        "aws:///us-west-2a/i-0123456789abcdef0",
        "eks-hybrid:///us-west-2/tp-dev/mi-0a",
    ):
        spoofed = {**bare, "spec": {**bare["spec"], "providerID": provider}}
        assert refusals(policy, "CREATE", spoofed, **user), provider
    labels = dict(bare["metadata"]["labels"])
    del labels["eks.amazonaws.com/compute-type"]
    dropped = {**bare, "metadata": {**bare["metadata"], "labels": labels}}
    assert refusals(policy, "UPDATE", dropped, old=bare, **user)
    # Labels the gateway set stay as they are when the kubelet updates its Node.
    labelled = hybrid_node(**{POOL_LABEL: "hybrid", MACHINE_LABEL: "bob-cpu"})
    assert admitted(policy, "UPDATE", labelled, old=labelled, **user)


@pytest.mark.parametrize("subresource", ["nodes", "nodes/status"])
def test_a_hybrid_node_cannot_relabel_itself_through_its_status_either(admission, subresource):
    """The kubelet patches its Node's labels through nodes/<self>/status as well; a policy
    naming only `nodes` would never see those requests (a resource does not match its
    subresources)."""
    user = {"username": "system:node:mi-0bob"}
    bare = hybrid_node()
    labels = {**bare["metadata"]["labels"], "training-platform/node-role": "system"}
    labels.pop("eks.amazonaws.com/compute-type")
    rewritten = {**bare, "metadata": {**bare["metadata"], "labels": labels}}
    for name in ("hybrid-node-registration", "hybrid-gateway-node-labels"):
        rules = admission[name]["matchConstraints"]["resourceRules"]
        assert any(subresource in rule["resources"] for rule in rules), name
    found = refusals(
        admission["hybrid-node-registration"], "UPDATE", rewritten, old=bare,
        resource=("", subresource), **user,
    )  # fmt: skip
    assert found and any("compute-type=hybrid" in m for m in found)
    # The rule the fix rests on: named alone, `nodes` leaves the status subresource open.
    registration = admission["hybrid-node-registration"]
    (rule,) = registration["matchConstraints"]["resourceRules"]
    narrow = {
        **registration,
        "matchConstraints": {"resourceRules": [{**rule, "resources": ["nodes"]}]},
    }
    applies = refusals(narrow, "UPDATE", rewritten, old=bare, resource=("", subresource), **user)
    assert (applies is None) is (subresource == "nodes/status")


# A CSI node agent's token on an EC2 node (upstream: nodes patch, node_agent_rules), the node
# lifecycle controller, a cluster admin.
OTHERS = [
    {"username": "system:serviceaccount:kube-system:efs-csi-node-sa"},
    {"username": "system:serviceaccount:kube-system:node-controller"},
    {"username": "kubernetes-admin", "groups": ("system:masters",)},
]


def with_spec(candidate: dict, **spec) -> dict:
    return {**candidate, "spec": {**candidate["spec"], **spec}}


@pytest.mark.parametrize("subresource", ["nodes", "nodes/status"])
@pytest.mark.parametrize("who", range(len(OTHERS)))
def test_nobody_else_relabels_untaints_or_repoints_a_hybrid_node(admission, subresource, who):
    """Must hold: a hybrid node's labels, taints and provider ID against every requester but
    the gateway, on nodes and nodes/status alike."""
    policy, user = admission["hybrid-node-fields"], OTHERS[who]
    request = {"resource": ("", subresource), **user}
    before = hybrid_node(**{POOL_LABEL: "hybrid", MACHINE_LABEL: "bob-cpu"})
    labels = dict(before["metadata"]["labels"])
    labels.pop("eks.amazonaws.com/compute-type")
    platform = [t for t in before["spec"]["taints"] if t["key"].startswith("training-platform/")]
    assert len(platform) == 2  # the hybrid taint and the machine's
    attacks = [
        {**before, "metadata": {**before["metadata"], "labels": labels}},
        hybrid_node(**{POOL_LABEL: "gpu-small", MACHINE_LABEL: "bob-cpu"}),
        hybrid_node(**{POOL_LABEL: "hybrid", MACHINE_LABEL: "alice-4090"}),
        hybrid_node(**{POOL_LABEL: "hybrid", MACHINE_LABEL: "bob-cpu", **SYSTEM_LABELS}),
        with_spec(before, taints=[t for t in before["spec"]["taints"] if t not in platform]),
        with_spec(before, taints=[]),
        with_spec(before, providerID="aws:///us-west-2a/i-0123456789abcdef0"),
    ]
    for attack in attacks:
        assert refusals(policy, "UPDATE", attack, old=before, **request), attack
    # What others may still do: the node lifecycle controller's taints and labels, a cordon,
    # the node's conditions.
    unreachable = {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}
    beta = hybrid_node(
        **{POOL_LABEL: "hybrid", MACHINE_LABEL: "bob-cpu", "beta.kubernetes.io/arch": "amd64"}
    )
    for allowed in (
        with_spec(before, taints=[*before["spec"]["taints"], unreachable]),
        with_spec(before, unschedulable=True),
        beta,
        {**before, "status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}},
    ):
        assert refusals(policy, "UPDATE", allowed, old=before, **request) == [], allowed
    # Not this policy's: the node itself, the gateway, and EC2 nodes.
    assert (
        refusals(policy, "UPDATE", attacks[0], old=before, username="system:node:mi-0bob") is None
    )
    gateway = {"username": "gw", "groups": (GATEWAY_GROUP,)}
    assert refusals(policy, "UPDATE", attacks[1], old=before, **gateway) is None
    ec2 = node("ip-10-20-1-1.ec2.internal", {POOL_LABEL: "cpu"}, [])
    assert refusals(policy, "UPDATE", {**ec2, "metadata": {**ec2["metadata"], "labels": {}}},
                    old=ec2, **request) is None  # fmt: skip


def test_the_gateway_changes_only_the_machine_labels_of_hybrid_nodes(admission):
    policy = admission["hybrid-gateway-node-labels"]
    gateway = {
        "username": "arn:aws:sts::123456789012:assumed-role/gw/i-0",
        "groups": (GATEWAY_GROUP,),
    }
    before = hybrid_node()
    labelled = hybrid_node(**{POOL_LABEL: "hybrid", MACHINE_LABEL: "bob-cpu"})
    assert admitted(policy, "UPDATE", labelled, old=before, **gateway)
    assert admitted(policy, "UPDATE", before, old=labelled, **gateway)  # taking them off
    for bad in (
        hybrid_node(**{POOL_LABEL: "gpu-small"}),
        hybrid_node(**{MACHINE_LABEL: "carol-3090"}),
        hybrid_node(**{"training-platform/node-role": "system"}),
        {**before, "spec": {**before["spec"], "taints": []}},
    ):
        assert refusals(policy, "UPDATE", bad, old=before, **gateway), bad
    ec2 = node("ip-10-20-1-1.ec2.internal", {POOL_LABEL: "cpu"}, [])
    marked = node("ip-10-20-1-1.ec2.internal", {POOL_LABEL: "hybrid", MACHINE_LABEL: "bob-cpu"}, [])
    assert refusals(policy, "UPDATE", marked, old=ec2, **gateway)


# --- a tenant's own pods ------------------------------------------------------------------------

TENANT_TOLERATIONS = [
    [{"operator": "Exists"}],
    [{"key": "training-platform/machine", "operator": "Exists"}],
    [{"key": "training-platform/machine", "value": "alice-4090", "effect": "NoSchedule"}],
    [{"key": "training-platform/machine", "operator": "Equal", "value": "alice-4090"}],
    [{"key": "training-platform/machine", "operator": "Gt", "value": "0"}],
    [{"key": "training-platform/machine", "value": "alice-4090", "effect": "NoExecute"}],
    [{"key": "training-platform/machine", "value": "bob-cpu"}],
]


@pytest.mark.parametrize("tolerations", TENANT_TOLERATIONS)
def test_a_tenants_own_pod_never_runs_on_a_machine_that_does_not_admit_her(
    plan, admission, tolerations
):
    """Whatever tolerations and selectors a tenant writes into her own pods (a job of her own in
    her team's namespace): if the API server admits the pod, it lands on no machine that does
    not admit her namespace."""
    spaces = namespaces(plan)
    cluster = platform_nodes(plan)
    for name, space in spaces.items():
        if TEAM_LABEL not in space["metadata"]["labels"]:
            continue
        for machine in MACHINES:
            pod = {
                "nodeSelector": {MACHINE_LABEL: machine},
                "tolerations": [
                    {**node_taints(MACHINES[machine])[0], "operator": "Equal"},
                    *tolerations,
                ],
            }
            if not admitted(
                admission["machine-tolerations"], "CREATE", {"spec": pod}, namespace=space
            ):
                continue
            for owner, candidate in cluster:
                if owner is not None and schedulable(pod, candidate):
                    assert machine_admits(owner, *tenant_of(space)), (name, tolerations)


def test_an_update_cannot_add_a_toleration_the_namespace_may_not_have(plan, admission):
    space = namespaces(plan)["dev-bob"]
    before = {"spec": {"tolerations": []}}
    after = {"spec": {"tolerations": [{"key": "training-platform/machine", "value": "alice-4090"}]}}
    assert refusals(admission["machine-tolerations"], "UPDATE", after, old=before, namespace=space)
    assert admitted(admission["machine-tolerations"], "UPDATE", before, old=before, namespace=space)


# --- CiliumNodes ---------------------------------------------------------------------------------


def cilium_node(cidrs: list[str] | None) -> dict:
    spec = {"addresses": [{"type": "InternalIP", "ip": "10.200.0.3"}]}
    if cidrs is not None:
        spec["ipam"] = {"podCIDRs": cidrs}
    return {"metadata": {"name": "mi-0bob"}, "spec": spec}


def test_only_the_cilium_operator_sets_pod_cidrs(admission):
    policy = admission["ciliumnode-pod-cidrs"]
    agent = {"username": "system:serviceaccount:kube-system:cilium"}
    operator = {"username": "system:serviceaccount:kube-system:cilium-operator"}
    fresh, given = cilium_node(None), cilium_node(["10.201.9.0/24"])
    # The agent creates its CiliumNode without pod CIDRs and keeps them as the operator set them.
    assert admitted(policy, "CREATE", fresh, **agent)
    assert admitted(policy, "UPDATE", given, old=given, **agent)
    assert admitted(policy, "UPDATE", given, old=fresh, **operator)
    # An agent (any node's, as their credentials go) claims or moves a slice: refused.
    assert refusals(policy, "CREATE", given, **agent)
    assert refusals(policy, "UPDATE", cilium_node(["10.201.7.0/24"]), old=given, **agent)
    assert refusals(policy, "UPDATE", cilium_node([]), old=given, **agent)
    assert json.dumps(policy).count("cilium-operator") == 1
