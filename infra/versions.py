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
        "aws-ebs-csi-driver": "v1.51.1-eksbuild.1",
        "aws-efs-csi-driver": "v2.1.13-eksbuild.1",
        "aws-fsx-csi-driver": "v1.7.0-eksbuild.1",
        # Not confirmed against AWS (no AWS access where this was written): the agent's own chart
        # at tag v1.7.0 (aws/eks-node-monitoring-agent, charts/eks-node-monitoring-agent/
        # values.yaml) runs image v1.7.0-eksbuild.1, and add-on builds carry the image's name.
        # Check: aws eks describe-addon-versions --addon-name eks-node-monitoring-agent
        #   --kubernetes-version 1.34 --query 'addons[0].addonVersions[].addonVersion'
        "eks-node-monitoring-agent": "v1.7.0-eksbuild.1",
    },
}


@dataclass(frozen=True)
class ChartPin:
    """A Helm chart at a fixed version: `chart` is an OCI reference, or a name within `repo`."""

    chart: str
    version: str
    repo: str | None = None


# FSx for Lustre server version.
LUSTRE_VERSION = "2.15"

KARPENTER_CHART = ChartPin("oci://public.ecr.aws/karpenter/karpenter", "1.14.1")
# Same version as the controller, always: the controller expects exactly these CRDs.
KARPENTER_CRD_CHART = ChartPin(
    "oci://public.ecr.aws/karpenter/karpenter-crd", KARPENTER_CHART.version
)
NVIDIA_DEVICE_PLUGIN_CHART = ChartPin(
    "nvidia-device-plugin", "0.18.0", repo="https://nvidia.github.io/k8s-device-plugin"
)
# Chart v0.5.30 deploys device plugin image v0.5.20 (aws/eks-charts, 2026-08).
EFA_DEVICE_PLUGIN_CHART = ChartPin(
    "aws-efa-k8s-device-plugin", "v0.5.30", repo="https://aws.github.io/eks-charts"
)

# Default EKS-optimized AL2023 release for Karpenter nodes; the NVIDIA variant is picked for GPU
# instance types by the same alias. A stack may pin another with `karpenter.amiAlias`. List them:
# aws ssm get-parameters-by-path --path /aws/service/eks/optimized-ami/1.34/amazon-linux-2023/
KARPENTER_AMI_ALIAS = "al2023@v20261020"
# The first AL2023 release with AMIs for each Kubernetes version (awslabs/amazon-eks-ami
# CHANGELOG.md, "AMI Release v20250915" is the first to list amazon-eks-node-al2023-*-1.34-*).
# Karpenter resolves `al2023@<release>` through an SSM parameter named after the cluster's
# Kubernetes version and the release (karpenter-provider-aws v1.14.1,
# pkg/providers/amifamily/al2023.go resolvePath): an older release has no AMI for the version.
AL2023_FIRST_RELEASE = {"1.34": "v20250915"}

KUEUE_CHART = ChartPin("oci://registry.k8s.io/kueue/charts/kueue", "0.19.2")
DCGM_EXPORTER_CHART = ChartPin(
    "dcgm-exporter", "4.8.3", repo="https://nvidia.github.io/dcgm-exporter/helm-charts"
)
KUBE_PROMETHEUS_STACK_CHART = ChartPin(
    "kube-prometheus-stack", "88.6.5", repo="https://prometheus-community.github.io/helm-charts"
)
# Kubeflow training operator (v1 line, PyTorchJob kubeflow.org/v1): the upstream standalone
# overlay at this tag, patched by deploy/manifests/training-operator/kustomization.yaml.
TRAINING_OPERATOR_VERSION = "v1.9.4"
# MPI operator (MPIJob kubeflow.org/v2beta1): upstream's standalone overlay at this tag, placed
# by deploy/manifests/mpi-operator/kustomization.yaml.
MPI_OPERATOR_VERSION = "v0.8.0"
# The local-path provisioner (rancher/local-path-provisioner), which makes DevServer homes on the
# hybrid machines' disks: upstream's deploy/ kustomization at this tag, patched by
# deploy/manifests/local-path-provisioner/kustomization.yaml. That tag's manifest pins its own
# image (docker.io/rancher/local-path-provisioner:v0.0.37).
LOCAL_PATH_PROVISIONER_VERSION = "v0.0.37"
# The image of its helper pods, which create and remove a home's directory on its machine (a
# shell, mkdir, rm). Upstream's template names busybox with no tag; pinned here by tag (no
# registry could be asked for a digest where this was written).
LOCAL_PATH_HELPER_IMAGE = "docker.io/library/busybox:1.37.0"

# Hybrid nodes (infra/components/hybrid_gateway.py). The WireGuard gateway boots the AL2023 AMI this
# public SSM parameter names when it is created; a later AMI does not replace a running gateway.
WIREGUARD_GATEWAY_AMI_PARAMETER = (
    "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-6.1-x86_64"
)
# nodeadm, the EKS hybrid nodes agent the bootstrap installs: a release of aws/eks-hybrid (tag
# v1.0.20, 2026-08-20). Each release keeps its files under releases/<version>/, a sha256sum file
# beside each binary (hack/build-nodeadm.sh, hack/release-nodeadm.sh in that repository).
NODEADM_VERSION = "v1.0.20"
# NVIDIA container toolkit the bootstrap installs on GPU hybrid nodes (Debian package version of
# tag v1.18.1). Its packages require each other at exactly the same version, so all four are
# pinned together.
NVIDIA_CONTAINER_TOOLKIT_VERSION = "1.18.1-1"

# Cilium, the CNI of hybrid nodes (the VPC CNI does not run there): AWS's build, the one AWS
# supports on hybrid nodes, with chart and images in ECR Public. 1.18.x is a supported minor (EKS
# user guide, "Configure CNI for hybrid nodes"); this build and these image digests are the ones
# aws/eks-hybrid's e2e suite installed (test/e2e/cni/testdata/cilium, commit 29b7e2aa, 2026-01).
CILIUM_CHART = ChartPin("oci://public.ecr.aws/eks/cilium/cilium", "1.18.5-0")
CILIUM_IMAGES = {
    "agent": {
        "repository": "public.ecr.aws/eks/cilium/cilium",
        "tag": "v1.18.5-0",
        "digest": "sha256:f274a319c8eab14aff9c3f45b1688dddd60afc87bd0aeacba709cb606cbebcf3",
        "useDigest": True,
    },
    # The chart appends "-generic" (the build without cloud-provider IPAM), hence genericDigest:
    # the digest of operator-generic:v1.18.5-0.
    "operator": {
        "repository": "public.ecr.aws/eks/cilium/operator",
        "tag": "v1.18.5-0",
        "genericDigest": "sha256:b48284d14a8ebb3176537aae2452760fb7ef7e8ae499fbedb8b0a1d2d552a0ff",
        "useDigest": True,
    },
}
