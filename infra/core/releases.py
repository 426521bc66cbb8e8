"""How current every pin is: each pinned release (infra/core/versions.py, and the SDKs of the
requirements files) with its upstream release date, the newest release known on CHECKED, and,
for what the program deploys, what moving a running stack to it does. `python -m deploy.versions`
prints the table (docs/platform/versions.md); the plan prints `moving_here` for every pin that
changes against the deployed stack; a test fails when a pin moves and its entry here does not.

Dates: git tags of the upstream repositories where the stored snapshots reach (about 2026-08-23),
the PyPI index for the SDKs (to about 2026-11-20), release notes and pages for the newer releases
(named in `source`). "unconfirmed" says no first-party source gave the value.
"""

from dataclasses import dataclass

from infra.core import versions as pins

CHECKED = "2026-11-29"
# The stack output that holds deployed(), which the plan compares against the deployed stack's.
VERSIONS_OUTPUT = "platformVersions"


@dataclass(frozen=True)
class Release:
    name: str
    version: str  # as pinned: a test keeps it equal to the pin
    released: str
    newest: str  # the newest release known on CHECKED
    newest_released: str
    source: str
    # What `pulumi up` to this release does to a running stack (empty: not deployed, an SDK).
    moving_here: str = ""

    @property
    def behind(self) -> bool:
        return self.newest not in ("-", self.version)


def _addons() -> list[Release]:
    """The EKS add-on builds of the default Kubernetes version: EKS builds, published by the EKS
    API alone (`aws eks describe-addon-versions`), with no release dates."""
    version = pins.KUBERNETES_VERSIONS[pins.DEFAULT_KUBERNETES_VERSION]
    return [
        Release(
            f"add-on {name} (Kubernetes {pins.DEFAULT_KUBERNETES_VERSION})",
            build,
            "-",
            "-",
            "-",
            "an EKS build: EKS publishes no dates; python -m deploy.preflight compares it with "
            "EKS's default; awslabs/cdk-eks-blueprints 05d3dbd (2026-07-01)"
            + (" [unconfirmed as EKS's default]" if name in version.unconfirmed_addons else ""),
            "EKS updates the add-on in place after the control plane: its DaemonSet or Deployment "
            "rolls node by node; running pods keep their network and volumes",
        )
        for name, build in version.addons.items()
    ]


KUBERNETES = Release(
    "Kubernetes (EKS), default",
    "1.35",
    "2026-01-28 on EKS",
    "1.37",
    "2026-10-02 on EKS",
    "endoflife-date/endoflife.date a70eca3; 1.36 and 1.37: infra/core/versions.py",
    "one minor at a time: the control plane, then add-ons and the system node group, then "
    "every Karpenter node drifts (docs/platform/day-two.md#upgrades)",
)

