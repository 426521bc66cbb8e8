"""EKS Hybrid Nodes through the offline plan: cluster remote networks, IAM and credentials, the
WireGuard gateway, Kueue opt-in, and the per-machine pages; plus the `hybrid` config checks."""

import ast
import datetime
import hashlib
import ipaddress
import json
import re
import subprocess
import sys
from pathlib import Path

import pulumi
import pytest
from pulumi.runtime import settings
from pulumi.runtime.sync_await import _sync_await

from deploy import hybrid_bootstrap
from deploy.program import build_platform
from infra.core.config import ConfigError
from infra.core.nodes import MACHINE_LABEL, POOL_LABEL
from infra.core.offline import run_offline
from infra.hybrid.config import HybridConfig, SsmActivation
from infra.hybrid.gateway import wireguard_sources
from infra.hybrid.gateway_boot import (
    FORWARD_SCRIPT,
    KEY_PLACEHOLDER,
    SYNC_PROGRAM,
    SYNC_SETTINGS,
    GatewayNetworks,
    SyncTarget,
    forward_rules,
    sync_program,
    sync_units,
)
from infra.hybrid.machines import HYBRID_TAINT
from infra.hybrid.nodes import remote_nodes
from infra.stack.loading import parse_stack_config
from policies.offline import check
from tests.plugin import NO_DEV_SERVERS, plan_of, stack_values

HYBRID = {
    "remoteNodeCidrs": ["10.200.0.0/24"],
    "remotePodCidrs": ["10.201.0.0/16"],
    "ssmActivation": {"start": "2026-11-22", "days": 7},
    "machines": [
        {
            "name": "alice-4090",
            "address": "10.200.0.2",
            "gpus": 1,
            "gpuModel": "RTX 4090",
            "vcpu": 16,
            "memoryGib": 64,
            # Alice's, lent to her team's jobs (and its members' DevServers).
            "owner": "user:alice",
            "allow": ["team:team-a"],
        },
        # Bob's (of team research), lent to team-a too.
        {
            "name": "bob-cpu",
            "address": "10.200.0.3",
            "gpus": 0,
            "vcpu": 8,
            "memoryGib": 32,
            "owner": "user:bob",
            "allow": ["team:team-a"],
        },
    ],
}
CAROL = {
    "name": "carol-3090",
    "address": "10.200.0.4",
    "gpus": 1,
    "vcpu": 8,
    "memoryGib": 32,
    "owner": "team:research",
}
PRIVATE_ENDPOINT_OFF = {"endpoint": {"privateAccess": False}}
CA_PEM = "-----BEGIN CERTIFICATE-----\nMIIBofflineCA\n-----END CERTIFICATE-----\n"


@pytest.fixture(scope="module")
def hybrid_run():
    """The dev stack with HYBRID: its offline plan, and which hybrid exports are secret."""
    values = stack_values("dev", cluster=PRIVATE_ENDPOINT_OFF)
    values["training-platform:hybrid"] = HYBRID
    config = parse_stack_config(values, "Pulumi.dev.yaml")
    exports = {}

    def program():
        build_platform(config)
        exports.update(settings.get_root_resource().outputs)

    plan = run_offline(program, "dev", values)
    secret = {n: _sync_await(o.is_secret()) for n, o in exports.items() if n.startswith("hybrid")}
    return plan, secret


@pytest.fixture(scope="module")
def plan(hybrid_run):
    return hybrid_run[0]


def sections(config: str) -> list[dict[str, str]]:
    found = []
    for line in config.splitlines():
        if line.startswith("["):
            found.append({})
        elif "=" in line and not line.startswith("#") and found:
            key, _, value = line.partition("=")
            found[-1][key.strip()] = value.strip()
    return found


def test_cluster_gets_the_remote_networks():
    config = HybridConfig.model_validate(HYBRID)
    transform = remote_nodes(config).transform
    args = pulumi.ResourceTransformArgs(
        custom=True,
        type_="aws:eks/cluster:Cluster",
        name="cluster-eksCluster",
        props={"name": "tp-dev"},
        opts=pulumi.ResourceOptions(),
    )
    result = transform(args)
    assert result.props == {
        "name": "tp-dev",
        "remoteNetworkConfig": {
            "remoteNodeNetworks": {"cidrs": ["10.200.0.0/24"]},
            "remotePodNetworks": {"cidrs": ["10.201.0.0/16"]},
        },
    }
    other = pulumi.ResourceTransformArgs(
        custom=True, type_="aws:iam/role:Role", name="r", props={}, opts=pulumi.ResourceOptions()
    )
    assert transform(other) is None


