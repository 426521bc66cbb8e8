"""Kubeflow Trainer v2 beside the training operator v1 and the MPI operator, the JobSet it runs on,
and Kueue's TrainJob integration: upstream's rules the tests check the platform against, written
down from source.

Sources (snapshots fetched 2026-11-26; each rule names its file):
- kubeflow/trainer tag v2.3.0 (commit 658725bdae5c7e3a0854d93ac6ff492e109a22ab) and tag v1.9.4
  (commit 4445c12aa62e4345b0c2c6ac9b215a70eca46ed7, the v1 line)
- kubernetes-sigs/jobset tag v0.12.0 (commit f22e565ac3cc3265c7c45ef67ecffdc689af5d77)
- kubeflow/mpi-operator tag v0.8.0 (commit 101db144e019e1de65aaded07745e9d805c2852a)
- kubernetes-sigs/kueue at KUEUE_CHART (commit 8eab68778fc1b52affe165fdf5af29d1e9b4f3cb)

Coexistence. The four installs create nothing under one another's names (INSTALLS below):
different API groups and CRDs, namespaces, webhook configurations and cluster roles; no webhook
of one intercepts another's kinds (each rule lists only its own group's resources; JobSet's pod
webhooks select only pods labelled with a JobSet name). The one overlap upstream has, the MPIJob
CRD of both v1 projects, is removed by deploy/manifests/training-operator. Kueue's own e2e setup
runs the training operator, Trainer v2 (its `manager` overlay) and the MPI operator in one cluster
(hack/testing/e2e-common.sh, install_kubeflow_trainer l.1105-1143 and l.738-745).

What else the platform relies on:
- The `manager` overlay (manifests/overlays/manager/kustomization.yaml) installs the CRDs, the
  controller, its RBAC and webhooks, and manifests/third-party/jobset, whose kustomization names
  https://github.com/kubernetes-sigs/jobset/releases/download/v0.12.0/manifests.yaml (the output of
  `kustomize build config/default` at that tag: jobset Makefile, target `artifacts`), with its
  jobset-system namespace deleted so it lands in kubeflow-system. Upstream's ClusterTrainingRuntimes
  come only from manifests/overlays/runtimes.
- A TrainJob is validated against its runtime, which must exist first (pkg/runtime/core/
  clustertrainingruntime.go ValidateObjects: "specified clusterTrainingRuntime must be created
  before the TrainJob is created"). spec.trainer, spec.runtimeRef and most of runtimePatches are
  immutable (the TrainJob CRD's `self == oldSelf` rules): a changed job is a new object.
- The torch plugin (pkg/runtime/framework/plugins/torch/torch.go EnforceMLPolicy l.110-) sets
  PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR (<job>-node-0-0.<job>) and
  PET_MASTER_PORT (29500), which torchrun reads as its arguments, on the container named `node`
  of the replicated job labelled trainer.kubeflow.org/trainjob-ancestor-step=trainer, only when the
  TrainJob has a `spec.trainer` (l.139). numProcPerNode "auto" on a pod without GPUs becomes its
  CPU request (l.133). A TrainJob may not set those env names itself (Validate).
- JobSet labels every pod with jobset.sigs.k8s.io/jobset-name = the JobSet's, i.e. the TrainJob's,
  name (jobset pkg/controllers/jobset_controller.go labelAndAnnotateObject l.1014-1020; the Trainer
  names the JobSet after the TrainJob: plugins/jobset/jobset.go Build).
- A runtime's template reaches a TrainJob while its JobSet is built: the Trainer re-applies the
  JobSet from the live runtime on every reconcile (pkg/controller/trainjob_controller.go
  reconcileObjects l.142-152) but leaves an existing, unsuspended JobSet alone (plugins/jobset/
  jobset.go Build l.330-338: "Do not update the JobSet if it already exists and is not suspended").
  Kueue, however, computes a TrainJob's pod sets from the live runtime (pkg/controller/jobs/
  trainjob/trainjob_controller.go getChildJobSet l.146, getRuntimeSpec l.199) and, when they no
  longer match the admitted Workload's containers (pkg/util/equality/podset.go
  comparePodTemplate), suspends the running job and re-creates its Workload (pkg/controller/
  jobframework/reconciler.go ensureOneWorkload l.1085-1106, EquivalentToWorkload l.1420): the job
  restarts, and its new JobSet is built from the runtime as it now is. A change to a runtime's
  containers therefore restarts every running TrainJob on it that does not override the changed
  field itself (its own spec.trainer.image, args, env), at Kueue's next reconcile of each.
- Kueue at KUEUE_CHART is built against the Trainer API v2.2.1 (go.mod l.14) and writes TrainJobs
  with full updates (trainjob_controller.go RunWithPodSetsInfo l.283, Stop): the only TrainJob field
  v2.3 added, runtimePatches[].…podSpec.terminationGracePeriodSeconds, would be dropped. The
  platform never sets it: the grace period comes from the runtime's pod template.
- The trainjob integration is one of Kueue's defaults (charts/kueue/values.yaml l.179;
  FrameworkName in trainjob_controller.go l.54), so a list replacing them must name it; its
  webhooks mtrainjob.kb.io / vtrainjob.kb.io are in the chart either way (templates/webhook/
  manifests.yaml l.592, l.1255).
"""

