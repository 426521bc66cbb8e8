"""Kueue's rules that the tests check the platform against, written down from its source
(kubernetes-sigs/kueue, tag v0.19.2, commit 8eab68778fc1b52affe165fdf5af29d1e9b4f3cb; files named
at each rule): the Configuration the manager decodes, the checks it runs on it, the Workload API
(its CRD's names, printer columns, and the conditions Kueue writes) and the Topology API.

Re-read for the pinned v0.20.7 (READ_FOR), whose tag is not in the stored source: at main
ff69552e79ad21652c36caa97038382e55625cf7 (2026-08-22), the newest readable commit of the 0.20 line,
and CHANGELOG-0.20.md (commit 144402ad, the v0.20.0 notes). What changed there for these rules:
UnadmittedWorkloadsObservability is on by default (QuotaReserved=False carries tiered reasons,
WAITING_FOR_QUOTA, instead of Pending), and v1beta1 is no longer served (#14558, after ff69552e).
The Configuration fields the platform sets, the framework names and the Workload's printer
columns are the same at both commits.
"""

import jsonschema

# The Kueue release these rules were last read for: a bump of KUEUE_CHART fails the suite until
# they are read again (infra/kueue/tests/test_kueue.py).
READ_FOR = "0.20.7"

GROUP = "kueue.x-k8s.io"  # the API group of Kueue's own kinds

# -- Configuration (config.kueue.x-k8s.io/v1beta2) ---------------------------------------------
# Kueue decodes its configuration file strictly (pkg/config/config.go: serializer.EnableStrict):
# an unknown field or a value of the wrong JSON type stops the manager. So every struct written
# down field by field here is closed. Structs the platform does not set are plain objects.


def _closed(**properties) -> dict:
    return {"type": "object", "properties": properties, "additionalProperties": False}