def test_hybrid_node_role_access_entry_and_ssm_activation(plan):
    role = plan.one("aws:iam/role:Role", "hybrid-node")
    trust = json.loads(role.inputs["assumeRolePolicy"])["Statement"][0]
    assert trust["Principal"] == {"Service": "ssm.amazonaws.com"}
    assert trust["Condition"]["StringEquals"] == {"aws:SourceAccount": "123456789012"}
    inline = json.loads(plan.one("aws:iam/rolePolicy:RolePolicy", "hybrid-node").inputs["policy"])
    describe = next(s for s in inline["Statement"] if s["Action"] == "eks:DescribeCluster")
    assert describe["Resource"] == "arn:aws:eks:us-west-2:123456789012:cluster/tp-dev"
    # No machine may deregister, or list, another: nothing of SSM's beyond the managed policy.
    assert [s["Action"] for s in inline["Statement"]] == [
        "eks:DescribeCluster",
        "eks-auth:AssumeRoleForPodIdentity",
    ]
    attached = {
        r.inputs["policyArn"]
        for r in plan.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
        if r.name.startswith("hybrid-node-")
    }
    assert attached == {
        "arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryPullOnly",
        "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore",
    }
    entry = plan.one("aws:eks/accessEntry:AccessEntry", "hybrid-nodes")
    assert entry.inputs["type"] == "HYBRID_LINUX"
    assert re.fullmatch(
        r"arn:aws:iam::123456789012:role/hybrid-node-\w+", entry.inputs["principalArn"]
    )
    assert any(d.endswith("::hybrid-node") for d in entry.dependencies)
    # One activation per machine, each admitting one registration, named after its machine.
    activations = {r.name: r.inputs for r in plan.of_type("aws:ssm/activation:Activation")}
    assert set(activations) == {"hybrid-activation-alice-4090", "hybrid-activation-bob-cpu"}
    for machine in ("alice-4090", "bob-cpu"):
        activation = activations[f"hybrid-activation-{machine}"]
        assert activation["registrationLimit"] == 1
        assert activation["name"] == machine
        assert activation["tags"]["training-platform/machine"] == machine
        # Not SSM's silent 24 hours: start + days from the stack config, at 00:00 UTC.
        assert activation["expirationDate"] == "2026-11-29T00:00:00Z"
    # Each page carries its own machine's code.
    pages = plan.outputs["hybridBootstrap"]
    assert "activationId: hybrid-activation-alice-4090-" in pages["alice-4090"]
    assert "activationId: hybrid-activation-bob-cpu-" in pages["bob-cpu"]
    assert not plan.of_type("aws:rolesanywhere/trustAnchor:TrustAnchor")


def test_a_machine_cannot_read_the_gateways_key(plan):
    """AmazonSSMManagedInstanceCore grants ssm:GetParameter(s) on every parameter; an explicit
    Deny on the node role wins over it (IAM policy evaluation logic) for the gateway's key."""
    denied = json.loads(
        plan.one("aws:iam/rolePolicy:RolePolicy", "hybrid-node-denied").inputs["policy"]
    )
    (statement,) = denied["Statement"]
    key = plan.one("aws:ssm/parameter:Parameter", "hybrid-gateway-key")
    assert statement["Effect"] == "Deny"
    assert statement["Resource"].endswith(":hybrid-gateway-key")
    assert {"ssm:GetParameter", "ssm:GetParameters"} <= set(statement["Action"])
    assert key.inputs["type"] == "SecureString"


def test_hybrid_nodes_and_pods_reach_the_api_server_and_coredns_in_the_vpc(plan):
    """EKS user guide, "Prepare networking for hybrid nodes": HTTPS to the cluster from the remote
    node and pod CIDRs, and DNS (UDP and TCP 53) to where CoreDNS runs, the system nodes, which
    carry the cluster security group (a managed node group without its own groups gets it)."""
    rules = [
        r
        for r in plan.of_type("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")
        if r.name.startswith("hybrid-cluster-")
    ]
    # The cluster security group: the one tagged for Karpenter's nodes, the system nodes' too.
    cluster_sg = plan.one("aws:ec2/tag:Tag", "cluster-cluster-sg-discovery").inputs["resourceId"]
    assert {r.inputs["securityGroupId"] for r in rules} == {cluster_sg}
    by_cidr = {
        (r.inputs.get("cidrIpv4"), r.inputs["ipProtocol"], r.inputs["fromPort"], r.inputs["toPort"])
        for r in rules
    }
    assert by_cidr == {
        (cidr, protocol, port, port)
        for cidr in ("10.200.0.0/24", "10.201.0.0/16")
        for protocol, port in (("tcp", 443), ("udp", 53), ("tcp", 53))
    } | {(None, "tcp", 443, 443)}
    # The gateway itself, by its security group: it lists CiliumNodes (a private endpoint).
    gateway_rule = next(r for r in rules if "cidrIpv4" not in r.inputs)
    gateway_sg = plan.one("aws:ec2/securityGroup:SecurityGroup", "hybrid-gateway")
    assert gateway_rule.inputs["referencedSecurityGroupId"].startswith("sg-")
    assert gateway_sg.urn in gateway_rule.dependencies


def test_wireguard_gateway_is_open_on_udp_51820_only_and_routes_the_remote_cidrs(plan):
    group = plan.one("aws:ec2/securityGroup:SecurityGroup", "hybrid-gateway")
    public = [r for r in group.inputs["ingress"] if "0.0.0.0/0" in r["cidrBlocks"]]
    assert public == [
        {
            "protocol": "udp",
            "fromPort": 51820,
            "toPort": 51820,
            "cidrBlocks": ["0.0.0.0/0"],
            "description": "WireGuard from the machines",
        }
    ]
    # From the VPC: TCP (kubelets, pods) and path MTU discovery; no UDP, nothing else.
    others = [r for r in group.inputs["ingress"] if r not in public]
    assert {(r["protocol"], r["fromPort"], r["toPort"]) for r in others} == {
        ("tcp", 0, 65535),
        ("icmp", 3, 4),
    }
    assert {c for r in others for c in r["cidrBlocks"]} == {"10.20.0.0/16"}
    instance = plan.one("aws:ec2/instance:Instance", "hybrid-gateway")
    assert instance.inputs["sourceDestCheck"] is False
    assert instance.inputs["metadataOptions"]["httpTokens"] == "required"
    assert instance.inputs["rootBlockDevice"]["encrypted"] is True
    # The public subnet of the first AZ, where dev's single NAT gateway also sits.
    nat = plan.one("aws:ec2/natGateway:NatGateway")
    assert instance.inputs["subnetId"] == nat.inputs["subnetId"]
    assert instance.inputs["associatePublicIpAddress"] is True
    routes = plan.of_type("aws:ec2/route:Route")
    hybrid_routes = [r for r in routes if r.name.startswith("hybrid-route-")]
    # The public route table and each AZ's private one, for both remote CIDRs.
    assert len(hybrid_routes) == 3 * 2
    assert {r.inputs["destinationCidrBlock"] for r in hybrid_routes} == {
        "10.200.0.0/24",
        "10.201.0.0/16",
    }
    assert len({r.inputs["routeTableId"] for r in hybrid_routes}) == 3
    interfaces = {r.inputs["networkInterfaceId"] for r in hybrid_routes}
    assert len(interfaces) == 1 and interfaces.pop().startswith("eni-")
    eip = plan.one("aws:ec2/eip:Eip", "hybrid-gateway")
    assert eip.inputs["instance"].startswith("i-")


