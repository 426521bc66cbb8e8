"""What a hybrid machine is to the cluster and what it runs to join it: the labels and taints its
node registers with, the ones the platform gives it (and what tolerates them), its nodeadm
NodeConfig, the one-page bootstrap its owner runs, and its WireGuard spoke.

A machine's owner is root on it and controls its kubelet: whatever its node registers with
(labels outside the kubernetes.io, k8s.io and node-restriction.kubernetes.io domains, any
taints) she chooses. So nothing that decides where a pod goes rests on them: pods select the
machines they may run on by MACHINE_LABEL and POOL_LABEL, in the node-restriction domain no
kubelet may set on its own Node, which the gateway's sync sets once it has matched the node to a
machine by its credentials (infra/hybrid/gateway_boot.py); the node admission policy
(infra/hybrid/admission.py) holds every hybrid node to its hybrid label and taint.
"""

import yaml

from infra.core.config import HYBRID_POOL
from infra.core.nodes import COMPUTE_TYPE, GPU_NODE_LABELS, GPU_TOLERATION
from infra.core.versions import NODEADM_VERSION, NVIDIA_CONTAINER_TOOLKIT_VERSION
from infra.hybrid.config import HybridConfig, HybridMachine
from infra.hybrid.gateway import WIREGUARD_PORT
from mesh.wireguard import Spoke

HYBRID_FLAVOR = HYBRID_POOL
# What a machine's kubelet registers with: a role for people reading `kubectl get nodes`.
HYBRID_NODE_LABELS = {"training-platform/node-role": "hybrid"}
# Every hybrid node registers with it (the node admission policy refuses one without): it keeps
# off every pod that does not opt in to the machines.
HYBRID_TAINT = {"key": "training-platform/hybrid", "value": "true", "effect": "NoSchedule"}
# And with its own machine's: a pod runs on a machine only if it tolerates that machine's taint,
# which the pod admission policy lets only the namespaces the machine admits do.
MACHINE_TAINT_KEY = "training-platform/machine"
# For node agents (device plugins): a workload opts in through Kueue's flavor instead.
HYBRID_TOLERATION = {"key": HYBRID_TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}
MACHINE_TOLERATION = {"key": MACHINE_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}
# Agents every GPU node runs (device plugin, DCGM exporter), pool nodes and hybrid ones alike.
GPU_AGENT_TOLERATIONS = [GPU_TOLERATION, HYBRID_TOLERATION, MACHINE_TOLERATION]
# The label EKS gives every hybrid node. The VPC CNI (aws-node) and the EBS and EFS CSI node
# agents are required to run on nodes without it (their charts at the pinned add-on versions).
HYBRID_NODE_AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {
                    "matchExpressions": [
                        {
                            "key": COMPUTE_TYPE,
                            "operator": "In",
                            "values": ["hybrid"],
                        }
                    ]
                }
            ]
        }
    }
}
# The pinned release's binaries; a machine adds its architecture (amd64, arm64) and file name.
NODEADM_RELEASE = f"https://hybrid-assets.eks.amazonaws.com/releases/{NODEADM_VERSION}/bin/linux"
# Installed at one version together: each requires the others at exactly its own.
NVIDIA_CONTAINER_PACKAGES = [
    "nvidia-container-toolkit",
    "nvidia-container-toolkit-base",
    "libnvidia-container-tools",
    "libnvidia-container1",
]
NODEADM_CREDENTIAL_PROVIDER = {"ssm": "ssm", "iam-roles-anywhere": "iam-ra"}
# Where a Roles Anywhere machine keeps its certificate (CN = machine name) and key.
IRA_CERTIFICATE = "/etc/iam/pki/server.pem"
IRA_PRIVATE_KEY = "/etc/iam/pki/server.key"


def machine_taint(name: str) -> dict:
    return {"key": MACHINE_TAINT_KEY, "value": name, "effect": "NoSchedule"}


def node_labels(machine: HybridMachine) -> dict[str, str]:
    """What its kubelet registers with (nodeadm adds eks.amazonaws.com/compute-type=hybrid)."""
    return {**HYBRID_NODE_LABELS, **(GPU_NODE_LABELS if machine.gpus else {})}


def node_taints(machine: HybridMachine) -> list[dict]:
    return [HYBRID_TAINT, machine_taint(machine.name)]