# What the program deploys, in the order the upgrade runbook bumps them, one pull request each
# (docs/platform/upgrades.md): Karpenter before a Kubernetes minor needs it, the job operators
# before the Kueue that needs them, Kueue, then what runs on the nodes.
PLATFORM = [
    Release(
        "Karpenter (karpenter, karpenter-crd charts)",
        "1.15.1",
        "2026-10-23",
        "1.15.1",
        "2026-10-23",
        "aws/karpenter-provider-aws release v1.15.1; tests/crds/SOURCES.md",
        "karpenter-crd updates the NodePool, NodeClaim and EC2NodeClass CRDs first (schemas: "
        "stored objects stay), then the controller restarts (2 replicas, a PDB): launches pause "
        "for seconds, nodes and pods stay; from 1.15 node repair is a voluntary disruption paced "
        "by each pool's budgets (GPU pools: one node at a time) and may reboot a GPU node before "
        "replacing it; do-not-disrupt still keeps job nodes from consolidation and drift, never "
        "from repair or expiry",
    ),
    Release(
        "MPI operator",
        "v0.8.2",
        "2026-07-03",
        "v0.8.2",
        "2026-07-03",
        "kubeflow/mpi-operator#820 (a maintainer's release comment); branch release-0.8 b10758d",
        "its one controller restarts on the new image; the MPIJob CRD is v0.8.0's byte for byte; "
        "running MPIJobs keep their pods",
    ),
    Release(
        "Kubeflow training operator (v1, PyTorchJob)",
        "v1.9.4",
        "2026-08-18",
        "v1.9.4",
        "2026-08-18",
        "kubeflow/trainer tag v1.9.4, the last release (retired: kubeflow/trainer#3517)",
        "its controller restarts; running PyTorchJobs keep their pods; the PyTorchJob CRD "
        "follows the tag",
    ),
    Release(
        "Kubeflow Trainer (v2, TrainJob)",
        "v2.3.0",
        "2026-08-06",
        "v2.4.0",
        "unknown [unconfirmed]",
        "kubeflow/trainer tag v2.3.0; v2.4.0 held back (docs/users/trainjob.md): no tag or "
        "kubeflow-trainer-api 2.4 readable",
        "its controller and webhooks restart with its CRDs and the JobSet it brings; running "
        "TrainJobs keep their pods",
    ),
    Release(
        "JobSet (with the Trainer)",
        "v0.12.0",
        "2026-05-08",
        "v0.12.0",
        "2026-05-08",
        "kubernetes-sigs/jobset tag v0.12.0; Trainer v2.3.0's third-party kustomization",
        "moves with the Trainer: its controller restarts, running JobSets keep their Jobs",
    ),
    Release(
        "Kueue (kueue chart)",
        "0.20.7",
        "2026-11 [unconfirmed]",
        "0.20.7",
        "2026-11 [unconfirmed]",
        "kubernetes-sigs/kueue CHANGELOG-0.20.md 144402ad; release notes v0.20.1-v0.20.7 "
        "(excerpts) [dates unconfirmed]",
        "first rewrite stored v1beta1 objects as v1beta2 (docs/platform/upgrades.md): 0.20 serves "
        "v1beta2 only; then the chart updates Kueue's CRDs and webhooks and restarts its "
        "controller (2 replicas, a PDB): admission pauses while it restarts, admitted jobs keep "
        "running and their quota; queued jobs read WaitingForQuota instead of Pending",
    ),
    Release(
        "NVIDIA device plugin chart",
        "0.18.0",
        "2025-10-21",
        "0.20.0",
        "2026-08-19",
        "NVIDIA/k8s-device-plugin tags",
        "its DaemonSet rolls node by node: GPUs allocated to running pods stay theirs; a new GPU "
        "pod on a rolling node waits seconds for the plugin to register again",
    ),
    Release(
        "EFA device plugin chart",
        "v0.5.30",
        "2026-07-21",
        "v0.5.32",
        "unknown [unconfirmed]",
        "aws/eks-charts bfe91c4; a newer chart seen in a third party's file",
        "its DaemonSet rolls node by node; running pods keep their EFA interfaces",
    ),
    Release(
        "DCGM exporter chart",
        "4.8.3",
        "2026-07-15 [unconfirmed]",
        "4.8.3",
        "2026-07-15",
        "NVIDIA/dcgm-exporter#712",
        "its DaemonSet rolls node by node: a gap in each node's GPU metrics",
    ),
    Release(
        "kube-prometheus-stack chart",
        "88.6.5",
        "2026-09-03 [unconfirmed]",
        "91.5.0",
        "unknown [unconfirmed]",
        "a third party's changelog; renovate pull requests elsewhere",
        "Prometheus and Grafana restart: a gap in metrics; Helm leaves the chart's CRDs as they "
        "are (a major bump applies them by hand first, as the chart's notes say)",
    ),
    Release(
        "local-path provisioner",
        "v0.0.37",
        "2026-08-05",
        "v0.0.37",
        "2026-08-05",
        "rancher/local-path-provisioner tag v0.0.37",
        "its controller restarts; homes on the machines stay",
    ),
    Release(
        "local-path helper image (busybox)",
        "1.37.0",
        "unknown [unconfirmed]",
        "1.37.0",
        "unknown",
        "Docker Hub library/busybox (not readable here)",
        "only helper pods started afterwards use it",
    ),
    Release(
        "nodeadm (hybrid nodes)",
        "v1.0.20",
        "2026-08-20",
        "v1.0.20",
        "2026-08-20",
        "aws/eks-hybrid tag v1.0.20",
        "only machines bootstrapped afterwards install it; running machines keep theirs",
    ),
    Release(
        "NVIDIA container toolkit (hybrid GPU nodes)",
        "1.18.1-1",
        "2025-11-24",
        "1.20.0",
        "2026-08-12",
        "NVIDIA/nvidia-container-toolkit tags",
        "only machines bootstrapped afterwards install it",
    ),
    Release(
        "Cilium (AWS build, hybrid nodes)",
        "1.18.5-0",
        "unknown [unconfirmed]",
        "1.18.5-0",
        "unknown",
        "aws/eks-hybrid e2e testdata 29b7e2aa",
        "its agents roll machine by machine: pod networking on a machine blips while its agent "
        "restarts",
    ),
    Release(
        "AL2023 node AMI (Karpenter alias)",
        "al2023@v20261020",
        "2026-10-20 [unconfirmed]",
        "al2023@v20261020",
        "2026-10-20",
        "awslabs/amazon-eks-ami (stored to v20260724); deploy.preflight checks it exists",
        "every Karpenter node drifts to the new AMI as the pools' budgets allow (the plan lists "
        "the drift); job nodes wait for their jobs",
    ),
    Release(
        "FSx for Lustre version",
        "2.15",
        "-",
        "2.15",
        "-",
        "FSx for Lustre user guide",
        "a new version replaces the file system: its data is lost unless acknowledged (the plan "
        "refuses it)",
    ),
]