def test_wireguard_comes_only_from_the_machines_addresses_when_every_one_is_known():
    alice, bob = HYBRID["machines"]
    known = hybrid_plan(
        [{**alice, "publicAddress": "198.51.100.7"}, {**bob, "publicAddress": "203.0.113.99"}]
    )
    group = known.one("aws:ec2/securityGroup:SecurityGroup", "hybrid-gateway")
    (wireguard,) = [r for r in group.inputs["ingress"] if r["protocol"] == "udp"]
    assert wireguard["cidrBlocks"] == ["198.51.100.7/32", "203.0.113.99/32"]
    assert not [r for r in group.inputs["ingress"] if "0.0.0.0/0" in r["cidrBlocks"]]
    # One machine without a fixed address could not join from a restricted list: anywhere.
    partly = {**HYBRID, "machines": [{**alice, "publicAddress": "198.51.100.7"}, bob]}
    assert wireguard_sources(HybridConfig.model_validate(partly)) == ["0.0.0.0/0"]


def test_kueue_flavor_is_opt_in_and_the_device_plugin_reaches_hybrid_gpus(plan):
    flavor = next(
        r
        for r in plan.of_type("kubernetes:kueue.x-k8s.io/v1beta2:ResourceFlavor")
        if r.inputs["metadata"]["name"] == "hybrid"
    )
    assert flavor.inputs["spec"] == {
        "nodeLabels": {POOL_LABEL: "hybrid"},
        "nodeTaints": [HYBRID_TAINT],
    }
    queue = next(
        r
        for r in plan.of_type("kubernetes:kueue.x-k8s.io/v1beta2:ClusterQueue")
        if r.inputs["metadata"]["name"] == "platform"
    )
    flavors = queue.inputs["spec"]["resourceGroups"][0]["flavors"]
    assert flavors[-1] == {
        "name": "hybrid",
        "resources": [
            {"name": "cpu", "nominalQuota": "24"},
            {"name": "memory", "nominalQuota": "96Gi"},
            {"name": "nvidia.com/gpu", "nominalQuota": "1"},
        ],
    }
    # GPUs advertised and watched (the exporter of hybrid nodes is a release of its own: no node
    # monitoring agent, so no host engine, runs there)
    for agent in ("nvidia-device-plugin", "dcgm-exporter-hybrid"):
        release = plan.one("kubernetes:helm.sh/v3:Release", agent)
        assert {
            "key": HYBRID_TAINT["key"],
            "operator": "Exists",
            "effect": "NoSchedule",
        } in release.inputs["values"]["tolerations"]


