"""Workload rules: training pods queued, pinned, restricted and inside their pool's GPUs;
namespaces at Pod Security restricted; images scanned and immutable."""

from collections.abc import Iterable, Mapping
from typing import Any

from pulumi_policy import ReportViolation, ResourceValidationArgs, StackValidationArgs

from infra.core.catalog import load_catalog
from infra.core.declared import dig, listed
from infra.core.nodes import POOL_LABEL
from policies.rules.base import (
    GPU,
    NODECLASS,
    NODEPOOL,
    TRAINING_POD_TYPES,
    TRAINJOB,
    containers_of,
    is_unknown,
    node_pool_types,
    pod_templates,
    present,
    spec_of,
)

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
TEAM_LABEL = "training-platform/team"
# Capabilities Pod Security "baseline" allows a container to add (Kubernetes pod security
# standards); anything else (SYS_ADMIN, NET_ADMIN, ALL, ...) is host access.
BASELINE_CAPABILITIES = {
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
}
# The one exception to "restricted", known by its shape rather than its name: an init container
# preparing a volume for the non-root trainer (workloads.manifests.checkpoint_dir_init, chown of
# its folder on FSx) may run as root, all capabilities dropped but these, without escalation.
VOLUME_PREPARER_CAPABILITIES = {"CHOWN", "DAC_OVERRIDE"}


