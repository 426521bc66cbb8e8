"""Every version the platform deploys: Kubernetes, EKS add-ons, Helm charts, images.

Python package versions live in pyproject.toml. Everything the program installs into AWS or the
cluster is pinned here, so an upgrade is one reviewed diff. Refresh EKS add-on builds with
`aws eks describe-addon-versions --kubernetes-version <k8s> --addon-name <name>`.
"""

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