def test_cilium_is_the_cni_of_hybrid_nodes_only(plan, dev_plan):
    cilium = plan.one("kubernetes:helm.sh/v3:Release", "cilium")
    assert cilium.inputs["chart"] == "oci://public.ecr.aws/eks/cilium/cilium"
    assert cilium.inputs["version"] == "1.18.5-0"
    assert cilium.inputs["namespace"] == "kube-system"
    values = cilium.inputs["values"]
    # The IPAM mode AWS supports on hybrid nodes (EKS user guide, "Configure CNI for hybrid
    # nodes"), pooled from the cluster's remote pod networks; no node sets its own podCIDR.
    assert values["ipam"] == {
        "mode": "cluster-pool",
        "operator": {
            "clusterPoolIPv4PodCIDRList": ["10.201.0.0/16"],
            "clusterPoolIPv4MaskSize": 24,
        },
    }
    assert "k8s" not in values
    terms = values["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [
        {
            "matchExpressions": [
                {"key": "eks.amazonaws.com/compute-type", "operator": "In", "values": ["hybrid"]}
            ]
        }
    ]
    assert values["tolerations"] == [{"operator": "Exists"}]  # HYBRID_TAINT among all others
    operator = values["operator"]
    assert operator["nodeSelector"] == {"training-platform/node-role": "system"}
    assert operator["tolerations"] == [
        {"key": "CriticalAddonsOnly", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert operator["replicas"] == 1
    assert operator["unmanagedPodWatcher"] == {"restart": False}
    assert values["envoy"] == {"enabled": False}
    assert values["image"]["repository"] == "public.ecr.aws/eks/cilium/cilium"
    assert values["image"]["useDigest"] and values["image"]["digest"].startswith("sha256:")
    assert operator["image"]["useDigest"] and operator["image"]["genericDigest"]
    # Installed once nodes, the Pod Identity agent and the hybrid nodes' access entry exist.
    assert {
        plan.one("aws:eks/nodeGroup:NodeGroup", "cluster-system").urn,
        plan.one("aws:eks/addon:Addon", "cluster-eks-pod-identity-agent").urn,
        plan.one("aws:eks/accessEntry:AccessEntry", "hybrid-nodes").urn,
    } <= set(cilium.dependencies)
    assert cilium.inputs["name"] == "cilium"
    agent = plan.one("aws:eks/addon:Addon", "cluster-eks-pod-identity-agent")
    assert json.loads(agent.inputs["configurationValues"]) == {
        "daemonsets": {"hybrid": {"create": True}}
    }
    dev_agent = dev_plan.one("aws:eks/addon:Addon", "cluster-eks-pod-identity-agent")
    assert "configurationValues" not in dev_agent.inputs
    assert not [r for r in dev_plan.of_type("kubernetes:helm.sh/v3:Release") if r.name == "cilium"]


def test_peer_configs_and_gateway_agree_and_bootstrap_pages_join_the_cluster(plan):
    peers, pages = plan.outputs["hybridPeerConfigs"], plan.outputs["hybridBootstrap"]
    assert set(peers) == set(pages) == {"alice-4090", "bob-cpu"}
    user_data = plan.one("aws:ec2/instance:Instance", "hybrid-gateway").inputs["userData"]
    (hub,) = sections(user_data.split("<<'WIREGUARD'\n")[1].split("\nWIREGUARD")[0])
    assert hub["Address"] == "10.200.0.1/24" and hub["ListenPort"] == "51820"
    # The gateway's peers: one SSM parameter per machine under the path its sync reads.
    parameters = {
        r.inputs["name"]: r
        for r in plan.of_type("aws:ssm/parameter:Parameter")
        if r.name.startswith("hybrid-peer-")
    }
    assert set(parameters) == {
        "/training-platform/dev/hybrid-wireguard-peers/alice-4090",
        "/training-platform/dev/hybrid-wireguard-peers/bob-cpu",
    }
    assert {p.inputs["type"] for p in parameters.values()} == {"String"}  # public keys only
    for name, conf in sorted(peers.items()):
        interface, gateway = sections(conf)
        assert gateway["Endpoint"] == "203.0.113.10:51820"
        assert gateway["AllowedIPs"] == "10.200.0.0/24, 10.20.0.0/16"
        assert conf.strip() in pages[name]
        # Joining is the whole page: no node sets its own podCIDR any more (Cilium's pool does).
        assert "kubectl patch node" not in pages[name] and "podCIDR" not in pages[name]
        syntax = subprocess.run(["bash", "-n"], input=pages[name], text=True, capture_output=True)
        assert syntax.returncode == 0, syntax.stderr
    alice = pages["alice-4090"]
    assert "nodeadm install 1.35 --credential-provider ssm" in alice  # the stack's version
    assert "--node-ip=10.200.0.2" in alice
    # No label pods select by: those are the gateway's to set (a kubelet cannot).
    assert "--node-labels=training-platform/node-role=hybrid,nvidia.com/gpu.present=true" in alice
    assert (
        "--register-with-taints=training-platform/hybrid=true:NoSchedule,"
        "training-platform/machine=alice-4090:NoSchedule" in alice
    )
    assert re.search(r"activationCode: offline-activation-code-\w+", alice)
    # Pod credentials (S3 checkpoints) through the Pod Identity agent's hybrid DaemonSet.
    assert "  hybrid:\n    enableCredentialsFile: true\n" in alice
    # All four packages at one version: each requires the others at exactly its own.
    assert (
        "apt-get install -y nvidia-container-toolkit=1.18.1-1 "
        "nvidia-container-toolkit-base=1.18.1-1 libnvidia-container-tools=1.18.1-1 "
        "libnvidia-container1=1.18.1-1" in alice
    )
    assert "nvidia-container-toolkit=" not in pages["bob-cpu"]


def heredoc(user_data: str, path: str) -> str:
    """The file the gateway's boot script installs at `path`."""
    return user_data.split(f"{path} <<'FILE'\n")[1].split("\nFILE\n")[0] + "\n"


def test_gateway_boot_installs_the_sync_for_this_stack(plan):
    user_data = plan.one("aws:ec2/instance:Instance", "hybrid-gateway").inputs["userData"]
    pods = (ipaddress.IPv4Network("10.201.0.0/16"),)
    target = SyncTarget(
        "us-west-2",
        "tp-dev",
        "/training-platform/dev/hybrid-wireguard-peers",
        pods,
        POOL_LABEL,
        MACHINE_LABEL,
    )
    assert heredoc(user_data, SYNC_PROGRAM) == sync_program()
    # AL2023's python3 is 3.9: the program parses as 3.9 (it runs as 3.11 in the netns tests).
    ast.parse(sync_program(), feature_version=(3, 9))
    assert heredoc(user_data, SYNC_SETTINGS) == target.settings() + "\n"
    networks = GatewayNetworks(
        ipaddress.IPv4Network("10.20.0.0/16"), (ipaddress.IPv4Network("10.200.0.0/24"),), pods
    )
    assert heredoc(user_data, FORWARD_SCRIPT) == forward_rules(networks)
    for name, text in sync_units().items():
        assert heredoc(user_data, f"/etc/systemd/system/{name}") == text
    assert "systemctl enable --now wg-quick@wg0 hybrid-wireguard-peers.timer" in user_data
    assert f"PostUp = {FORWARD_SCRIPT} up %i" in user_data
    (hub,) = sections(user_data.split("<<'WIREGUARD'\n")[1].split("\nWIREGUARD")[0])
    assert hub["PrivateKey"] == KEY_PLACEHOLDER  # read from SSM at boot, never in user data
    syntax = subprocess.run(["bash", "-n"], input=user_data, text=True, capture_output=True)
    assert syntax.returncode == 0, syntax.stderr


def test_gateway_may_read_its_machines_list_ciliumnodes_and_label_nodes_only(plan):
    policy = plan.one("aws:iam/rolePolicy:RolePolicy", "hybrid-gateway").inputs["policy"]
    statements = json.loads(policy)["Statement"]
    # The key parameter's ARN (the offline mock's ARN of hybrid-gateway-key).
    assert statements[0]["Resource"].endswith(":hybrid-gateway-key")
    assert statements == [
        {"Effect": "Allow", "Action": "ssm:GetParameter", "Resource": statements[0]["Resource"]},
        {
            "Effect": "Allow",
            "Action": "ssm:GetParametersByPath",
            # The path the sync asks for, under which the peer parameters are.
            "Resource": "arn:aws:ssm:us-west-2:123456789012:parameter/training-platform/dev/"
            "hybrid-wireguard-peers",
        },
        # Which managed instance each machine's activation registered: a List action, which
        # has no resource-level permission.
        {"Effect": "Allow", "Action": "ssm:DescribeInstanceInformation", "Resource": "*"},
        {
            "Effect": "Allow",
            "Action": "eks:DescribeCluster",
            "Resource": "arn:aws:eks:us-west-2:123456789012:cluster/tp-dev",
        },
    ]
    entry = plan.one("aws:eks/accessEntry:AccessEntry", "hybrid-gateway")
    assert entry.inputs["type"] == "STANDARD"
    assert entry.inputs["kubernetesGroups"] == ["hybrid-wireguard-gateway"]
    assert re.fullmatch(
        r"arn:aws:iam::123456789012:role/hybrid-gateway-\w+", entry.inputs["principalArn"]
    )
    role = plan.one("kubernetes:rbac.authorization.k8s.io/v1:ClusterRole", "hybrid-gateway")
    assert role.inputs["rules"] == [
        {"apiGroups": ["cilium.io"], "resources": ["ciliumnodes"], "verbs": ["list"]},
        # Labels the machines' nodes: the gateway admission policy lets it change nothing else.
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "patch"]},
    ]
    binding = plan.one(
        "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding", "hybrid-gateway"
    )
    assert binding.inputs["roleRef"]["name"] == role.inputs["metadata"]["name"]
    assert binding.inputs["subjects"] == [
        {
            "kind": "Group",
            "name": "hybrid-wireguard-gateway",
            "apiGroup": "rbac.authorization.k8s.io",
        }
    ]