from dataclasses import dataclass

TRAINER_VERSION = "v2.3.0"
# manifests/third-party/jobset/kustomization.yaml at each Trainer tag: the JobSet release it pulls.
JOBSET_OF_TRAINER = {"v2.3.0": "v0.12.0"}
# The overlay that installs the controller, its CRDs and webhooks (and JobSet), not the runtimes.
MANAGER_OVERLAY = "manifests/overlays/manager"
RUNTIMES_OVERLAY = "manifests/overlays/runtimes"


@dataclass(frozen=True)
class Install:
    """What one upstream install creates that another could collide with."""

    namespace: str
    crds: frozenset[str]
    webhook_configurations: frozenset[str]
    cluster_roles: frozenset[str]


INSTALLS = {
    # kubeflow/trainer v2.3.0: manifests/overlays/manager/namespace.yaml; base/crds; the webhook
    # configurations as patch_mutating.yaml / patch_validating.yaml rename them, and as the
    # controller patches their CA bundles (cmd/trainer-controller-manager/main.go l.52-53);
    # base/rbac/role.yaml.
    "trainer": Install(
        "kubeflow-system",
        frozenset(
            f"{plural}.trainer.kubeflow.org"
            for plural in ("trainjobs", "trainingruntimes", "clustertrainingruntimes")
        ),
        frozenset({"validator.trainer.kubeflow.org", "defaulter.trainer.kubeflow.org"}),
        frozenset({"kubeflow-trainer-controller-manager"}),
    ),
    # kubernetes-sigs/jobset v0.12.0 config/default (namePrefix jobset-), through the Trainer's
    # third-party/jobset into kubeflow-system; config/components/crd/bases; webhook/manifests.yaml;
    # rbac/*.yaml.
    "jobset": Install(
        "kubeflow-system",
        frozenset({"jobsets.jobset.x-k8s.io"}),
        frozenset(
            {"jobset-mutating-webhook-configuration", "jobset-validating-webhook-configuration"}
        ),
        frozenset(
            f"jobset-{name}"
            for name in (
                "manager-role",
                "metrics-reader",
                "proxy-role",
                "jobset-editor-role",
                "jobset-viewer-role",
            )
        ),
    ),
    # kubeflow/trainer v1.9.4: manifests/overlays/standalone (namespace kubeflow); base/crds
    # (mpijobs deleted by deploy/manifests/training-operator); base/webhook/patch.yaml;
    # base/rbac/role.yaml.
    "training-operator": Install(
        "kubeflow",
        frozenset(
            f"{plural}.kubeflow.org"
            for plural in ("pytorchjobs", "tfjobs", "xgboostjobs", "paddlejobs", "jaxjobs")
        ),
        frozenset({"validator.training-operator.kubeflow.org"}),
        frozenset({"training-operator"}),
    ),
    # kubeflow/mpi-operator v0.8.0: manifests/overlays/standalone (namespace mpi-operator);
    # base/kubeflow.org_mpijobs.yaml; no webhooks; base/cluster-role.yaml.
    "mpi-operator": Install(
        "mpi-operator",
        frozenset({"mpijobs.kubeflow.org"}),
        frozenset(),
        frozenset(
            {
                "mpi-operator",
                "kubeflow-mpijobs-admin",
                "kubeflow-mpijobs-edit",
                "kubeflow-mpijobs-view",
            }
        ),
    ),
}

# Kueue at KUEUE_CHART, pkg/controller/jobs/trainjob/trainjob_controller.go l.54.
KUEUE_TRAINJOB_FRAMEWORK = "trainer.kubeflow.org/trainjob"

# The runtime contract (kubeflow/trainer v2.3.0 pkg/constants/constants.go): the trainer's
# replicated job and its container are named `node` (Node), the replicated job carries the ancestor
# label (LabelTrainJobAncestor = AncestorTrainer), and the SDK lists only runtimes labelled with a
# framework (kubeflow SDK backends/kubernetes/backend.py list_runtimes, RUNTIME_FRAMEWORK_LABEL).
NODE = "node"
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
ANCESTOR_TRAINER = "trainer"
FRAMEWORK_LABEL = "trainer.kubeflow.org/framework"
# torch.go: what the plugin sets on the `node` container; a TrainJob may not set them.
TORCHRUN_ENV = (
    "PET_NNODES",
    "PET_NPROC_PER_NODE",
    "PET_NODE_RANK",
    "PET_MASTER_ADDR",
    "PET_MASTER_PORT",
)
# jobset v0.12.0 api/jobset/v1alpha2/jobset_types.go JobSetNameKey.
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"


def collisions() -> list[str]:
    """Names two installs both create (empty: they coexist)."""
    found = []
    names = list(INSTALLS.items())
    for i, (first, a) in enumerate(names):
        for second, b in names[i + 1 :]:
            for what in ("crds", "webhook_configurations", "cluster_roles"):
                for name in sorted(getattr(a, what) & getattr(b, what)):
                    found.append(f"{first} and {second} both create {what} {name}")
    return found