# The SDKs the platform talks through, as the requirements files pin them.
SDKS = [
    Release("pulumi", "3.272.0", "2026-10-22", "3.272.0", "2026-10-22", "PyPI"),
    Release("pulumi-aws", "7.51.1", "2026-10-16", "7.51.1", "2026-10-16", "PyPI"),
    Release("pulumi-eks", "4.4.0", "2026-09-25", "4.4.0", "2026-09-25", "PyPI"),
    Release("pulumi-kubernetes", "4.34.2", "2026-09-21", "4.34.2", "2026-09-21", "PyPI"),
    Release("pulumi-policy", "1.21.0", "2026-05-20", "1.21.0", "2026-05-20", "PyPI"),
    Release("pulumi-docker-build", "0.0.22", "2026-07-30", "0.0.22", "2026-07-30", "PyPI"),
    Release("pulumi-random", "4.21.4", "2026-10-16", "4.21.4", "2026-10-16", "PyPI"),
    Release("kubernetes", "36.0.3", "2026-07-13", "37.0.2", "2026-11-06", "PyPI"),
    Release("kopf", "1.45.2", "2026-10-23", "1.45.2", "2026-10-23", "PyPI"),
    Release(
        "kubeflow",
        "0.4.0",
        "2026-03-20",
        "0.5.0",
        "2026-08-10",
        "PyPI; 0.4.1 and 0.5.0 require kubernetes<36, which the platform's 36.0.3 is not",
    ),
    Release("kubeflow-trainer-api", "2.3.0", "2026-08-07", "2.3.0", "2026-08-07", "PyPI"),
    Release("boto3", "1.44.5", "2026-11-17", "1.44.8", "2026-11-20", "PyPI"),
    Release("torch", "2.13.0", "2026-07-08", "2.15.0", "2026-10-28", "PyPI"),
]


def releases() -> list[Release]:
    return [KUBERNETES, *PLATFORM, *_addons(), *SDKS]


def deployed() -> dict[str, str]:
    """The pins of what the program deploys, by name: the stack output platformVersions. (The
    stack's Kubernetes version and its add-ons move with cluster.kubernetesVersion, which the plan
    names on its own: infra/eks/day_two.py.)"""
    return {r.name: r.version for r in PLATFORM}


def moves(old: dict[str, str], new: dict[str, str]) -> list[str]:
    """What each changed pin does to the running stack, in PLATFORM's order (the upgrade
    runbook's: docs/platform/upgrades.md)."""
    by_name = {r.name: r for r in PLATFORM}
    return [
        f"{name} {old[name]} -> {version}: {by_name[name].moving_here}"
        for name, version in new.items()
        if name in old and old[name] != version and name in by_name
    ]