def hybrid_plan(machines: list[dict]):
    return plan_of("dev", hybrid={**HYBRID, "machines": machines}, cluster=PRIVATE_ENDPOINT_OFF)


# What a machine's tunnel and registration hang on besides its own parameter, activation, page
# and config. The gateway instance's user data is replace-on-change (it runs once, at boot), so
# any change of their inputs churns every machine.
SHARED_BY_ALL_MACHINES = [
    ("aws:ec2/instance:Instance", "hybrid-gateway"),
    ("aws:ec2/eip:Eip", "hybrid-gateway"),
    ("aws:ec2/securityGroup:SecurityGroup", "hybrid-gateway"),
    ("aws:iam/rolePolicy:RolePolicy", "hybrid-gateway"),
    ("aws:ssm/parameter:Parameter", "hybrid-gateway-key"),
]


def assert_machines_unchanged(before, after, names: list[str]) -> None:
    """`names` keep their gateway peer, activation, tunnel config and bootstrap page; nothing
    they share with the other machines changes. Every argument of an SSM activation is ForceNew
    (terraform-provider-aws internal/service/ssm/activation.go, which pulumi-aws bridges: no
    update function), so an unchanged activation is one whose inputs are all unchanged."""
    for type_, name in SHARED_BY_ALL_MACHINES:
        assert after.one(type_, name).inputs == before.one(type_, name).inputs, name
    for name in names:
        activation = f"hybrid-activation-{name}"
        kept = after.one("aws:ssm/activation:Activation", activation).inputs
        assert kept == before.one("aws:ssm/activation:Activation", activation).inputs, name
        peer = f"hybrid-peer-{name}"
        kept = after.one("aws:ssm/parameter:Parameter", peer).inputs
        assert kept == before.one("aws:ssm/parameter:Parameter", peer).inputs, name
        # The value itself is compared (public: not redacted as a secret would be), and names
        # the address the machine's tunnel has.
        address = sections(after.outputs["hybridPeerConfigs"][name])[0]["Address"].split("/")[0]
        assert json.loads(kept["insecureValue"])["address"] == address, kept
        for output in ("hybridPeerConfigs", "hybridBootstrap"):
            assert after.outputs[output][name] == before.outputs[output][name], (output, name)


def test_adding_a_machine_adds_its_activation_and_peer_and_leaves_the_others_alone(plan):
    """A new machine (joining weeks later, with an activation start of its own) leaves every
    input of the gateway instance and of the other machines' activations as they were, so the
    engine has nothing to change there, no tunnel drops and the others' pages stand; the new
    peer arrives as one more SSM parameter the sync picks up."""
    bigger = hybrid_plan([*HYBRID["machines"], {**CAROL, "ssmActivationStart": "2026-12-20"}])
    assert_machines_unchanged(plan, bigger, ["alice-4090", "bob-cpu"])
    added = bigger.one("aws:ssm/parameter:Parameter", "hybrid-peer-carol-3090")
    assert added.inputs["name"] == "/training-platform/dev/hybrid-wireguard-peers/carol-3090"
    activation = bigger.one("aws:ssm/activation:Activation", "hybrid-activation-carol-3090")
    assert activation.inputs["expirationDate"] == "2026-12-27T00:00:00Z"
    assert activation.inputs["registrationLimit"] == 1
    assert set(bigger.outputs["hybridPeerConfigs"]) == {"alice-4090", "bob-cpu", "carol-3090"}
    carol_conf = sections(bigger.outputs["hybridPeerConfigs"]["carol-3090"])[0]
    assert carol_conf["Address"] == "10.200.0.4/24"


