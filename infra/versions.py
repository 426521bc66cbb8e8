"""Every version the platform deploys: Kubernetes, EKS add-ons, Helm charts, images.

Python package versions live in pyproject.toml. Everything the program installs into AWS or the
cluster is pinned here, so an upgrade is one reviewed diff. Refresh EKS add-on builds with
`aws eks describe-addon-versions --kubernetes-version <k8s> --addon-name <name>`.
"""

from dataclasses import dataclass

# EKS managed add-on builds per supported Kubernetes version; the first key is the default, and
# `cluster.kubernetesVersion` in stack config may name only these.
EKS_ADDONS = {
    "1.34": {
        "vpc-cni": "v1.20.4-eksbuild.1",
        "coredns": "v1.12.4-eksbuild.1",
        "kube-proxy": "v1.34.0-eksbuild.4",
        "eks-pod-identity-agent": "v1.3.9-eksbuild.3",
    },
}


@dataclass(frozen=True)
class ChartPin:
    """A Helm chart at a fixed version: `chart` is an OCI reference, or a name within `repo`."""

    chart: str
    version: str
    repo: str | None = None


KARPENTER_CHART = ChartPin("oci://public.ecr.aws/karpenter/karpenter", "1.14.1")
NVIDIA_DEVICE_PLUGIN_CHART = ChartPin(
    "nvidia-device-plugin", "0.18.0", repo="https://nvidia.github.io/k8s-device-plugin"
)

# Default EKS-optimized AL2023 release for Karpenter nodes; the NVIDIA variant is picked for GPU
# instance types by the same alias. A stack may pin another with `karpenter.amiAlias`. List them:
# aws ssm get-parameters-by-path --path /aws/service/eks/optimized-ami/1.34/amazon-linux-2023/
KARPENTER_AMI_ALIAS = "al2023@v20261020"
