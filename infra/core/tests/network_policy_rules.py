"""Who may open a connection to a pod under networking.k8s.io/v1 NetworkPolicies (ingress), as
the Kubernetes API reference and the concepts page state it, for tests that compute reachability
from rendered policies.

Written down from the API reference (kubernetes.io/docs/reference/kubernetes-api/
policy-resources/network-policy-v1/; the same descriptions as the OpenAPI schema, which the
generated types of pulumi_kubernetes.networking.v1 carry):
- NetworkPolicySpec.podSelector "selects the pods to which this NetworkPolicy object applies ...
  An empty selector matches all pods in the policy's namespace."
- NetworkPolicySpec.ingress: "Traffic is allowed to a pod if there are no NetworkPolicies
  selecting the pod (and cluster policy otherwise allows the traffic), OR if the traffic source
  is the pod's local node, OR if the traffic matches at least one ingress rule across all of the
  NetworkPolicy objects whose podSelector matches the pod. If this field is empty then this
  NetworkPolicy does not allow any traffic".
- NetworkPolicySpec.policyTypes: if not specified, "all policies (whether or not they contain an
  ingress section) are assumed to affect ingress"; a policy with policyTypes [Egress] does not.
- NetworkPolicyIngressRule: "The traffic must match both ports and from." `from`: "If this field
  is empty or missing, this rule matches all sources ... If this field is present and contains
  at least one item, this rule allows traffic only if the traffic matches at least one item";
  `ports` likewise for ports.
- NetworkPolicyPeer: podSelector alone selects "the pods matching podSelector in the policy's
  own namespace"; namespaceSelector alone "all pods in the namespaces selected"; both, "the pods
  matching podSelector in the namespaces selected by namespaceSelector"; an empty selector
  selects all. ipBlock: a CIDR and `except` CIDRs "that should not be included".
- NetworkPolicyPort: protocol "defaults to TCP"; port "can either be a numerical or named port
  on a pod. If this field is not provided, this matches all port names and numbers"; endPort:
  "the range of ports from port to endPort ... inclusive".
- LabelSelector: "The result of matchLabels and matchExpressions are ANDed. An empty label
  selector matches all objects"; operators In, NotIn, Exists, DoesNotExist (NotIn also matches
  objects without the key: Labels and Selectors, set-based requirements).
From the concepts page (kubernetes.io/docs/concepts/services-networking/network-policies/):
"a pod cannot block access to itself"; "traffic to and from the node where a Pod is running is
always allowed"; policies "are additive". Every namespace carries the label
kubernetes.io/metadata.name with its name (Well-Known Labels, set by the API server).

Left by the API to the network plugin, decided here the way the VPC CNI does it (it matches
addresses): an ipBlock matches a source by its address, a pod's included; a source that is no
pod (a node, the control plane, a client outside) matches only ipBlocks.
"""

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


@dataclass(frozen=True)
class Endpoint:
    """A pod (namespace set) or an address that is no pod (a node, a client)."""

    name: str
    ip: str
    namespace: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    node: str | None = None  # the node a pod runs on; a node's own name
    named_ports: Mapping[str, int] = field(default_factory=dict)  # container ports by name


def selects(selector: Mapping | None, labels: Mapping[str, str]) -> bool:
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for requirement in selector.get("matchExpressions") or []:
        key, operator = requirement["key"], requirement["operator"]
        values = requirement.get("values") or []
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


def _in_block(block: Mapping, ip: str) -> bool:
    address = ipaddress.ip_address(ip)
    if address not in ipaddress.ip_network(block["cidr"]):
        return False
    return not any(address in ipaddress.ip_network(c) for c in block.get("except") or [])


def _peer_matches(
    peer: Mapping, policy_namespace: str, source: Endpoint, namespaces: Mapping[str, Mapping]
) -> bool:
    if "ipBlock" in peer:
        return _in_block(peer["ipBlock"], source.ip)
    if source.namespace is None:
        return False
    if "namespaceSelector" in peer:
        if not selects(peer["namespaceSelector"], namespaces[source.namespace]):
            return False
    elif source.namespace != policy_namespace:
        return False
    return "podSelector" not in peer or selects(peer["podSelector"], source.labels)


def _port_matches(entry: Mapping, destination: Endpoint, port: int, protocol: str) -> bool:
    if entry.get("protocol", "TCP") != protocol:
        return False
    if "port" not in entry:
        return True
    wanted = entry["port"]
    if isinstance(wanted, str):
        return destination.named_ports.get(wanted) == port
    return wanted <= port <= entry.get("endPort", wanted)


def affects_ingress(spec: Mapping) -> bool:
    return "Ingress" in spec.get("policyTypes", ["Ingress"])


def allowed(
    policies: Iterable[Mapping],
    namespaces: Mapping[str, Mapping[str, str]],
    source: Endpoint,
    destination: Endpoint,
    port: int,
    protocol: str = "TCP",
) -> bool:
    """Whether `source` may connect to `port` of pod `destination`. `policies`: NetworkPolicy
    manifests; `namespaces`: every namespace's labels (with kubernetes.io/metadata.name)."""
    if source.ip == destination.ip:
        return True
    if source.namespace is None and source.node == destination.node:
        return True
    selecting = [
        p
        for p in policies
        if p["metadata"]["namespace"] == destination.namespace
        and affects_ingress(p["spec"])
        and selects(p["spec"].get("podSelector", {}), destination.labels)
    ]
    if not selecting:
        return True
    return any(
        (
            not rule.get("from")
            or any(
                _peer_matches(peer, p["metadata"]["namespace"], source, namespaces)
                for peer in rule["from"]
            )
        )
        and (
            not rule.get("ports")
            or any(_port_matches(e, destination, port, protocol) for e in rule["ports"])
        )
        for p in selecting
        for rule in p["spec"].get("ingress") or []
    )
