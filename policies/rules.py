"""CrossGuard rules for the platform, importable without starting a policy server.

Each rule is a pulumi_policy policy object; `policies/__main__.py` bundles them into the pack that
`pulumi preview --policy-pack policies` runs, and `policies/offline.py` runs the same objects over
the offline plan. Rules read resource inputs, so they hold for the real engine and for the plan.

In a real preview the engine hands each rule its inputs behind pulumi_policy's proxies: reading a
value that is not known yet (an ARN of a resource still to be created) raises UnknownValueError,
which pulumi_policy would turn into an advisory note, i.e. the rule would pass. Every rule here
turns it into a violation instead: a guard that cannot see the value does not pass it.
"""

import ipaddress
import json
import math
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

from infra.catalog import UnpricedError, load_catalog, load_prices
from infra.config import MANDATORY_PRODUCTION_STACKS
from infra.cost import PRICERS, stack_cost
from infra.declared import Declared, dig, listed

MANDATORY = EnforcementLevel.MANDATORY
LOG_TYPES = {"api", "audit", "authenticator", "controllerManager", "scheduler"}
JOB_TYPES = {"kubernetes:kubeflow.org/v1:PyTorchJob", "kubernetes:kubeflow.org/v2beta1:MPIJob"}
MPIJOB = "kubernetes:kubeflow.org/v2beta1:MPIJob"
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
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOB_LABEL = "training-platform/job"
POOL_LABEL = "training-platform/pool"
TEAM_LABEL = "training-platform/team"
GPU = "nvidia.com/gpu"
BUCKETS = {"aws:s3/bucket:Bucket", "aws:s3/bucketV2:BucketV2"}
SSE_CONFIGS = {
    "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
    "aws:s3/bucketServerSideEncryptionConfigurationV2:BucketServerSideEncryptionConfigurationV2",
}
IAM_DOCUMENT_TYPES = {
    "aws:iam/rolePolicy:RolePolicy",
    "aws:iam/policy:Policy",
    "aws:iam/role:Role",
    "aws:iam/userPolicy:UserPolicy",
    "aws:iam/groupPolicy:GroupPolicy",
}
# An ingress range wider than a /8 (IPv4) or /16 (IPv6), after merging a rule's ranges, is the
# internet: 10.0.0.0/8 is the widest a private network needs.
WORLD_OPEN_PREFIX = {4: 7, 6: 15}
READ_VERBS = ("Describe", "Get", "List", "BatchGet", "Search", "Lookup", "View")
BROAD_MANAGED_POLICIES = ("AdministratorAccess", "PowerUserAccess", "IAMFullAccess")
POD_IDENTITY_TAGS = (
    "aws:RequestTag/eks-cluster-name",
    "aws:RequestTag/kubernetes-namespace",
    "aws:RequestTag/kubernetes-service-account",
)
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
PUBLIC_ACLS = {"public-read", "public-read-write", "authenticated-read"}
PUBLIC_GRANTEES = ("AllUsers", "AuthenticatedUsers")
DEFAULTS = {
    "budgetUsdPerHour": 1000,
    "productionStacks": list(MANDATORY_PRODUCTION_STACKS),
    "allowedPublicIngress": [],
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


def _unknown_message(error: UnknownValueError) -> str:
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
            report(_unknown_message(e))

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
            report(_unknown_message(e))

    return StackValidationPolicy(
        name=name,
        description=description,
        validate=validate,
        enforcement_level=MANDATORY,
        config_schema=PolicyConfigSchema(properties=config) if config else None,
    )


# --- helpers that work on plain data and on pulumi_policy's proxies alike -------------------


def _present(props: Mapping, key: str) -> bool:
    """Whether `key` is set, known or not: an ARN still to be created is set all the same."""
    raw = props["__target"] if isinstance(props, _DictProxy) else props
    return bool(raw.get(key))


def _is_unknown(props: Mapping, key: str) -> bool:
    raw = props["__target"] if isinstance(props, _DictProxy) else props
    return _unknown(raw.get(key))


def _spec(props: Mapping) -> Mapping:
    return dig(props, "spec") or {}


def _statements(document: Any) -> list[Mapping]:
    if isinstance(document, str):
        if not document:
            return []
        try:
            document = json.loads(document)
        except json.JSONDecodeError:
            return [{"Effect": "Allow", "Action": "*", "Resource": "*", "_unparsable": True}]
    return [s for s in listed(dig(document, "Statement")) if isinstance(s, Mapping)]


def _iam_statements(props: Mapping) -> list[Mapping]:
    documents = [props.get("policy")] + [
        dig(p, "policy") for p in listed(props.get("inlinePolicies"))
    ]
    return [s for document in documents for s in _statements(document)]


def _allows(statement: Mapping) -> bool:
    return statement.get("Effect") == "Allow"


def _world_open(cidrs: Iterable[Any]) -> list[str]:
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


def _pod_templates(props: Mapping, resource_type: str) -> list[Mapping]:
    if resource_type in JOB_TYPES:
        spec = _spec(props)
        replicas = spec.get("pytorchReplicaSpecs") or spec.get("mpiReplicaSpecs") or {}
        return [dig(r, "template") or {} for r in replicas.values()]
    if resource_type in POD_TEMPLATE_PATHS:
        return [dig(props, *POD_TEMPLATE_PATHS[resource_type]) or {}]
    return []


def _containers(pod_spec: Mapping) -> list[Mapping]:
    return listed(pod_spec.get("containers")) + listed(pod_spec.get("initContainers"))


def _node_pool_types(props: Mapping) -> list[str]:
    for requirement in listed(dig(props, "spec", "template", "spec", "requirements")):
        if requirement.get("key") == "node.kubernetes.io/instance-type":
            return [str(t) for t in listed(requirement.get("values"))]
    return []


# --- resource rules ---------------------------------------------------------------------------


def _encrypted(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    kind = args.resource_type
    if kind in {"aws:ebs/volume:Volume", "aws:efs/fileSystem:FileSystem"}:
        if props.get("encrypted") is not True:
            yield "encrypted must be true"
    if kind in SSE_CONFIGS:
        algorithms = [
            dig(r, "applyServerSideEncryptionByDefault", "sseAlgorithm")
            for r in listed(props.get("rules"))
        ]
        if not algorithms or not all(
            a in {"AES256", "aws:kms", "aws:kms:dsse"} for a in algorithms
        ):
            yield f"S3 default encryption must be AES256 or aws:kms, got {algorithms}"
    if kind == "aws:sqs/queue:Queue":
        if props.get("sqsManagedSseEnabled") is not True and not _present(props, "kmsMasterKeyId"):
            yield "SQS queue must set sqsManagedSseEnabled or kmsMasterKeyId"
    if kind == "aws:fsx/lustreFileSystem:LustreFileSystem":
        # SCRATCH_1 has no encryption in transit; every other type encrypts at rest and in transit.
        if props.get("deploymentType") in {None, "SCRATCH_1"}:
            yield "FSx for Lustre must not be SCRATCH_1 (unencrypted in transit)"
    if kind == "eks:index:Cluster" and not _present(props, "encryptionConfigKeyArn"):
        yield "EKS secrets must be envelope-encrypted: set encryptionConfigKeyArn"
    if kind == "aws:eks/cluster:Cluster" and not _present(props, "encryptionConfig"):
        yield "EKS secrets must be envelope-encrypted: set encryptionConfig"
    if kind == "aws:ec2/launchTemplate:LaunchTemplate":
        for mapping in listed(props.get("blockDeviceMappings")):
            if str(dig(mapping, "ebs", "encrypted")).lower() != "true":
                yield f"volume {mapping.get('deviceName')} must be encrypted"
    if kind == NODECLASS:
        for mapping in listed(_spec(props).get("blockDeviceMappings")):
            if dig(mapping, "ebs", "encrypted") is not True:
                yield f"volume {mapping.get('deviceName')} must be encrypted"
    if (
        kind == "kubernetes:storage.k8s.io/v1:StorageClass"
        and props.get("provisioner") == "ebs.csi.aws.com"
    ):
        if dig(props, "parameters", "encrypted") != "true":
            yield 'EBS StorageClass must set parameters.encrypted: "true"'


def _bucket_kms(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    if not in_production(args):
        return
    for rule in listed(props.get("rules")):
        default = dig(rule, "applyServerSideEncryptionByDefault") or {}
        if not str(default.get("sseAlgorithm", "")).startswith("aws:kms"):
            yield "production buckets must use SSE-KMS (storage.bucket.kms: true)"
        elif not _present(default, "kmsMasterKeyId"):
            yield "production buckets must name their KMS key (kmsMasterKeyId)"


def _ingress(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    # In production no stack file can exempt a resource from this guard.
    if not in_production(args) and args.name in config_of(args)["allowedPublicIngress"]:
        return
    kind = args.resource_type
    if kind == "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule":
        rules = [[props.get("cidrIpv4"), props.get("cidrIpv6")]]
    elif kind == "aws:ec2/securityGroupRule:SecurityGroupRule":
        if props.get("type") != "ingress":
            return
        rules = [listed(props.get("cidrBlocks")) + listed(props.get("ipv6CidrBlocks"))]
    elif kind == "aws:ec2/securityGroup:SecurityGroup":
        rules = [
            listed(rule.get("cidrBlocks")) + listed(rule.get("ipv6CidrBlocks"))
            for rule in listed(props.get("ingress"))
        ]
    else:
        return
    open_to = sorted({c for cidrs in rules for c in _world_open(cidrs)})
    if open_to:
        yield (
            f"ingress effectively open to the world ({', '.join(open_to)}); outside production, "
            "allow it by name in allowedPublicIngress"
        )


def _endpoint(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    if not in_production(args):
        return
    source = (
        props.get("vpcConfig") or {} if args.resource_type == "aws:eks/cluster:Cluster" else props
    )
    public = source.get("endpointPublicAccess", True)
    cidrs = listed(source.get("publicAccessCidrs")) or ["0.0.0.0/0"]
    open_to = _world_open(cidrs)
    if public is not False and open_to:
        yield (
            f"production EKS endpoint is effectively public to the world ({', '.join(open_to)}): "
            "restrict publicAccessCidrs or disable public access"
        )


def _logging(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    missing = LOG_TYPES - set(listed(props.get("enabledClusterLogTypes")))
    if missing:
        yield f"control-plane log types missing: {', '.join(sorted(missing))}"


def _imds(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    kind = args.resource_type
    if kind == "eks:index:Cluster":
        # pulumi-eks' default node group is configured by the component, not by this program.
        if props.get("skipDefaultNodeGroup") is not True:
            yield "set skipDefaultNodeGroup: nodes come from groups whose IMDS settings are ours"
        return
    if kind == "aws:eks/nodeGroup:NodeGroup":
        # Without a launch template a managed node group takes EC2's default (IMDSv1 allowed).
        if not props.get("launchTemplate"):
            yield "managed node group must use a launch template that requires IMDSv2"
        return
    options = (_spec(props) if kind == NODECLASS else props).get("metadataOptions") or {}
    hops = options.get("httpPutResponseHopLimit")
    if options.get("httpTokens") != "required" or hops not in (1, "1"):
        yield "metadataOptions must set httpTokens: required and httpPutResponseHopLimit: 1"


def _nodepool_limits(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    limits = _spec(props).get("limits") or {}
    needed = ["nodes", "cpu", "memory"]
    catalog = load_catalog()
    if any(catalog[t].gpus for t in _node_pool_types(props) if t in catalog):
        needed.append(GPU)
    missing = [k for k in needed if k not in limits]
    if missing:
        yield f"NodePool needs limits {', '.join(missing)}"


def _gpu_taint(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    catalog = load_catalog()
    gpu_types = [t for t in _node_pool_types(props) if t in catalog and catalog[t].gpus]
    taints = listed(dig(props, "spec", "template", "spec", "taints"))
    tainted = any(t.get("key") == GPU and t.get("effect") == "NoSchedule" for t in taints)
    if gpu_types and not tainted:
        yield f"GPU NodePool ({', '.join(gpu_types)}) needs the {GPU}:NoSchedule taint"


def _queue_label(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    if not dig(props, "metadata", "labels", QUEUE_LABEL):
        yield f"job must carry the {QUEUE_LABEL} label so Kueue admits it"


def _training_pods(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    for template in _pod_templates(props, args.resource_type):
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


def _pinned(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    kind = args.resource_type
    if kind == "kubernetes:helm.sh/v3:Release" and not props.get("version"):
        yield f"Helm chart {props.get('chart')} must pin a version"
    if kind == NODECLASS:
        for term in listed(_spec(props).get("amiSelectorTerms")):
            if str(term.get("alias", "")).endswith("@latest"):
                yield "AMI alias must pin a release, not @latest"
    if kind in JOB_TYPES:
        for template in _pod_templates(props, kind):
            for container in listed(dig(template, "spec", "containers")):
                # Unknown in a preview only when this update builds the image: the program then
                # makes it `<repository>@<digest>`, and the update phase checks the real value.
                if _present(container, "image") and _is_unknown(container, "image"):
                    continue
                if "@sha256:" not in str(container.get("image")):
                    yield f"job image {container.get('image')} must be referenced by digest"


def _no_star(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    for statement in _iam_statements(props):
        actions = set(listed(statement.get("Action")))
        if (
            _allows(statement)
            and {"*", "*:*"} & actions
            and "*" in listed(statement.get("Resource"))
        ):
            yield "IAM statement allows action * on resource *"


def _service_wildcards(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    for statement in filter(_allows, _iam_statements(props)):
        wild = sorted(
            str(a)
            for a in listed(statement.get("Action"))
            if str(a) == "*" or str(a).endswith(":*")
        )
        if wild:
            yield f"IAM statement allows whole services: {', '.join(wild)}; name the actions"


def _write_on_any_resource(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    for statement in filter(_allows, _iam_statements(props)):
        if "*" not in listed(statement.get("Resource")):
            continue
        writes = sorted(
            str(a)
            for a in listed(statement.get("Action"))
            if not str(a).split(":", 1)[-1].startswith(READ_VERBS)
        )
        if writes:
            yield f"IAM statement allows {', '.join(writes)} on Resource *; scope it to ARNs"


def _not_action(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    documents = [props.get("assumeRolePolicy")] if args.resource_type == "aws:iam/role:Role" else []
    statements = _iam_statements(props) + [s for d in documents for s in _statements(d)]
    for statement in filter(_allows, statements):
        inverted = [k for k in ("NotAction", "NotResource", "NotPrincipal") if k in statement]
        if inverted:
            yield f"Allow statement uses {', '.join(inverted)} (allows everything not listed)"


def _broad_managed(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    arns = listed(props.get("policyArn")) + listed(props.get("managedPolicyArns"))
    for arn in map(str, arns):
        name = arn.rsplit("/", 1)[-1]
        if name in BROAD_MANAGED_POLICIES or name.endswith("FullAccess"):
            yield f"broad managed policy {name} attached; grant the actions the role needs"


def _trust_principals(props: Mapping) -> list[tuple[Mapping, Any]]:
    return [
        (s, s.get("Principal")) for s in _statements(props.get("assumeRolePolicy")) if _allows(s)
    ]


def _trust_wildcard(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    for _, principal in _trust_principals(props):
        aws_principals = [principal] if principal == "*" else listed(dig(principal, "AWS"))
        if "*" in map(str, aws_principals):
            yield 'trust policy lets any AWS principal ("*") assume the role'


def _pod_identity_scoped(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    for statement, principal in _trust_principals(props):
        if "pods.eks.amazonaws.com" not in map(str, listed(dig(principal, "Service"))):
            continue
        equals = dig(statement, "Condition", "StringEquals") or {}
        missing = [k for k in POD_IDENTITY_TAGS if not equals.get(k)]
        if missing:
            yield (
                "Pod Identity trust must be conditioned on the cluster, namespace and service "
                f"account; missing {', '.join(missing)}"
            )


def _queue_policy_scoped(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    for statement in filter(_allows, _statements(props.get("policy"))):
        if dig(statement, "Principal", "Service") is None:
            continue
        condition = statement.get("Condition") or {}
        keys = {k for block in condition.values() if isinstance(block, Mapping) for k in block}
        if not keys & {"aws:SourceArn", "aws:SourceAccount"}:
            yield "a service may send to the queue only on behalf of named sources (aws:SourceArn)"


def _public_bucket(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    kind = args.resource_type
    if str(props.get("acl")) in PUBLIC_ACLS:
        yield f"bucket ACL {props.get('acl')} makes objects public"
    grants = listed(dig(props, "accessControlPolicy", "grants"))
    for grant in grants:
        uri = str(dig(grant, "grantee", "uri"))
        if uri.endswith(PUBLIC_GRANTEES):
            yield f"bucket ACL grants {grant.get('permission')} to {uri.rsplit('/', 1)[-1]}"
    if kind in {"aws:s3/bucketPolicy:BucketPolicy", *BUCKETS}:
        for statement in filter(_allows, _statements(props.get("policy"))):
            principal = statement.get("Principal")
            everyone = principal == "*" or "*" in map(str, listed(dig(principal, "AWS")))
            if everyone and not statement.get("Condition"):
                yield "bucket policy allows anyone (Principal *)"
    if kind in {
        "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock",
        "aws:s3/accountPublicAccessBlock:AccountPublicAccessBlock",
    }:
        keys = ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")
        off = [k for k in keys if props.get(k) is not True]
        if off:
            yield f"public access block must set {', '.join(off)} true"


def _pod_specs(props: Mapping, kind: str) -> list[Mapping]:
    return [template.get("spec") or {} for template in _pod_templates(props, kind)]


def _host_access(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    for pod in _pod_specs(props, args.resource_type):
        for key in ("hostNetwork", "hostPID", "hostIPC"):
            if pod.get(key) is True:
                yield f"pod sets {key}"
        for volume in listed(pod.get("volumes")):
            if volume.get("hostPath") is not None:
                yield f"pod mounts hostPath volume {volume.get('name')}"
        for container in _containers(pod):
            context = container.get("securityContext") or {}
            if context.get("privileged") is True:
                yield f"container {container.get('name')} is privileged"
            added = sorted(set(map(str, listed(dig(context, "capabilities", "add")))))
            beyond = [c for c in added if c not in BASELINE_CAPABILITIES]
            if beyond:
                yield f"container {container.get('name')} adds capabilities {beyond}"


def _restricted(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    # Pod Security "restricted" as upstream checks it (kubernetes/pod-security-admission,
    # policy/check_runAsNonRoot.go, check_runAsUser.go, check_allowPrivilegeEscalation.go,
    # check_capabilities_restricted.go, check_seccompProfile_restricted.go): on containers and
    # init containers alike.
    for pod in _pod_specs(props, args.resource_type):
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


def _namespace_psa(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    labels = dig(props, "metadata", "labels") or {}
    if labels.get(TEAM_LABEL) and labels.get("pod-security.kubernetes.io/enforce") not in {
        "baseline",
        "restricted",
    }:
        yield "team namespace must enforce Pod Security (pod-security.kubernetes.io/enforce)"


def _scan_on_push(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    if not dig(props, "imageScanningConfiguration", "scanOnPush"):
        yield "ECR repository must scan images on push"


def _immutable_tags(props: Mapping, args: ResourceValidationArgs) -> Iterable[str]:
    if props.get("imageTagMutability") not in {"IMMUTABLE", "IMMUTABLE_WITH_EXCLUSION"}:
        yield "ECR repository tags must be immutable (a tag must always mean one image)"


# --- stack rules ------------------------------------------------------------------------------


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
    """The plan's cost table, priced by the same function: every priced resource counts."""
    budget = float(config_of(args)["budgetUsdPerHour"])
    stack = [
        Declared(
            r.urn,
            r.resource_type,
            r.name,
            r.props or {},
            tuple(d.urn for d in r.dependencies or []),
        )
        for r in args.resources
    ]
    if not any(r.type in PRICERS for r in stack):
        return
    region = _region(args)
    if region is None:
        report('no region to price the stack in: set "region" in the policy pack config')
        return
    try:
        cost = stack_cost(load_prices(region), stack)
    except UnpricedError as e:
        report(f"cannot price the stack: {e}")
        return
    for message in cost.unpriced:
        report(f"cannot price the stack: {message}")
    unbounded = [
        f"{line.item} ({line.detail})" for line in cost.lines if math.isinf(line.usd_per_hour)
    ]
    if unbounded:
        report(f"the cost has no ceiling: {', '.join(unbounded)}")
    elif cost.total_per_hour > budget:
        dearest = sorted(cost.lines, key=lambda line: -line.usd_per_hour)[:3]
        report(
            f"cost ceiling ${cost.total_per_hour:,.2f}/hour exceeds the budget ${budget:,.2f}/hour "
            f"(dearest: {', '.join(f'{line.item} ${line.usd_per_hour:,.2f}' for line in dearest)})"
        )


def _s3_private_and_tls(args: StackValidationArgs, report: ReportViolation) -> None:
    guards: dict[str, set[str]] = {}
    for resource in args.resources:
        props = resource.props or {}
        for dependency in resource.dependencies or []:
            if resource.resource_type == "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock":
                keys = (
                    "blockPublicAcls",
                    "blockPublicPolicy",
                    "ignorePublicAcls",
                    "restrictPublicBuckets",
                )
                if all(props.get(k) is True for k in keys):
                    guards.setdefault(dependency.urn, set()).add("public-access-block")
            if resource.resource_type == "aws:s3/bucketPolicy:BucketPolicy":
                denies_plain_http = any(
                    s.get("Effect") == "Deny"
                    and dig(s, "Condition", "Bool", "aws:SecureTransport") in ("false", False)
                    for s in _statements(props.get("policy"))
                )
                if denies_plain_http:
                    guards.setdefault(dependency.urn, set()).add("tls-only")
    for bucket in (r for r in args.resources if r.resource_type in BUCKETS):
        missing = {"public-access-block", "tls-only"} - guards.get(bucket.urn, set())
        if missing:
            report(f"bucket {bucket.name} lacks {', '.join(sorted(missing))}", bucket.urn)


def _job_gpus_fit(args: StackValidationArgs, report: ReportViolation) -> None:
    catalog = load_catalog()
    pool_gpus = {}
    for pool in (r for r in args.resources if r.resource_type == NODEPOOL):
        props = pool.props or {}
        name = dig(props, "metadata", "name") or dig(
            props, "spec", "template", "metadata", "labels", POOL_LABEL
        )
        types = [t for t in _node_pool_types(props) if t in catalog]
        pool_gpus[name] = min((catalog[t].gpus for t in types), default=0)
    for job in (r for r in args.resources if r.resource_type in JOB_TYPES):
        for template in _pod_templates(job.props or {}, job.resource_type):
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


def _mpi_ssh_isolated(args: StackValidationArgs, report: ReportViolation) -> None:
    policies = [
        r.props or {}
        for r in args.resources
        if r.resource_type == "kubernetes:networking.k8s.io/v1:NetworkPolicy"
    ]
    for job in (r for r in args.resources if r.resource_type == MPIJOB):
        props = job.props or {}
        name = dig(props, "metadata", "name")
        namespace = dig(props, "metadata", "namespace")
        isolated = any(
            dig(p, "metadata", "namespace") == namespace
            and dig(p, "spec", "podSelector", "matchLabels", JOB_LABEL) == name
            and "Ingress" in listed(dig(p, "spec", "policyTypes"))
            and all(
                dig(peer, "podSelector", "matchLabels", JOB_LABEL) == name
                for rule in listed(dig(p, "spec", "ingress"))
                for peer in listed(rule.get("from")) or [{}]
            )
            for p in policies
        )
        if not isolated:
            report(
                f"MPIJob {name}: no NetworkPolicy limits its sshd to the job's own pods", job.urn
            )


EKS = {"eks:index:Cluster", "aws:eks/cluster:Cluster"}
LIST = {"type": "array", "items": {"type": "string"}}
POLICIES = [
    resource_rule(
        "storage-encrypted",
        "EBS, EFS, FSx, S3, SQS, launch templates, node classes and EKS secrets are encrypted",
        lambda t: True,
        _encrypted,
    ),
    resource_rule(
        "bucket-kms-in-production",
        "Production buckets use SSE-KMS with a named key",
        SSE_CONFIGS,
        _bucket_kms,
        {"productionStacks": LIST},
    ),
    resource_rule(
        "no-world-ingress",
        "No security group ingress effectively open to the world (split ranges merged, IPv4 and "
        "IPv6); outside production a resource may be allowed by name",
        lambda t: t.startswith("aws:"),
        _ingress,
        {"allowedPublicIngress": LIST, "productionStacks": LIST},
    ),
    resource_rule(
        "eks-endpoint-not-public-in-production",
        "Production EKS API endpoints are not effectively open to the world",
        EKS,
        _endpoint,
        {"productionStacks": LIST},
    ),
    resource_rule(
        "eks-control-plane-logging", "All five EKS control-plane log types are on", EKS, _logging
    ),
    resource_rule(
        "imdsv2-only",
        "Node classes, launch templates and node groups (no pulumi-eks default group) require "
        "IMDSv2 with hop limit 1",
        {
            NODECLASS,
            "aws:ec2/launchTemplate:LaunchTemplate",
            "aws:eks/nodeGroup:NodeGroup",
            "eks:index:Cluster",
        },
        _imds,
    ),
    resource_rule(
        "nodepool-limits",
        "Every NodePool limits nodes, cpu and memory; GPU pools also nvidia.com/gpu",
        {NODEPOOL},
        _nodepool_limits,
    ),
    resource_rule(
        "gpu-nodepool-taint",
        "NodePools of GPU instance types carry the nvidia.com/gpu NoSchedule taint",
        {NODEPOOL},
        _gpu_taint,
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
        IAM_DOCUMENT_TYPES,
        _no_star,
    ),
    resource_rule(
        "iam-no-service-wildcards",
        "No IAM statement allows a whole service (s3:*, iam:*)",
        IAM_DOCUMENT_TYPES,
        _service_wildcards,
    ),
    resource_rule(
        "iam-no-write-on-any-resource",
        'IAM statements on Resource "*" only read (Describe/Get/List...)',
        IAM_DOCUMENT_TYPES,
        _write_on_any_resource,
    ),
    resource_rule(
        "iam-no-not-action",
        "No Allow statement uses NotAction, NotResource or NotPrincipal",
        IAM_DOCUMENT_TYPES,
        _not_action,
    ),
    resource_rule(
        "iam-no-broad-managed-policies",
        "No AdministratorAccess, PowerUserAccess or *FullAccess managed policy is attached",
        {
            "aws:iam/rolePolicyAttachment:RolePolicyAttachment",
            "aws:iam/policyAttachment:PolicyAttachment",
            "aws:iam/role:Role",
        },
        _broad_managed,
    ),
    resource_rule(
        "iam-trust-no-wildcard-principal",
        'No trust policy lets any AWS principal ("*") assume a role',
        {"aws:iam/role:Role"},
        _trust_wildcard,
    ),
    resource_rule(
        "pod-identity-trust-scoped",
        "Pod Identity roles trust one cluster, namespace and service account (session tags)",
        {"aws:iam/role:Role"},
        _pod_identity_scoped,
    ),
    resource_rule(
        "sqs-policy-source-scoped",
        "Services may send to a queue only for named source ARNs",
        {"aws:sqs/queuePolicy:QueuePolicy"},
        _queue_policy_scoped,
    ),
    resource_rule(
        "no-public-buckets",
        "No bucket ACL, grant, policy or public access block makes a bucket public",
        lambda t: t.startswith("aws:s3/"),
        _public_bucket,
    ),
    resource_rule(
        "pods-no-host-access",
        "No pod uses hostNetwork, hostPID, hostIPC, hostPath, privileged or capabilities "
        "beyond Pod Security baseline",
        lambda t: t in JOB_TYPES or t in POD_TEMPLATE_PATHS,
        _host_access,
    ),
    resource_rule(
        "pods-restricted",
        "Pod containers and init containers run as non-root (an init container preparing a "
        "volume may be root adding only CHOWN and DAC_OVERRIDE), without privilege escalation, "
        "with RuntimeDefault seccomp, ALL capabilities dropped and none added but "
        "NET_BIND_SERVICE",
        lambda t: t in JOB_TYPES or t in POD_TEMPLATE_PATHS,
        _restricted,
    ),
    resource_rule(
        "team-namespaces-pod-security",
        "Team namespaces enforce Pod Security Admission (baseline or restricted)",
        {"kubernetes:core/v1:Namespace"},
        _namespace_psa,
    ),
    resource_rule(
        "ecr-scan-on-push",
        "ECR repositories scan on push",
        {"aws:ecr/repository:Repository"},
        _scan_on_push,
    ),
    resource_rule(
        "ecr-immutable-tags",
        "ECR repositories have immutable tags",
        {"aws:ecr/repository:Repository"},
        _immutable_tags,
    ),
    stack_rule(
        "s3-private-and-tls-only",
        "Every bucket (Bucket or BucketV2) blocks public access and denies non-TLS",
        _s3_private_and_tls,
    ),
    stack_rule(
        "job-gpus-fit-node",
        "No job pod asks more GPUs than the nodes of its pool have",
        _job_gpus_fit,
    ),
    stack_rule(
        "mpi-ssh-isolated",
        "Every MPIJob has a NetworkPolicy admitting only its own pods",
        _mpi_ssh_isolated,
    ),
    stack_rule(
        "cost-budget",
        "The hourly cost ceiling of every priced resource (the plan's cost table) stays under the "
        "budget, and no NodePool is without one",
        _budget,
        {"budgetUsdPerHour": {"type": "number"}, "region": {"type": "string"}},
    ),
]
