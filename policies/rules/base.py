"""What every rule module shares: the rule builders (resource_rule, stack_rule), reading a
resource's inputs alike from plain data and from pulumi_policy's proxies, and the names of the
resources and labels the rules look at."""

import ipaddress
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pulumi_policy import (
    EnforcementLevel,
    PolicyConfigSchema,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)
from pulumi_policy.proxy import UnknownValueError, _DictProxy
from pulumi_policy.proxy import _is_unknown as _unknown

from infra.core.declared import dig, kind_of, listed, pod_sets
from infra.stack.policy import MANDATORY_PRODUCTION_STACKS

MANDATORY = EnforcementLevel.MANDATORY
TRAINJOB = "kubernetes:trainer.kubeflow.org/v1alpha1:TrainJob"
RUNTIME = "kubernetes:trainer.kubeflow.org/v1alpha1:ClusterTrainingRuntime"
# What Kueue queues: training jobs of every kind.
JOB_TYPES = {
    "kubernetes:kubeflow.org/v1:PyTorchJob",
    "kubernetes:kubeflow.org/v2beta1:MPIJob",
    TRAINJOB,
}
# What holds training pods: the v1 jobs' replica specs and the runtimes TrainJobs run on (a
# TrainJob's pods are its runtime's).
TRAINING_POD_TYPES = (JOB_TYPES - {TRAINJOB}) | {RUNTIME}
NODEPOOL = "kubernetes:karpenter.sh/v1:NodePool"
NODECLASS = "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass"
# Kubernetes kinds that carry a pod template (or are a pod), by Pulumi type token.
POD_TEMPLATE_PATHS = {
    "kubernetes:core/v1:Pod": (),
    "kubernetes:apps/v1:Deployment": ("spec", "template"),
    "kubernetes:apps/v1:StatefulSet": ("spec", "template"),
    "kubernetes:apps/v1:DaemonSet": ("spec", "template"),
    "kubernetes:apps/v1:ReplicaSet": ("spec", "template"),
    "kubernetes:batch/v1:Job": ("spec", "template"),
    "kubernetes:batch/v1:CronJob": ("spec", "jobTemplate", "spec", "template"),
}
GPU = "nvidia.com/gpu"
SSE_CONFIGS = {
    "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
    "aws:s3/bucketServerSideEncryptionConfigurationV2:BucketServerSideEncryptionConfigurationV2",
}
# An ingress range wider than a /8 (IPv4) or /16 (IPv6), after merging a rule's ranges, is the
# internet: 10.0.0.0/8 is the widest a private network needs.
WORLD_OPEN_PREFIX = {4: 7, 6: 15}
DEFAULTS = {
    "budgetUsdPerHour": 1000,
    "productionStacks": list(MANDATORY_PRODUCTION_STACKS),
    "allowedPublicIngress": [],
    "acknowledgedDataLoss": [],
}


def config_of(args) -> dict[str, Any]:
    config = {**DEFAULTS, **(args.get_config() or {})}
    # Config may add production stacks, never drop the mandatory ones.
    config["productionStacks"] = [*MANDATORY_PRODUCTION_STACKS, *config["productionStacks"]]
    return config


def stack_of(urn: str) -> str:
    return urn.split("::")[0].removeprefix("urn:pulumi:")


def in_production(args: ResourceValidationArgs) -> bool:
    return stack_of(args.urn) in config_of(args)["productionStacks"]


def unknown_message(error: UnknownValueError) -> str:
    return (
        f"cannot be checked: {error.message}; a guard that cannot see a value does not pass it "
        "(make the value known at preview, e.g. build the ARN from a name)"
    )


def resource_rule(
    name: str,
    description: str,
    types: set[str] | Callable[[str], bool],
    check: Callable[[Mapping, ResourceValidationArgs], Iterable[str]],
    config: dict | None = None,
) -> ResourceValidationPolicy:
    """A mandatory resource policy that applies `check` to resources of `types`."""
    applies = types if callable(types) else types.__contains__

    def validate(args: ResourceValidationArgs, report: ReportViolation) -> None:
        if not applies(args.resource_type):
            return
        try:
            for message in check(args.props or {}, args):
                report(message)
        except UnknownValueError as e:
            report(unknown_message(e))

    schema = PolicyConfigSchema(properties=config) if config else None
    return ResourceValidationPolicy(
        name=name,
        description=description,
        validate=validate,
        enforcement_level=MANDATORY,
        config_schema=schema,
    )


def stack_rule(
    name: str,
    description: str,
    check: Callable[[StackValidationArgs, ReportViolation], None],
    config: dict | None = None,
) -> StackValidationPolicy:
    def validate(args: StackValidationArgs, report: ReportViolation) -> None:
        try:
            check(args, report)
        except UnknownValueError as e:
            report(unknown_message(e))

    return StackValidationPolicy(
        name=name,
        description=description,
        validate=validate,
        enforcement_level=MANDATORY,
        config_schema=PolicyConfigSchema(properties=config) if config else None,
    )


def present(props: Mapping, key: str) -> bool:
    """Whether `key` is set, known or not: an ARN still to be created is set all the same."""
    raw = props["__target"] if isinstance(props, _DictProxy) else props
    return bool(raw.get(key))


def is_unknown(props: Mapping, key: str) -> bool:
    raw = props["__target"] if isinstance(props, _DictProxy) else props
    return _unknown(raw.get(key))


def spec_of(props: Mapping) -> Mapping:
    return dig(props, "spec") or {}


def statements_of(document: Any) -> list[Mapping]:
    if isinstance(document, str):
        if not document:
            return []
        try:
            document = json.loads(document)
        except json.JSONDecodeError:
            return [{"Effect": "Allow", "Action": "*", "Resource": "*", "_unparsable": True}]
    return [s for s in listed(dig(document, "Statement")) if isinstance(s, Mapping)]


def iam_statements(props: Mapping) -> list[Mapping]:
    documents = [props.get("policy")] + [
        dig(p, "policy") for p in listed(props.get("inlinePolicies"))
    ]
    return [s for document in documents for s in statements_of(document)]


def allows(statement: Mapping) -> bool:
    return statement.get("Effect") == "Allow"


def world_open(cidrs: Iterable[Any]) -> list[str]:
    """The CIDRs (merged per IP version) at least as wide as WORLD_OPEN_PREFIX."""
    networks: dict[int, list] = {4: [], 6: []}
    for cidr in cidrs:
        if not isinstance(cidr, str) or not cidr:
            continue
        try:
            network = ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            continue
        networks[network.version].append(network)
    return [
        str(n)
        for version, group in networks.items()
        for n in ipaddress.collapse_addresses(group)
        if n.prefixlen <= WORLD_OPEN_PREFIX[version]
    ]


def pod_templates(props: Mapping, resource_type: str) -> list[Mapping]:
    if resource_type in TRAINING_POD_TYPES:
        return [template for _, template in pod_sets(kind_of(resource_type), props).values()]
    if resource_type in POD_TEMPLATE_PATHS:
        return [dig(props, *POD_TEMPLATE_PATHS[resource_type]) or {}]
    return []


def containers_of(pod_spec: Mapping) -> list[Mapping]:
    return listed(pod_spec.get("containers")) + listed(pod_spec.get("initContainers"))


def node_pool_types(props: Mapping) -> list[str]:
    for requirement in listed(dig(props, "spec", "template", "spec", "requirements")):
        if requirement.get("key") == "node.kubernetes.io/instance-type":
            return [str(t) for t in listed(requirement.get("values"))]
    return []