STRING = {"type": "string"}
BOOLEAN = {"type": "boolean"}
INTEGER = {"type": "integer"}
OBJECT = {"type": "object"}  # a struct the platform does not set: its fields are not written here
STRINGS = {"type": "array", "items": STRING}
# metav1.Duration decodes with time.ParseDuration (k8s.io/apimachinery v0.36.2,
# pkg/apis/meta/v1/duration.go): a sequence of decimal numbers, each with a unit.
DURATION = {
    "type": "string",
    "pattern": r"^[-+]?(0|([0-9]*(\.[0-9]*)?(ns|us|µs|μs|ms|s|m|h))+)$",
}
# metav1.LabelSelector (apimachinery v0.36.2, pkg/apis/meta/v1/types.go); the operators are
# checked by validation.ValidateLabelSelector, which pkg/config/validation.go runs on it.
LABEL_SELECTOR = _closed(
    matchLabels={"type": "object", "additionalProperties": STRING},
    matchExpressions={
        "type": "array",
        "items": {
            **_closed(
                key=STRING,
                operator={"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                values=STRINGS,
            ),
            "required": ["key", "operator"],
        },
    },
)
# configv1alpha1.LeaderElectionConfiguration (kubernetes/component-base v0.36.2, the version
# Kueue's go.mod requires, config/v1alpha1/types.go).
LEADER_ELECTION = _closed(
    leaderElect=BOOLEAN,
    leaseDuration=DURATION,
    renewDeadline=DURATION,
    retryPeriod=DURATION,
    resourceLock=STRING,
    resourceName=STRING,
    resourceNamespace=STRING,
)

# apis/config/v1beta2/configuration_types.go: every field of Configuration, with the inline
# TypeMeta and ControllerManager merged in, and the structs the platform renders in full.
CONFIGURATION = _closed(
    # metav1.TypeMeta, inline
    apiVersion=STRING,
    kind=STRING,
    namespace=STRING,
    # ControllerManager, inline
    webhook=_closed(port=INTEGER, host=STRING, certDir=STRING),  # ControllerWebhook
    leaderElection=LEADER_ELECTION,
    metrics=_closed(  # ControllerMetrics
        bindAddress=STRING,
        enableClusterQueueResources=BOOLEAN,
        customLabels={"type": "array", "items": OBJECT},
        localQueueMetrics=OBJECT,
    ),
    health=_closed(  # ControllerHealth
        healthProbeBindAddress=STRING,
        readinessEndpointName=STRING,
        livenessEndpointName=STRING,
    ),
    pprofBindAddress=STRING,
    controller=OBJECT,
    tls=OBJECT,
    # Configuration's own fields
    manageJobsWithoutQueueName=BOOLEAN,
    managedJobsNamespaceSelector=LABEL_SELECTOR,
    internalCertManagement=OBJECT,
    waitForPodsReady=_closed(  # WaitForPodsReady
        timeout=DURATION,
        blockAdmission=BOOLEAN,
        requeuingStrategy=_closed(  # RequeuingStrategy
            timestamp={"type": "string", "enum": ["Creation", "Eviction"]},  # RequeuingTimestamp
            backoffLimitCount=INTEGER,
            backoffBaseSeconds=INTEGER,
            backoffMaxSeconds=INTEGER,
        ),
        recoveryTimeout=DURATION,
    ),
    clientConnection=OBJECT,
    integrations=_closed(  # Integrations
        frameworks=STRINGS,
        externalFrameworks=STRINGS,
        labelKeysToCopy=STRINGS,
    ),
    multiKueue=OBJECT,
    fairSharing=OBJECT,
    admissionFairSharing=OBJECT,
    resources=_closed(  # Resources
        quotaCheckStrategy={"type": "string", "enum": ["BlockUndeclared", "IgnoreUndeclared"]},
        excludeResourcePrefixes=STRINGS,
        transformations={"type": "array", "items": OBJECT},
        deviceClassMappings={"type": "array", "items": OBJECT},
    ),
    featureGates={"type": "object", "additionalProperties": BOOLEAN},
    objectRetentionPolicies=OBJECT,
    visibilityServer=OBJECT,
)

# The integrations Kueue registers: the FrameworkName constant of each package under
# pkg/controller/jobs (the same list as Integrations.Frameworks' doc comment).
# pkg/config/validation.go validateIntegrations refuses any other name.
FRAMEWORKS = {
    "batch/job",
    "kubeflow.org/mpijob",
    "ray.io/rayjob",
    "ray.io/rayservice",
    "ray.io/raycluster",
    "jobset.x-k8s.io/jobset",
    "kubeflow.org/paddlejob",
    "kubeflow.org/pytorchjob",
    "kubeflow.org/tfjob",
    "kubeflow.org/xgboostjob",
    "kubeflow.org/jaxjob",
    "trainer.kubeflow.org/trainjob",
    "workload.codeflare.dev/appwrapper",
    "sparkoperator.k8s.io/sparkapplication",
    "pod",
    "deployment",
    "statefulset",
    "leaderworkerset.x-k8s.io/leaderworkerset",
}


def configuration_errors(config: dict) -> list[str]:
    """What Kueue would refuse: its strict decoder (CONFIGURATION) and two checks of
    pkg/config/validation.go: validateWaitForPodsReady (a timeout) and validateIntegrations
    (known framework names)."""
    errors = [
        f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
        for e in jsonschema.Draft7Validator(CONFIGURATION).iter_errors(config)
    ]
    ready = config.get("waitForPodsReady")
    if ready is not None and not ready.get("timeout"):
        errors.append("waitForPodsReady.timeout: must be specified")
    unknown = set(config.get("integrations", {}).get("frameworks", [])) - FRAMEWORKS
    errors += [f"integrations.frameworks: {name} is not a framework" for name in sorted(unknown)]
    return errors


# -- Workload (kueue.x-k8s.io) ------------------------------------------------------------------
# apis/kueue/v1beta2/workload_types.go: the kubebuilder markers on Workload (v1beta2 is the
# storage version and, from 0.20, the only one served) and the constants of its conditions.
WORKLOAD_VERSION = "v1beta2"
# The +kubebuilder:printcolumn markers, in order: what `kubectl get workloads` shows.
WORKLOAD_PRINTER_COLUMNS = [
    {"name": "Queue", "type": "string", "jsonPath": ".spec.queueName"},
    {"name": "Reserved in", "type": "string", "jsonPath": ".status.admission.clusterQueue"},
    {
        "name": "Admitted",
        "type": "string",
        "jsonPath": ".status.conditions[?(@.type=='Admitted')].status",
    },
    {
        "name": "Finished",
        "type": "string",
        "jsonPath": ".status.conditions[?(@.type=='Finished')].status",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

# Condition types.
QUOTA_RESERVED = "QuotaReserved"  # WorkloadQuotaReserved
ADMITTED = "Admitted"  # WorkloadAdmitted
PODS_READY = "PodsReady"  # WorkloadPodsReady
EVICTED = "Evicted"  # WorkloadEvicted
REQUEUED = "Requeued"  # WorkloadRequeued
# Reasons. QuotaReserved=True and Admitted=True carry their type as the reason
# (pkg/workload/workload.go SetQuotaReservation; pkg/workload/admissionchecks.go).
PENDING = "Pending"  # WorkloadPending: the fallback reason, e.g. a workload evicted
# QuotaReserved=False while no quota fits: the tiered reason of the UnadmittedWorkloadsObservability
# gate, on by default since 0.20 (pkg/features/kube_features.go; apis/kueue/v1beta2/
# workload_types.go WorkloadQuotaReservedReasonWaitingForQuota; flavorassigner.go noFitReason)
WAITING_FOR_QUOTA = "WaitingForQuota"
WAIT_FOR_START = "WaitForStart"  # WorkloadWaitForStart: PodsReady=False, never ready yet
PODS_READY_TIMEOUT = "PodsReadyTimeout"  # WorkloadEvictedByPodsReadyTimeout
DEACTIVATED = "Deactivated"  # WorkloadDeactivated
REQUEUING_LIMIT_EXCEEDED = "RequeuingLimitExceeded"  # WorkloadRequeuingLimitExceeded


def reason_with_cause(reason: str, cause: str) -> str:
    """pkg/workload/patching/patching.go ReasonWithCause: the Evicted reason of a workload
    deactivated for a cause (pkg/workload/evict/evict.go)."""
    return f"{reason}DueTo{cause}"


def workload_crd() -> dict:
    """A CustomResourceDefinition for Workloads as the local Kubernetes API needs it: the names,
    scope, served versions, status subresource and printer columns of Kueue's (the markers on
    Workload in workload_types.go), and a schema that keeps every field, as the tests need
    Kueue's objects stored, not Kueue's schema enforced."""
    version = {
        "served": True,
        "subresources": {"status": {}},
        "additionalPrinterColumns": WORKLOAD_PRINTER_COLUMNS,
        "schema": {
            "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"workloads.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": "Workload",
                "listKind": "WorkloadList",
                "plural": "workloads",
                "singular": "workload",
                "shortNames": ["kwl", "kueueworkload", "kueueworkloads"],
            },
            "scope": "Namespaced",
            "versions": [
                {**version, "name": WORKLOAD_VERSION, "storage": True},
            ],
        },
    }


# -- Topology (kueue.x-k8s.io/v1beta2) ----------------------------------------------------------
# apis/kueue/v1beta2/topology_types.go: Topology is cluster-scoped; TopologySpec.levels holds 1
# to 16 TopologyLevels, each a node label name (+kubebuilder markers MinItems, MaxItems,
# MinLength, MaxLength, Pattern), with three rules the API server checks (its XValidation
# markers): the levels change only while kubernetes.io/hostname is the lowest before and after, no
# level repeats, and kubernetes.io/hostname may only be the last. The rules are written here as
# our own CEL, with upstream's messages.
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
# A qualified name: an optional DNS subdomain prefix and "/", then a name of alphanumerics, '-',
# '_' and '.', starting and ending alphanumeric (k8s.io/apimachinery validation IsQualifiedName).
QUALIFIED_NAME = rf"^({_DNS_LABEL}(\.{_DNS_LABEL})*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
HOSTNAME_LABEL = "kubernetes.io/hostname"


def topology_crd() -> dict:
    """The Topology CRD's v1beta2 version as the tests validate rendered Topologies against it
    (infra/core/tests/crd_schema.py); its v1beta1 version, no longer served from 0.20, is not
    written down."""
    level = {
        "type": "object",
        "required": ["nodeLabel"],
        "properties": {
            "nodeLabel": {
                "type": "string",
                "minLength": 1,
                "maxLength": 316,
                "pattern": QUALIFIED_NAME,
            }
        },
    }
    levels = {
        "type": "array",
        "minItems": 1,
        "maxItems": 16,
        "items": level,
        "x-kubernetes-list-type": "atomic",
        "x-kubernetes-validations": [
            # 0.20 line (main ff69552e, #13910; v0.19.2: immutable outright).
            {
                "rule": f"self == oldSelf || (self[size(self) - 1].nodeLabel == '{HOSTNAME_LABEL}'"
                f" && oldSelf[size(oldSelf) - 1].nodeLabel == '{HOSTNAME_LABEL}')",
                "message": f"levels are mutable only when {HOSTNAME_LABEL} is the lowest level "
                "both before and after the change",
            },
            {
                "rule": "self.all(i, self.exists_one(j, j.nodeLabel == i.nodeLabel))",
                "message": "must be unique",
            },
            {
                "rule": f"!self.exists(l, l.nodeLabel == '{HOSTNAME_LABEL}') || "
                f"self[size(self) - 1].nodeLabel == '{HOSTNAME_LABEL}'",
                "message": f"the {HOSTNAME_LABEL} label can only be used at the lowest level "
                "of topology",
            },
        ],
    }
    schema = {
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": {"type": "object", "required": ["levels"], "properties": {"levels": levels}},
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"topologies.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": {"kind": "Topology", "plural": "topologies", "shortNames": ["topo"]},
            "scope": "Cluster",
            "versions": [
                {
                    "name": "v1beta2",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }
