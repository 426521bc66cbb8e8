"""Every version the platform deploys: Kubernetes, EKS add-ons, Helm charts, images.

Python package versions live in pyproject.toml. Everything the program installs into AWS or the
cluster is pinned here, so an upgrade is one reviewed diff. Refresh EKS add-on builds with
`aws eks describe-addon-versions --kubernetes-version <k8s> --addon-name <name>`.
"""

import datetime
from dataclasses import dataclass


@dataclass(frozen=True)
class KubernetesVersion:
    """An EKS Kubernetes minor version the platform supports: the EKS managed add-on builds it
    installs with it, the first AL2023 AMI release that has AMIs for it, and EKS's support dates.

    EKS dates: the EKS "Kubernetes release calendar" as scraped by endoflife.date
    (endoflife-date/endoflife.date@a70eca3, products/amazon-eks.md, 2026-08-22), which agrees with
    aws-samples' calendar for 1.34 and 1.35. After `standard_support_ends` a cluster on this
    version pays extended support (EKS_EXTENDED_SUPPORT_PER_HOUR) unless upgraded; after
    `extended_support_ends` EKS upgrades it itself.
    """

    addons: dict[str, str]
    # awslabs/amazon-eks-ami CHANGELOG.md: the first release listing amazon-eks-node-al2023-*-<v>.
    # Karpenter resolves `al2023@<release>` through an SSM parameter named after the cluster's
    # Kubernetes version and the release (karpenter-provider-aws v1.14.1,
    # pkg/providers/amifamily/al2023.go resolvePath): an older release has no AMI for the version.
    first_al2023_release: str
    standard_support_ends: datetime.date
    extended_support_ends: datetime.date
    # Add-on builds not confirmed as EKS's default for this version (no AWS access where this was
    # written): deploy.preflight checks every pin against `aws eks describe-addon-versions`.
    unconfirmed_addons: tuple[str, ...] = ()
    # Other fields no source confirmed, each with what it rests on instead (deploy.preflight checks
    # the AMI release against the account's SSM parameters).
    unconfirmed: tuple[str, ...] = ()