def test_a_machine_joining_again_gets_a_new_activation_alone(plan):
    """A new start for one machine replaces its activation (a new code on its page) and no
    other's: the others' activations, peers and pages stay."""
    alice, bob = HYBRID["machines"]
    redated = hybrid_plan([alice, {**bob, "ssmActivationStart": "2026-12-01"}])
    assert_machines_unchanged(plan, redated, ["alice-4090"])
    before = plan.one("aws:ssm/activation:Activation", "hybrid-activation-bob-cpu").inputs
    after = redated.one("aws:ssm/activation:Activation", "hybrid-activation-bob-cpu").inputs
    assert (before["expirationDate"], after["expirationDate"]) == (
        "2026-11-29T00:00:00Z",
        "2026-12-08T00:00:00Z",
    )


def test_removing_the_first_machine_and_reordering_moves_no_other_machine(plan):
    """Each machine keeps the address it declares: without the first machine, and with the
    others in another order, every other machine's peer, tunnel and page are as they were (its
    node IP and the gateway's peer for it must not move: the tunnel would drop and the node go
    NotReady until bootstrapped again)."""
    alice, bob = HYBRID["machines"]
    with_carol = hybrid_plan([alice, bob, CAROL])
    without_alice = hybrid_plan([CAROL, bob])
    assert_machines_unchanged(with_carol, without_alice, ["bob-cpu", "carol-3090"])
    assert not [
        r for r in without_alice.of_type("aws:ssm/parameter:Parameter") if "alice" in r.name
    ]
    assert set(without_alice.outputs["hybridBootstrap"]) == {"bob-cpu", "carol-3090"}
    assert "--node-ip=10.200.0.3" in without_alice.outputs["hybridBootstrap"]["bob-cpu"]


NODEADM_STEP = re.compile(r"\nrelease=.*?\ninstall -m 755 [^\n]*\n", re.DOTALL)