def queue_label(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    if not dig(props, "metadata", "labels", QUEUE_LABEL):
        yield f"job must carry the {QUEUE_LABEL} label so Kueue admits it"


def training_pods(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    for template in pod_templates(props, args.resource_type):
        pod = template.get("spec") or {}
        memory_volumes = {
            v.get("name")
            for v in listed(pod.get("volumes"))
            if dig(v, "emptyDir", "medium") == "Memory"
        }
        for container in listed(pod.get("containers")):
            mounts = {
                m.get("mountPath"): m.get("name") for m in listed(container.get("volumeMounts"))
            }
            if mounts.get("/dev/shm") not in memory_volumes:
                yield f"container {container.get('name')} must mount a memory emptyDir at /dev/shm"
        if dig(template, "metadata", "annotations", "karpenter.sh/do-not-disrupt") != "true":
            yield 'training pods must be annotated karpenter.sh/do-not-disrupt: "true"'


def pinned(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    kind = args.resource_type
    if kind == "kubernetes:helm.sh/v3:Release" and not props.get("version"):
        yield f"Helm chart {props.get('chart')} must pin a version"
    if kind == NODECLASS:
        for term in listed(spec_of(props).get("amiSelectorTerms")):
            if str(term.get("alias", "")).endswith("@latest"):
                yield "AMI alias must pin a release, not @latest"
    runs = [
        container
        for template in pod_templates(props, kind)
        for container in listed(dig(template, "spec", "containers"))
    ]
    if kind == TRAINJOB and present(dig(props, "spec", "trainer") or {}, "image"):
        runs.append(dig(props, "spec", "trainer"))  # its own image, over its runtime's
    for container in runs:
        # Unknown in a preview only when this update builds the image: the program then makes
        # it `<repository>@<digest>`, and the update phase checks the real value.
        if present(container, "image") and is_unknown(container, "image"):
            continue
        if "@sha256:" not in str(container.get("image")):
            yield f"job image {container.get('image')} must be referenced by digest"


def pod_specs(props: Mapping, kind: str) -> list[Mapping]:
    return [template.get("spec") or {} for template in pod_templates(props, kind)]


def host_access(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    for pod in pod_specs(props, args.resource_type):
        for key in ("hostNetwork", "hostPID", "hostIPC"):
            if pod.get(key) is True:
                yield f"pod sets {key}"
        for volume in listed(pod.get("volumes")):
            if volume.get("hostPath") is not None:
                yield f"pod mounts hostPath volume {volume.get('name')}"
        for container in containers_of(pod):
            context = container.get("securityContext") or {}
            if context.get("privileged") is True:
                yield f"container {container.get('name')} is privileged"
            added = sorted(set(map(str, listed(dig(context, "capabilities", "add")))))
            beyond = [c for c in added if c not in BASELINE_CAPABILITIES]
            if beyond:
                yield f"container {container.get('name')} adds capabilities {beyond}"


def restricted(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    # Pod Security "restricted" as upstream checks it (kubernetes/pod-security-admission,
    # policy/check_runAsNonRoot.go, check_runAsUser.go, check_allowPrivilegeEscalation.go,
    # check_capabilities_restricted.go, check_seccompProfile_restricted.go): on containers and
    # init containers alike.
    for pod in pod_specs(props, args.resource_type):
        pod_context = pod.get("securityContext") or {}
        containers = [(c, False) for c in listed(pod.get("containers"))]
        containers += [(c, True) for c in listed(pod.get("initContainers"))]
        for container, init in containers:
            name = container.get("name")
            context = container.get("securityContext") or {}

            def setting(key: str, context=context, pod_context=pod_context) -> Any:
                value = context.get(key)
                return pod_context.get(key) if value is None else value

            added = sorted(set(map(str, listed(dig(context, "capabilities", "add")))))
            root = setting("runAsNonRoot") is not True or setting("runAsUser") == 0
            if root and not init:
                yield f"container {name} must run as non-root (runAsNonRoot: true)"
            elif root and not set(added) <= VOLUME_PREPARER_CAPABILITIES:
                yield (
                    f"init container {name} runs as root adding {added}; allowed: non-root, or "
                    f"root adding only {', '.join(sorted(VOLUME_PREPARER_CAPABILITIES))}"
                )
            if context.get("allowPrivilegeEscalation") is not False:
                yield f"container {name} must set allowPrivilegeEscalation: false"
            if "ALL" not in listed(dig(context, "capabilities", "drop")):
                yield f"container {name} must drop ALL capabilities"
            beyond = [c for c in added if c not in ("NET_BIND_SERVICE",)]
            if beyond and not (init and root):
                yield f"container {name} adds capabilities {beyond}; allowed: NET_BIND_SERVICE"
            seccomp = dig(context, "seccompProfile", "type") or dig(
                pod_context, "seccompProfile", "type"
            )
            if seccomp not in {"RuntimeDefault", "Localhost"}:
                yield f"container {name} must use the RuntimeDefault seccomp profile"


def namespace_psa(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    labels = dig(props, "metadata", "labels") or {}
    if labels.get(TEAM_LABEL) and labels.get("pod-security.kubernetes.io/enforce") not in {
        "baseline",
        "restricted",
    }:
        yield "team namespace must enforce Pod Security (pod-security.kubernetes.io/enforce)"


def scan_on_push(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    if not dig(props, "imageScanningConfiguration", "scanOnPush"):
        yield "ECR repository must scan images on push"


def immutable_tags(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    if props.get("imageTagMutability") not in {"IMMUTABLE", "IMMUTABLE_WITH_EXCLUSION"}:
        yield "ECR repository tags must be immutable (a tag must always mean one image)"


def job_gpus_fit(args: StackValidationArgs, report: ReportViolation) -> None:
    catalog = load_catalog()
    pool_gpus = {}
    for pool in (r for r in args.resources if r.resource_type == NODEPOOL):
        props = pool.props or {}
        name = dig(props, "metadata", "name") or dig(
            props, "spec", "template", "metadata", "labels", POOL_LABEL
        )
        types = [t for t in node_pool_types(props) if t in catalog]
        pool_gpus[name] = min((catalog[t].gpus for t in types), default=0)
    for job in (r for r in args.resources if r.resource_type in TRAINING_POD_TYPES):
        for template in pod_templates(job.props or {}, job.resource_type):
            pod = template.get("spec") or {}
            pool = dig(pod, "nodeSelector", POOL_LABEL)
            for container in listed(pod.get("containers")):
                wanted = int(dig(container, "resources", "limits", GPU) or 0)
                if wanted and pool in pool_gpus and wanted > pool_gpus[pool]:
                    report(
                        f"container {container.get('name')} asks {wanted} GPUs per pod but pool "
                        f"{pool}'s nodes have {pool_gpus[pool]}; it would never schedule",
                        job.urn,
                    )