# Supported versions, newest first. Refresh add-on builds with
#   aws eks describe-addon-versions --kubernetes-version <v> --addon-name <name> \
#     --query 'addons[].addonVersions[?compatibilities[?defaultVersion]].addonVersion'
# (python -m deploy.preflight runs this check against the account before `pulumi up`).
ALL_ADDONS = (
    "vpc-cni",
    "coredns",
    "kube-proxy",
    "eks-pod-identity-agent",
    "aws-ebs-csi-driver",
    "aws-efs-csi-driver",
    "aws-fsx-csi-driver",
    "eks-node-monitoring-agent",
)
# The builds an unpinned 1.36 cluster was given by EKS in September 2026 (a third party's record of
# "add-on versions the 1.36 cluster resolved to", created without addonVersion: EKS's defaults;
# found through the code index, repository not named) and a 1.36 Terraform root's EBS pin. No
# first-party source lists EKS's defaults for 1.36 or 1.37 (cdk-eks-blueprints and eksctl stop at
# 1.35, 2026-07/08): all unconfirmed, checked by deploy.preflight before a cluster moves there.
_ADDONS_SEEN_ON_1_36 = {
    "vpc-cni": "v1.22.4-eksbuild.3",
    "coredns": "v1.14.3-eksbuild.16",
    "eks-pod-identity-agent": "v1.3.10-eksbuild.3",
    "aws-ebs-csi-driver": "v1.63.1-eksbuild.1",
    # No 1.36 build seen: the 1.35 pins, which these drivers' builds do not tie to one minor.
    "aws-efs-csi-driver": "v2.1.13-eksbuild.1",
    "aws-fsx-csi-driver": "v1.7.0-eksbuild.1",
    "eks-node-monitoring-agent": "v1.7.0-eksbuild.1",
}
KUBERNETES_VERSIONS = {
    "1.37": KubernetesVersion(
        # kube-proxy is built per minor: `v1.37.0-eksbuild.1` is the form of EKS's first build
        # of a minor, not a build read anywhere. The others: as seen on 1.36.
        addons={**_ADDONS_SEEN_ON_1_36, "kube-proxy": "v1.37.0-eksbuild.1"},
        # No AL2023 release listing 1.37 AMIs could be read (awslabs/amazon-eks-ami's stored
        # CHANGELOG ends at v20260714): the platform's alias release (KARPENTER_AMI_ALIAS),
        # after EKS's 1.37 launch (2026-10-02).
        first_al2023_release="v20261020",
        # EKS launched 1.37 on 2026-10-02 (issue #38 of this project, checked against EKS's
        # release calendar on 2026-11-29; no stored source has it); the dates follow EKS's rule,
        # 14 months of standard then 12 of extended support (EKS user guide, "Kubernetes version
        # lifecycle on EKS"), which 1.36's dates match exactly.
        standard_support_ends=datetime.date(2027, 12, 2),
        extended_support_ends=datetime.date(2028, 12, 2),
        unconfirmed_addons=ALL_ADDONS,
        unconfirmed=(
            "first_al2023_release: the alias release, not a CHANGELOG entry",
            "support dates: computed from the launch day by EKS's 14 + 12 month rule",
        ),
    ),
    "1.36": KubernetesVersion(
        addons={**_ADDONS_SEEN_ON_1_36, "kube-proxy": "v1.36.0-eksbuild.21"},
        # The first CHANGELOG.md section listing amazon-eks-node-al2023-*-1.36-* AMIs
        # (awslabs/amazon-eks-ami at 81fec2e, "AMI Release v20260610"). The CHANGELOG skips
        # v20260512-v20260529, and a third party ran a 1.36 AMI of v20260529: the earlier
        # release may have them too; the later one is certain.
        first_al2023_release="v20260610",
        # endoflife-date/endoflife.date products/amazon-eks.md at a70eca3 (EKS launched 1.36 on
        # 2026-06-02).
        standard_support_ends=datetime.date(2027, 8, 2),
        extended_support_ends=datetime.date(2028, 8, 2),
        unconfirmed_addons=ALL_ADDONS,
    ),
    "1.35": KubernetesVersion(
        # vpc-cni, coredns, kube-proxy, pod identity agent and EBS CSI: the 1.35 entries of
        # awslabs/cdk-eks-blueprints' add-on version maps ("the default version" per cluster
        # version; lib/addons/*/index.ts at 05d3dbd, 2026-07-01).
        addons={
            "vpc-cni": "v1.21.1-eksbuild.1",
            "coredns": "v1.13.2-eksbuild.3",
            # A 1.35 cluster was seen running this build (the project's upstream notes,
            # 2026-11-29): EKS offers it for 1.35, a later patch than the maps' v1.35.0-eksbuild.2.
            "kube-proxy": "v1.35.3-eksbuild.13",
            "eks-pod-identity-agent": "v1.3.10-eksbuild.2",
            "aws-ebs-csi-driver": "v1.57.1-eksbuild.1",
            # The 1.34 builds: no source found for these add-ons' 1.35 compatibility.
            "aws-efs-csi-driver": "v2.1.13-eksbuild.1",
            "aws-fsx-csi-driver": "v1.7.0-eksbuild.1",
            "eks-node-monitoring-agent": "v1.7.0-eksbuild.1",
        },
        first_al2023_release="v20260114",
        standard_support_ends=datetime.date(2027, 3, 27),
        extended_support_ends=datetime.date(2028, 3, 27),
        unconfirmed_addons=ALL_ADDONS,
    ),
    # Kept as an upgrade source only: it leaves standard support on 2026-12-02, and a stack on it
    # is priced at extended support from then; the plan warns until it moves to 1.35.
    "1.34": KubernetesVersion(
        addons={
            "vpc-cni": "v1.20.4-eksbuild.1",
            "coredns": "v1.12.4-eksbuild.1",
            "kube-proxy": "v1.34.0-eksbuild.4",
            "eks-pod-identity-agent": "v1.3.9-eksbuild.3",
            "aws-ebs-csi-driver": "v1.51.1-eksbuild.1",
            "aws-efs-csi-driver": "v2.1.13-eksbuild.1",
            "aws-fsx-csi-driver": "v1.7.0-eksbuild.1",
            # The agent's own chart at tag v1.7.0 (aws/eks-node-monitoring-agent,
            # charts/eks-node-monitoring-agent/values.yaml) runs image v1.7.0-eksbuild.1, and
            # add-on builds carry the image's name.
            "eks-node-monitoring-agent": "v1.7.0-eksbuild.1",
        },
        first_al2023_release="v20250915",
        standard_support_ends=datetime.date(2026, 12, 2),
        extended_support_ends=datetime.date(2027, 12, 2),
        unconfirmed_addons=("eks-node-monitoring-agent",),
    ),
}
# The default of `cluster.kubernetesVersion`: the newest version whose add-on builds have a
# first-party source (cdk-eks-blueprints' 1.35 maps); 1.36's and 1.37's rest on what a third
# party saw and on the form of a first build, until deploy.preflight confirms them in an account.
DEFAULT_KUBERNETES_VERSION = "1.35"


@dataclass(frozen=True)
class ChartPin:
    """A Helm chart at a fixed version: `chart` is an OCI reference, or a name within `repo`."""

    chart: str
    version: str
    repo: str | None = None


# FSx for Lustre server version.
LUSTRE_VERSION = "2.15"

# Karpenter 1.15.1 (2026-10-23): the first release that supports Kubernetes 1.37 (its compatibility
# matrix: 1.36 needs >= 1.13, 1.37 needs 1.15.x). Node repair is a voluntary disruption under the
# pools' budgets from 1.15 (infra/karpenter/node_pools.py). The stored upstream source ends before
# 1.15.0: tests/crds/SOURCES.md says what of it could be read.
KARPENTER_CHART = ChartPin("oci://public.ecr.aws/karpenter/karpenter", "1.15.1")
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
# Kueue 0.20.7, the newest stable: serves kueue.x-k8s.io/v1beta2 only (objects stored as v1beta1
# are migrated before the upgrade: docs/platform/upgrades.md), needs Trainer >= 2.3 for TrainJob.
KUEUE_CHART = ChartPin("oci://registry.k8s.io/kueue/charts/kueue", "0.20.7")
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
# by deploy/manifests/mpi-operator/kustomization.yaml, which pins its image to the same release
# (the overlay on branch release-0.8 names the floating tag "0.8"). v0.8.2 (2026-07-03) is the
# release Kueue builds against (its go.mod); its MPIJob CRD is v0.8.0's.
MPI_OPERATOR_VERSION = "v0.8.2"
# Kubeflow Trainer v2 (TrainJob, TrainingRuntime, ClusterTrainingRuntime in
# trainer.kubeflow.org/v1alpha1): upstream's `manager` overlay at this tag (the controller, its CRDs
# and webhooks, and the JobSet it runs on; not upstream's own runtimes), placed by
# deploy/manifests/trainer/kustomization.yaml. Alpha API: read the release notes before a bump.
TRAINER_VERSION = "v2.3.0"
# The JobSet (jobset.x-k8s.io/v1alpha2) that overlay installs: at TRAINER_VERSION its
# manifests/third-party/jobset/kustomization.yaml names this release's manifests.yaml. It comes with
# the Trainer and moves with it; infra/operators/tests/trainer_rules.py holds the pair as read
# upstream.
JOBSET_VERSION = "v0.12.0"
# The local-path provisioner (rancher/local-path-provisioner), which makes DevServer homes on the
# hybrid machines' disks: upstream's deploy/ kustomization at this tag, patched by
# deploy/manifests/local-path-provisioner/kustomization.yaml. That tag's manifest pins its own
# image (docker.io/rancher/local-path-provisioner:v0.0.37).
LOCAL_PATH_PROVISIONER_VERSION = "v0.0.37"
# The image of its helper pods, which create and remove a home's directory on its machine (a
# shell, mkdir, rm). Upstream's template names busybox with no tag; pinned here by tag (no
# registry could be asked for a digest where this was written).
LOCAL_PATH_HELPER_IMAGE = "docker.io/library/busybox:1.37.0"

# Hybrid nodes (infra/hybrid/gateway.py). The WireGuard gateway boots the AL2023 AMI this
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
