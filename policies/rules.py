"""CrossGuard rules for the platform, importable without starting a policy server.

Each rule is a pulumi_policy policy object; `policies/__main__.py` bundles them into the pack that
`pulumi preview --policy-pack policies` runs, and `policies/offline.py` runs the same objects over
the offline plan. Rules read resource inputs, so they hold for the real engine and for the plan.
"""

import json
from collections.abc import Callable, Iterable
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

from infra.catalog import RegionPrices, UnpricedError, load_prices

MANDATORY = EnforcementLevel.MANDATORY
LOG_TYPES = {"api", "audit", "authenticator", "controllerManager", "scheduler"}
WORLD = {"0.0.0.0/0", "::/0"}
JOB_TYPES = {"kubernetes:kubeflow.org/v1:PyTorchJob", "kubernetes:kubeflow.org/v2beta1:MPIJob"}
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
DEFAULTS = {"budgetUsdPerHour": 1000, "productionStacks": ["prod"], "allowedPublicIngress": []}


def config_of(args) -> dict[str, Any]:
    return {**DEFAULTS, **(args.get_config() or {})}


def stack_of(urn: str) -> str:
    return urn.split("::")[0].removeprefix("urn:pulumi:")


def resource_rule(
    name: str,
    description: str,
    types: set[str] | Callable[[str], bool],
    check: Callable[[dict, ResourceValidationArgs], Iterable[str]],
    config: dict | None = None,
) -> ResourceValidationPolicy:
    """A mandatory resource policy that applies `check` to resources of `types`."""
    applies = types if callable(types) else types.__contains__

    def validate(args: ResourceValidationArgs, report: ReportViolation) -> None:
        if applies(args.resource_type):
            for message in check(args.props or {}, args):
                report(message)

    schema = PolicyConfigSchema(properties=config) if config else None
    return ResourceValidationPolicy(
        name=name,
        description=description,
        validate=validate,
        enforcement_level=MANDATORY,
        config_schema=schema,
    )


def _encrypted(props: dict, args: ResourceValidationArgs) -> Iterable[str]:
    kind = args.resource_type
    if (
        kind in {"aws:ebs/volume:Volume", "aws:efs/fileSystem:FileSystem"}
        and props.get("encrypted") is not True
    ):
        yield "encrypted must be true"
    if (
        kind
        == "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration"
    ):
        algorithms = [
            r.get("applyServerSideEncryptionByDefault", {}).get("sseAlgorithm")
            for r in props.get("rules", [])
        ]
        if not algorithms or not all(
            a in {"AES256", "aws:kms", "aws:kms:dsse"} for a in algorithms
        ):
            yield f"S3 default encryption must be AES256 or aws:kms, got {algorithms}"
    if kind == "eks:index:Cluster" and not props.get("encryptionConfigKeyArn"):
        yield "EKS secrets must be envelope-encrypted: set encryptionConfigKeyArn"
    if kind == "aws:eks/cluster:Cluster" and not props.get("encryptionConfig"):
        yield "EKS secrets must be envelope-encrypted: set encryptionConfig"
    if kind == "aws:ec2/launchTemplate:LaunchTemplate":
        for mapping in props.get("blockDeviceMappings") or []:
            if str((mapping.get("ebs") or {}).get("encrypted")).lower() != "true":
                yield f"volume {mapping.get('deviceName')} must be encrypted"
    if kind == "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass":
        for mapping in (props.get("spec") or {}).get("blockDeviceMappings") or []:
            if (mapping.get("ebs") or {}).get("encrypted") is not True:
                yield f"volume {mapping.get('deviceName')} must be encrypted"
    if (
        kind == "kubernetes:storage.k8s.io/v1:StorageClass"
        and props.get("provisioner") == "ebs.csi.aws.com"
    ):
        if (props.get("parameters") or {}).get("encrypted") != "true":
            yield 'EBS StorageClass must set parameters.encrypted: "true"'


def _ingress(props: dict, args: ResourceValidationArgs) -> Iterable[str]:
    if args.name in config_of(args)["allowedPublicIngress"]:
        return
    kind = args.resource_type
    if kind == "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule":
        cidrs = {props.get("cidrIpv4"), props.get("cidrIpv6")}
    elif kind == "aws:ec2/securityGroupRule:SecurityGroupRule" and props.get("type") == "ingress":
        cidrs = set(props.get("cidrBlocks") or []) | set(props.get("ipv6CidrBlocks") or [])
    elif kind == "aws:ec2/securityGroup:SecurityGroup":
        cidrs = {
            c
            for rule in props.get("ingress") or []
            for c in (rule.get("cidrBlocks") or []) + (rule.get("ipv6CidrBlocks") or [])
        }
    else:
        return
    if cidrs & WORLD:
        open_to = ", ".join(sorted(cidrs & WORLD))
        yield f"ingress open to {open_to}; allow it by name in allowedPublicIngress"


def _endpoint(props: dict, args: ResourceValidationArgs) -> Iterable[str]:
    if stack_of(args.urn) not in config_of(args)["productionStacks"]:
        return
    if args.resource_type == "aws:eks/cluster:Cluster":
        props = {**props, **(props.get("vpcConfig") or {})}
    public = props.get("endpointPublicAccess", True)
    cidrs = set(props.get("publicAccessCidrs") or ["0.0.0.0/0"])
    if public and cidrs & WORLD:
        yield (
            "production EKS endpoint is public to the world: restrict publicAccessCidrs or "
            "disable public access"
        )


def _logging(props: dict, args: ResourceValidationArgs) -> Iterable[str]:
    missing = LOG_TYPES - set(props.get("enabledClusterLogTypes") or [])
    if missing:
        yield f"control-plane log types missing: {', '.join(sorted(missing))}"


def _imds(props: dict, args: ResourceValidationArgs) -> Iterable[str]:
    options = (props.get("spec") or {}).get("metadataOptions") or {}
    if options.get("httpTokens") != "required" or options.get("httpPutResponseHopLimit") != 1:
        yield "metadataOptions must set httpTokens: required and httpPutResponseHopLimit: 1"


def _gpu_limits(props: dict, args: ResourceValidationArgs) -> Iterable[str]:
    template = (props.get("spec") or {}).get("template") or {}
    taints = (template.get("spec") or {}).get("taints") or []
    if any(t.get("key") == "nvidia.com/gpu" for t in taints):
        limits = (props.get("spec") or {}).get("limits") or {}
        missing = [k for k in ("nodes", "nvidia.com/gpu") if k not in limits]
        if missing:
            yield f"GPU NodePool needs limits {', '.join(missing)}"


def _replica_templates(props: dict) -> list[dict]:
    spec = props.get("spec") or {}
    replicas = spec.get("pytorchReplicaSpecs") or spec.get("mpiReplicaSpecs") or {}
    return [r.get("template") or {} for r in replicas.values()]


def _queue_label(props: dict, args: ResourceValidationArgs) -> Iterable[str]:
    if not ((props.get("metadata") or {}).get("labels") or {}).get(QUEUE_LABEL):
        yield f"job must carry the {QUEUE_LABEL} label so Kueue admits it"


def _training_pods(props: dict, args: ResourceValidationArgs) -> Iterable[str]:
    for template in _replica_templates(props):
        pod = template.get("spec") or {}
        memory_volumes = {
            v["name"]
            for v in pod.get("volumes") or []
            if (v.get("emptyDir") or {}).get("medium") == "Memory"
        }
        for container in pod.get("containers") or []:
            mounts = {
                m.get("mountPath"): m.get("name") for m in container.get("volumeMounts") or []
            }
            if mounts.get("/dev/shm") not in memory_volumes:
                yield f"container {container.get('name')} must mount a memory emptyDir at /dev/shm"
        annotations = (template.get("metadata") or {}).get("annotations") or {}
        if annotations.get("karpenter.sh/do-not-disrupt") != "true":
            yield 'training pods must be annotated karpenter.sh/do-not-disrupt: "true"'


def _pinned(props: dict, args: ResourceValidationArgs) -> Iterable[str]:
    kind = args.resource_type
    if kind == "kubernetes:helm.sh/v3:Release" and not props.get("version"):
        yield f"Helm chart {props.get('chart')} must pin a version"
    if kind == "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass":
        for term in (props.get("spec") or {}).get("amiSelectorTerms") or []:
            if str(term.get("alias", "")).endswith("@latest"):
                yield "AMI alias must pin a release, not @latest"
    if kind in JOB_TYPES:
        for template in _replica_templates(props):
            for container in (template.get("spec") or {}).get("containers") or []:
                if "@sha256:" not in str(container.get("image")):
                    yield f"job image {container.get('image')} must be referenced by digest"


def _iam_statements(props: dict) -> list[dict]:
    documents = [props.get("policy")] + [p.get("policy") for p in props.get("inlinePolicies") or []]
    statements = []
    for document in documents:
        if isinstance(document, str) and document:
            parsed = json.loads(document).get("Statement", [])
            statements += parsed if isinstance(parsed, list) else [parsed]
    return statements


def _no_star(props: dict, args: ResourceValidationArgs) -> Iterable[str]:
    for statement in _iam_statements(props):
        actions = statement.get("Action", [])
        resources = statement.get("Resource", [])
        actions = [actions] if isinstance(actions, str) else actions
        resources = [resources] if isinstance(resources, str) else resources
        if statement.get("Effect") == "Allow" and {"*", "*:*"} & set(actions) and "*" in resources:
            yield "IAM statement allows action * on resource *"


def _scan_on_push(props: dict, args: ResourceValidationArgs) -> Iterable[str]:
    if not (props.get("imageScanningConfiguration") or {}).get("scanOnPush"):
        yield "ECR repository must scan images on push"


def node_pool_cost_per_hour(props: dict, prices: RegionPrices) -> float:
    """limits.nodes x the dearest instance type the NodePool may launch (on-demand, in-region)."""
    spec = props.get("spec") or {}
    types = next(
        (
            r.get("values", [])
            for r in ((spec.get("template") or {}).get("spec") or {}).get("requirements", [])
            if r.get("key") == "node.kubernetes.io/instance-type"
        ),
        [],
    )
    nodes = int((spec.get("limits") or {}).get("nodes", 0))
    return nodes * max((prices.instance(t) for t in types), default=0.0)


def _region(args: StackValidationArgs) -> str | None:
    """The policy config's `region`, else the stack's AWS provider's, else its subnets' AZs'."""
    regions = [config_of(args).get("region")]
    for r in args.resources:
        props = r.props or {}
        if r.resource_type == "pulumi:providers:aws":
            regions.append(props.get("region"))
        elif r.resource_type == "aws:ec2/subnet:Subnet" and props.get("availabilityZone"):
            regions.append(props["availabilityZone"][:-1])  # us-west-2a -> us-west-2
    return next(filter(None, regions), None)


def _budget(args: StackValidationArgs, report: ReportViolation) -> None:
    budget = float(config_of(args)["budgetUsdPerHour"])
    pools = [r for r in args.resources if r.resource_type == "kubernetes:karpenter.sh/v1:NodePool"]
    if not pools:
        return
    region = _region(args)
    if region is None:
        report('no region to price NodePools in: set "region" in the policy pack config')
        return
    try:
        prices = load_prices(region)
        total = sum(node_pool_cost_per_hour(r.props or {}, prices) for r in pools)
    except UnpricedError as e:
        report(f"cannot price the NodePools: {e}")
        return
    if total > budget:
        report(f"NodePool cost ceiling ${total:,.2f}/hour exceeds the budget ${budget:,.2f}/hour")


def _s3_private_and_tls(args: StackValidationArgs, report: ReportViolation) -> None:
    guards: dict[str, set[str]] = {}
    for resource in args.resources:
        for dependency in resource.dependencies or []:
            props = resource.props or {}
            if (
                resource.resource_type == "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock"
                and all(
                    props.get(k) is True
                    for k in (
                        "blockPublicAcls",
                        "blockPublicPolicy",
                        "ignorePublicAcls",
                        "restrictPublicBuckets",
                    )
                )
            ):
                guards.setdefault(dependency.urn, set()).add("public-access-block")
            if (
                resource.resource_type == "aws:s3/bucketPolicy:BucketPolicy"
                and "aws:SecureTransport" in str(props.get("policy"))
            ):
                guards.setdefault(dependency.urn, set()).add("tls-only")
    for bucket in (r for r in args.resources if r.resource_type == "aws:s3/bucket:Bucket"):
        missing = {"public-access-block", "tls-only"} - guards.get(bucket.urn, set())
        if missing:
            report(f"bucket {bucket.name} lacks {', '.join(sorted(missing))}", bucket.urn)


EKS = {"eks:index:Cluster", "aws:eks/cluster:Cluster"}
POLICIES = [
    resource_rule(
        "storage-encrypted",
        "EBS, EFS, S3, launch templates, node classes and EKS secrets are encrypted",
        lambda t: True,
        _encrypted,
    ),
    resource_rule(
        "no-world-ingress",
        "No security group ingress from 0.0.0.0/0 or ::/0 unless allowed by name",
        lambda t: t.startswith("aws:"),
        _ingress,
        {"allowedPublicIngress": {"type": "array", "items": {"type": "string"}}},
    ),
    resource_rule(
        "eks-endpoint-not-public-in-production",
        "Production EKS API endpoints are not open to the world",
        EKS,
        _endpoint,
        {"productionStacks": {"type": "array", "items": {"type": "string"}}},
    ),
    resource_rule(
        "eks-control-plane-logging", "All five EKS control-plane log types are on", EKS, _logging
    ),
    resource_rule(
        "karpenter-imdsv2",
        "Karpenter nodes require IMDSv2 with hop limit 1",
        {"kubernetes:karpenter.k8s.aws/v1:EC2NodeClass"},
        _imds,
    ),
    resource_rule(
        "gpu-nodepool-limits",
        "Every GPU NodePool limits nodes and nvidia.com/gpu",
        {"kubernetes:karpenter.sh/v1:NodePool"},
        _gpu_limits,
    ),
    resource_rule(
        "kueue-queue-label", "Every training job names its Kueue queue", JOB_TYPES, _queue_label
    ),
    resource_rule(
        "training-pod-hygiene",
        "Training pods mount /dev/shm as memory and are not disrupted mid-run",
        JOB_TYPES,
        _training_pods,
    ),
    resource_rule(
        "images-pinned",
        "Charts pin versions, AMIs pin releases, job images are digests",
        lambda t: True,
        _pinned,
    ),
    resource_rule(
        "no-iam-star-on-star",
        "No IAM statement allows action * on resource *",
        {"aws:iam/rolePolicy:RolePolicy", "aws:iam/policy:Policy", "aws:iam/role:Role"},
        _no_star,
    ),
    resource_rule(
        "ecr-scan-on-push",
        "ECR repositories scan on push",
        {"aws:ecr/repository:Repository"},
        _scan_on_push,
    ),
    StackValidationPolicy(
        name="s3-private-and-tls-only",
        description="Every bucket blocks public access and denies non-TLS",
        validate=_s3_private_and_tls,
        enforcement_level=MANDATORY,
    ),
    StackValidationPolicy(
        name="cost-budget",
        description="The NodePools' hourly cost ceiling stays under the budget",
        validate=_budget,
        enforcement_level=MANDATORY,
        config_schema=PolicyConfigSchema(
            properties={"budgetUsdPerHour": {"type": "number"}, "region": {"type": "string"}}
        ),
    ),
]