@pytest.mark.parametrize("tampered", [False, True])
def test_bootstrap_installs_the_pinned_nodeadm_only_if_its_checksum_matches(
    plan, tmp_path, tampered
):
    page = plan.outputs["hybridBootstrap"]["bob-cpu"]
    assert "releases/latest" not in page
    step = NODEADM_STEP.search(page).group(0)
    assert (
        "release=https://hybrid-assets.eks.amazonaws.com/releases/v1.0.20/bin/linux/"
        "$(dpkg --print-architecture)" in step
    )
    # The step as the machine runs it, against a fake release: curl and dpkg stand in for the
    # network and the package database, and nodeadm lands in tmp_path instead of /usr/local/bin.
    binary = b"nodeadm v1.0.20 arm64"
    digest = hashlib.sha256(b"tampered" if tampered else binary).hexdigest()
    served = {
        "https://hybrid-assets.eks.amazonaws.com/releases/v1.0.20/bin/linux/arm64/nodeadm": binary,
        "https://hybrid-assets.eks.amazonaws.com/releases/v1.0.20/bin/linux/arm64/nodeadm.sha256": (
            f"{digest}  nodeadm\n".encode()
        ),
    }
    fakes = tmp_path / "bin"
    fakes.mkdir()
    (fakes / "dpkg").write_text("#!/bin/sh\necho arm64\n")
    (fakes / "curl").write_text(
        f"#!{sys.executable}\nimport sys\nserved = {served!r}\n"
        "out = sys.argv[sys.argv.index('-fsSLo') + 1]\n"
        "open(out, 'wb').write(served[sys.argv[-1]])\n"
    )
    for fake in fakes.iterdir():
        fake.chmod(0o755)
    target = tmp_path / "nodeadm"
    run = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", step.replace("/usr/local/bin/nodeadm", str(target))],
        env={"PATH": f"{fakes}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    if tampered:
        assert run.returncode != 0 and not target.exists()
        assert "FAILED" in run.stdout + run.stderr
    else:
        assert run.returncode == 0, run.stderr
        assert target.read_bytes() == binary


def test_roles_anywhere_variant_without_gpu_pools():
    cpu_only = [{"name": "cpu", "instanceTypes": ["m6i.large"], "maxNodes": 2}]
    # No DevServers: the machines are the team's.
    machines = [{**m, "owner": "team:team-a", "allow": []} for m in HYBRID["machines"]]
    plan = plan_of(
        "dev",
        hybrid={
            **{k: v for k, v in HYBRID.items() if k != "ssmActivation"},
            "credentialProvider": "iam-roles-anywhere",
            "caBundlePem": CA_PEM,
            "machines": machines,
        },
        cluster=PRIVATE_ENDPOINT_OFF,
        nodePools=cpu_only,
        jobs=[],
        devServers=NO_DEV_SERVERS,
    )
    # The machines' GPUs alone bring the NVIDIA device plugin.
    assert plan.one("kubernetes:helm.sh/v3:Release", "nvidia-device-plugin")
    anchor = plan.one("aws:rolesanywhere/trustAnchor:TrustAnchor")
    assert anchor.inputs["source"]["sourceData"]["x509CertificateData"] == CA_PEM
    role = plan.one("aws:iam/role:Role", "hybrid-node")
    trust = json.loads(role.inputs["assumeRolePolicy"])["Statement"][0]
    assert trust["Principal"] == {"Service": "rolesanywhere.amazonaws.com"}
    assert trust["Condition"]["StringEquals"] == {
        "sts:RoleSessionName": "${aws:PrincipalTag/x509Subject/CN}"
    }
    assert plan.one("aws:rolesanywhere/profile:Profile").inputs["enabled"] is True
    assert not plan.of_type("aws:ssm/activation:Activation")
    page = plan.outputs["hybridBootstrap"]["bob-cpu"]
    assert "--credential-provider iam-ra" in page and "nodeName: bob-cpu" in page


def at(*addresses: str | None) -> list[dict]:
    """HYBRID's machines at `addresses` (None: without one)."""
    machines = [{k: v for k, v in m.items() if k != "address"} for m in HYBRID["machines"]]
    return [m | ({"address": a} if a else {}) for m, a in zip(machines, addresses, strict=True)]


ALLOWED_ADDRESSES = (
    "allowed: a host address of remoteNodeCidrs[0] 10.200.0.0/24 other than the gateway's "
    "10.200.0.1, one per machine: 10.200.0.2 to 10.200.0.254"
)


def hybrid_error(**overrides) -> str:
    values = stack_values("dev", cluster=PRIVATE_ENDPOINT_OFF)
    values["training-platform:hybrid"] = {**HYBRID, **overrides}
    with pytest.raises(ConfigError) as caught:
        parse_stack_config(values, "Pulumi.dev.yaml")
    return str(caught.value)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"remotePodCidrs": ["8.8.0.0/16"]}, "8.8.0.0/16 is not allowed for hybrid nodes"),
        (
            {"remotePodCidrs": ["10.200.0.0/16"]},
            "hybrid.remotePodCidrs[0]: 10.200.0.0/16 overlaps hybrid.remoteNodeCidrs[0] "
            "10.200.0.0/24; allowed: a range outside the VPC (10.20.0.0/16), the service CIDR "
            "(172.20.0.0/16) and the other remote CIDRs",
        ),
        (
            {"remoteNodeCidrs": ["10.20.5.0/24"], "machines": at("10.20.5.2", "10.20.5.3")},
            "hybrid.remoteNodeCidrs[0]: 10.20.5.0/24 overlaps the VPC cidr 10.20.0.0/16",
        ),
        # dev's VPC is in 10.0.0.0/8, so EKS gives services 172.20.0.0/16.
        (
            {"remotePodCidrs": ["172.20.128.0/17"]},
            "hybrid.remotePodCidrs[0]: 172.20.128.0/17 overlaps the cluster's service CIDR "
            "172.20.0.0/16",
        ),
        ({"credentialProvider": "iam-roles-anywhere"}, "caBundlePem goes with credentialProvider"),
        (
            {"remoteNodeCidrs": ["10.200.0.0/30"]},
            "hybrid: machines[bob-cpu].address 10.200.0.3 is the broadcast address of "
            "10.200.0.0/30; allowed: a host address of remoteNodeCidrs[0] 10.200.0.0/30 other "
            "than the gateway's 10.200.0.1, one per machine: 10.200.0.2 to 10.200.0.2",
        ),
        (
            {"remoteNodeCidrs": ["10.200.0.0/31"]},
            "remoteNodeCidrs[0] 10.200.0.0/31 has no room for the gateway and a machine; "
            "allowed: a /30 or wider",
        ),
        (
            {"machines": at("10.200.1.2", "10.200.0.3")},
            "hybrid: machines[alice-4090].address 10.200.1.2 is outside remoteNodeCidrs[0] "
            f"10.200.0.0/24; {ALLOWED_ADDRESSES}",
        ),
        (
            {"machines": at("10.200.0.2", "10.200.0.1")},
            f"hybrid: machines[bob-cpu].address 10.200.0.1 is the gateway's; {ALLOWED_ADDRESSES}",
        ),
        (
            {"machines": at("10.200.0.0", "10.200.0.3")},
            "hybrid: machines[alice-4090].address 10.200.0.0 is the network address of "
            f"10.200.0.0/24; {ALLOWED_ADDRESSES}",
        ),
        (
            {"machines": at("10.200.0.2", "10.200.0.255")},
            "hybrid: machines[bob-cpu].address 10.200.0.255 is the broadcast address of "
            f"10.200.0.0/24; {ALLOWED_ADDRESSES}",
        ),
        (
            {"machines": at("10.200.0.7", "10.200.0.7")},
            "hybrid: machines[bob-cpu].address 10.200.0.7 is machine alice-4090's too; "
            f"{ALLOWED_ADDRESSES}",
        ),
        # Required: a derived address would move with the list.
        (
            {"machines": at(None, "10.200.0.3")},
            "hybrid.machines[alice-4090].address: missing; this key is required",
        ),
        (
            {"machines": at("10.200.0.300", "10.200.0.3")},
            "hybrid.machines[alice-4090].address: '10.200.0.300' is not an IPv4 address; "
            "allowed: a host address in remoteNodeCidrs[0]",
        ),
        (
            {"ssmActivation": {"start": "2026-11-22", "registrationLimit": 10}},
            "hybrid.ssmActivation: registrationLimit is gone: each machine has an activation of "
            "its own that admits one registration",
        ),
        (
            {"machines": [{k: v for k, v in HYBRID["machines"][0].items() if k != "owner"}]},
            "hybrid.machines[alice-4090].owner: missing; this key is required",
        ),
        (
            {"machines": [{**HYBRID["machines"][0], "owner": "alice"}]},
            "allowed: user:<a devServers.users name> or team:<a queues.teams name>, e.g. "
            "user:alice",
        ),
        (
            {"machines": [{**HYBRID["machines"][0], "owner": "user:alcie"}]},
            "hybrid.machines[alice-4090].owner: 'user:alcie' names no user of "
            "devServers.users; did you mean 'alice'? allowed: user:alice, user:bob",
        ),
        (
            {"machines": [{**HYBRID["machines"][0], "allow": ["team:vision"]}]},
            "hybrid.machines[alice-4090].allow[0]: 'team:vision' names no team of queues.teams; "
            "allowed: team:team-a, team:research",
        ),
        (
            {"machines": [{**HYBRID["machines"][0], "publicAddress": "192.168.1.10"}]},
            "hybrid.machines[alice-4090].publicAddress: '192.168.1.10' is not a public IPv4 "
            "address",
        ),
        (
            {
                "credentialProvider": "iam-roles-anywhere",
                "caBundlePem": CA_PEM,
                "ssmActivation": None,
                "machines": [{**HYBRID["machines"][0], "ssmActivationStart": "2026-12-01"}],
            },
            "hybrid: machines alice-4090 set ssmActivationStart, which goes with "
            "credentialProvider ssm",
        ),
        (
            {"machines": [{**HYBRID["machines"][0], "podCidr": "10.201.1.0/24"}]},
            "hybrid.machines[alice-4090]: podCidr is gone: Cilium's cluster-pool IPAM now gives "
            "each node its slice of remotePodCidrs when it joins (size: hybrid.podCidrMaskSize)",
        ),
        (
            {"podCidrMaskSize": 15},
            "hybrid.podCidrMaskSize: Input should be greater than or equal to 16",
        ),
        (
            {"remotePodCidrs": ["10.201.0.0/26"], "podCidrMaskSize": 24},
            "podCidrMaskSize /24 is wider than a remotePodCidrs entry",
        ),
        (
            {"remotePodCidrs": ["10.201.0.0/24"], "podCidrMaskSize": 24},
            "remotePodCidrs have room for 1 node slice(s) of /24 and 2 machines need one each",
        ),
        (
            {"machines": [{**HYBRID["machines"][0], "gpus": -1}]},
            "hybrid.machines[alice-4090].gpus",
        ),
        (
            {"ssmActivation": {"start": "2026-11-22", "days": 31}},
            "hybrid.ssmActivation.days: Input should be less than or equal to 30",
        ),
        (
            {"ssmActivation": {"start": "2026-11-22", "days": 0}},
            "hybrid.ssmActivation.days: Input should be greater than or equal to 1",
        ),
        (
            {"ssmActivation": {"start": "22/11/2026"}},
            "hybrid.ssmActivation.start: '22/11/2026' is not a date; allowed: YYYY-MM-DD",
        ),
        ({"ssmActivation": None}, "ssmActivation goes with credentialProvider ssm"),
        (
            {"credentialProvider": "iam-roles-anywhere", "caBundlePem": CA_PEM},
            "ssmActivation goes with credentialProvider ssm",
        ),
    ],
)
def test_invalid_hybrid_config_names_the_key(overrides, message):
    error = hybrid_error(**overrides)
    assert "training-platform:hybrid" in error and message in error


def test_ssm_activation_start_is_a_yaml_date_or_the_engines_string():
    from_yaml = SsmActivation.model_validate({"start": datetime.date(2026, 12, 30)})
    from_engine = SsmActivation.model_validate({"start": "2026-12-30", "days": 30})
    assert from_yaml.expiration_date() == "2027-01-06T00:00:00Z"  # 7 days unless told
    assert from_engine.expiration_date() == "2027-01-29T00:00:00Z"


def test_hybrid_needs_one_endpoint_mode():
    values = stack_values("dev")
    values["training-platform:hybrid"] = HYBRID
    with pytest.raises(ConfigError, match="cluster.endpoint: hybrid nodes need publicAccess or"):
        parse_stack_config(values, "Pulumi.dev.yaml")


def test_bootstrap_cli_prints_one_machine_from_the_stack_outputs(tmp_path, monkeypatch, capsys):
    fake = tmp_path / "pulumi"
    outputs = {"alice-4090": "#!/usr/bin/env bash\necho alice\n"}
    fake.write_text(
        f"#!{sys.executable}\nimport json, sys\n"
        "assert sys.argv[1:] == ['stack', 'output', 'hybridBootstrap', '--show-secrets', "
        "'--json', '--stack', 'dev'], sys.argv\n"
        f"print(json.dumps({outputs!r}))\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{Path(sys.executable).parent}:/usr/bin:/bin")
    assert hybrid_bootstrap.main(["--stack", "dev", "alice-4090"]) == 0
    assert capsys.readouterr().out == outputs["alice-4090"]
    assert hybrid_bootstrap.main(["--stack", "dev", "carol"]) == 2
    assert "allowed: alice-4090" in capsys.readouterr().err


def test_peer_configs_and_bootstraps_are_secret_outputs(hybrid_run):
    assert hybrid_run[1] == {
        "hybridGatewayIp": False,
        "hybridPeerConfigs": True,
        "hybridBootstrap": True,
    }


def test_policy_pack_wants_the_gateway_allowed_by_name(plan):
    found = check(plan)
    assert [(v.policy, v.urn.rsplit("::", 1)[1]) for v in found] == [
        ("no-world-ingress", "hybrid-gateway")
    ], [str(v) for v in found]
    assert check(plan, {"allowedPublicIngress": ["hybrid-gateway"]}) == []