def node_config(
    cluster_name: str, region: str, machine: HybridMachine, node_ip: str, hybrid: dict
) -> str:
    """nodeadm's NodeConfig for one machine; `hybrid` is its spec.hybrid credentials block."""
    taints = ",".join(f"{t['key']}={t['value']}:{t['effect']}" for t in node_taints(machine))
    labels = ",".join(f"{k}={v}" for k, v in node_labels(machine).items())
    document = {
        "apiVersion": "node.eks.aws/v1alpha1",
        "kind": "NodeConfig",
        "spec": {
            "cluster": {"name": cluster_name, "region": region},
            "hybrid": hybrid,
            "kubelet": {
                "flags": [
                    f"--node-ip={node_ip}",
                    f"--node-labels={labels}",
                    f"--register-with-taints={taints}",
                ]
            },
        },
    }
    return yaml.safe_dump(document, sort_keys=False)


def bootstrap_script(
    machine: HybridMachine,
    cluster_name: str,
    kubernetes_version: str,
    credential_provider: str,
    wireguard_conf: str,
    node_config_yaml: str,
) -> str:
    """One page a machine's owner runs as root (Ubuntu 22.04/24.04) to join the cluster."""
    gpu = ""
    if machine.gpus:
        packages = " ".join(
            f"{p}={NVIDIA_CONTAINER_TOOLKIT_VERSION}" for p in NVIDIA_CONTAINER_PACKAGES
        )
        gpu = f"""
# 4. NVIDIA container toolkit, so containerd runs GPU containers on this machine's
#    {machine.gpus} x {machine.gpu_model or "GPU"}. Needs the NVIDIA driver (nvidia-smi works).
curl -fsSL https://nvidia.github.io/libnvidia-container/gpgkey \\
  | gpg --dearmor --yes -o /usr/share/keyrings/nvidia-container-toolkit-keyring.gpg
keyring=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg
curl -fsSL https://nvidia.github.io/libnvidia-container/stable/deb/nvidia-container-toolkit.list \\
  | sed "s#deb https://#deb [signed-by=$keyring] https://#" \\
  > /etc/apt/sources.list.d/nvidia-container-toolkit.list
apt-get update
apt-get install -y {packages}
nvidia-ctk runtime configure --runtime=containerd --set-as-default
systemctl restart containerd
"""
    provider = NODEADM_CREDENTIAL_PROVIDER[credential_provider]
    certificate = ""
    if credential_provider == "iam-roles-anywhere":
        certificate = (
            f"# Before running: this machine's certificate (CN={machine.name}) and key, signed "
            f"by the\n# stack's CA, at {IRA_CERTIFICATE} and {IRA_PRIVATE_KEY}.\n"
        )
    return f"""#!/usr/bin/env bash
# Hybrid node {machine.name} of EKS cluster {cluster_name}: run as root on Ubuntu 22.04/24.04.
# Generated by the stack; it holds secrets (WireGuard key, credentials): keep it private.
{certificate}
set -euo pipefail

# 1. WireGuard to the cluster's gateway (UDP {WIREGUARD_PORT} outbound; no inbound port needed).
apt-get update
apt-get install -y wireguard-tools curl gpg
install -m 600 /dev/stdin /etc/wireguard/wg0.conf <<'WIREGUARD'
{wireguard_conf.rstrip()}
WIREGUARD
systemctl enable --now wg-quick@wg0

# 2. nodeadm {NODEADM_VERSION}, the EKS hybrid nodes agent: kubelet, containerd, credentials
#    (Kubernetes {kubernetes_version}); checked against the release's own sha256sum file.
release={NODEADM_RELEASE}/$(dpkg --print-architecture)
download=$(mktemp -d)
curl -fsSLo "$download/nodeadm" "$release/nodeadm"
curl -fsSLo "$download/nodeadm.sha256" "$release/nodeadm.sha256"
(cd "$download" && sha256sum --check --strict nodeadm.sha256)
install -m 755 "$download/nodeadm" /usr/local/bin/nodeadm
nodeadm install {kubernetes_version} --credential-provider {provider}

# 3. Join: the node registers with its WireGuard address, its labels and taints.
install -d /etc/nodeadm
install -m 600 /dev/stdin /etc/nodeadm/nodeConfig.yaml <<'NODECONFIG'
{node_config_yaml.rstrip()}
NODECONFIG
nodeadm init -c file:///etc/nodeadm/nodeConfig.yaml
{gpu}"""


def spokes(config: HybridConfig, private_keys: list[str]) -> list[Spoke]:
    """The machines as WireGuard spokes, each at its own address (its node IP)."""
    return [
        Spoke(m.name, key, m.address) for m, key in zip(config.machines, private_keys, strict=True)
    ]
