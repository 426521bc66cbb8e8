"""CrossGuard rules for the platform, importable without starting a policy server: this module
is the one list of them (POLICIES); the checks live by area in its modules (storage, network,
iam, workloads, nodes, cost) over what they share (base).

Each rule is a pulumi_policy policy object; `policies/__main__.py` bundles them into the pack that
`pulumi preview --policy-pack policies` runs, and `policies/offline.py` runs the same objects over
the offline plan. Rules read resource inputs, so they hold for the real engine and for the plan.

In a real preview the engine hands each rule its inputs behind pulumi_policy's proxies: reading a
value that is not known yet (an ARN of a resource still to be created) raises UnknownValueError,
which pulumi_policy would turn into an advisory note, i.e. the rule would pass. Every rule here
turns it into a violation instead: a guard that cannot see the value does not pass it.
"""

from policies.rules.base import (
    JOB_TYPES,
    NODECLASS,
    NODEPOOL,
    POD_TEMPLATE_PATHS,
    SSE_CONFIGS,
    TRAINING_POD_TYPES,
    resource_rule,
    stack_rule,
)
from policies.rules.cost import cost_budget
from policies.rules.data import protected
from policies.rules.iam import (
    broad_managed,
    no_star,
    not_action,
    pod_identity_scoped,
    queue_policy_scoped,
    service_wildcards,
    trust_wildcard,
    write_on_any_resource,
)
from policies.rules.network import control_plane_logging, endpoint, ingress, mpi_ssh_isolated
from policies.rules.nodes import gpu_taint, imds, nodepool_limits
from policies.rules.storage import bucket_kms, encrypted, public_bucket, s3_private_and_tls
from policies.rules.workloads import (
    host_access,
    immutable_tags,
    job_gpus_fit,
    namespace_psa,
    pinned,
    queue_label,
    restricted,
    scan_on_push,
    training_pods,
)

IAM_DOCUMENT_TYPES = {
    "aws:iam/rolePolicy:RolePolicy",
    "aws:iam/policy:Policy",
    "aws:iam/role:Role",
    "aws:iam/userPolicy:UserPolicy",
    "aws:iam/groupPolicy:GroupPolicy",
}


EKS = {"eks:index:Cluster", "aws:eks/cluster:Cluster"}
LIST = {"type": "array", "items": {"type": "string"}}
POLICIES = [
    resource_rule(
        "storage-encrypted",
        "EBS, EFS, FSx, S3, SQS, launch templates, node classes and EKS secrets are encrypted",
        lambda t: True,
        encrypted,
    ),
    resource_rule(
        "data-holders-protected",
        "File systems, buckets, keys, image repositories, the cluster and tenants' namespaces name "
        "their data holder and are protected unless acknowledgeDataLoss lists it",
        lambda t: True,
        protected,
        {"acknowledgedDataLoss": LIST},
    ),
    resource_rule(
        "bucket-kms-in-production",
        "Production buckets use SSE-KMS with a named key",
        SSE_CONFIGS,
        bucket_kms,
        {"productionStacks": LIST},
    ),
    resource_rule(
        "no-world-ingress",
        "No security group ingress effectively open to the world (split ranges merged, IPv4 and "
        "IPv6); outside production a resource may be allowed by name",
        lambda t: t.startswith("aws:"),
        ingress,
        {"allowedPublicIngress": LIST, "productionStacks": LIST},
    ),
    resource_rule(
        "eks-endpoint-not-public-in-production",
        "Production EKS API endpoints are not effectively open to the world",
        EKS,
        endpoint,
        {"productionStacks": LIST},
    ),
    resource_rule(
        "eks-control-plane-logging",
        "All five EKS control-plane log types are on",
        EKS,
        control_plane_logging,
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
        imds,
    ),
    resource_rule(
        "nodepool-limits",
        "Every NodePool limits nodes, cpu and memory, GPU pools also nvidia.com/gpu; a static "
        "one limits nodes (all its CRD allows)",
        {NODEPOOL},
        nodepool_limits,
    ),
    resource_rule(
        "gpu-nodepool-taint",
        "NodePools of GPU instance types carry the nvidia.com/gpu NoSchedule taint",
        {NODEPOOL},
        gpu_taint,
    ),
    resource_rule(
        "kueue-queue-label", "Every training job names its Kueue queue", JOB_TYPES, queue_label
    ),
    resource_rule(
        "training-pod-hygiene",
        "Training pods (jobs' and runtimes') mount /dev/shm as memory and are not disrupted "
        "mid-run",
        TRAINING_POD_TYPES,
        training_pods,
    ),
    resource_rule(
        "images-pinned",
        "Charts pin versions, AMIs pin releases, job and runtime images are digests",
        lambda t: True,
        pinned,
    ),
    resource_rule(
        "no-iam-star-on-star",
        "No IAM statement allows action * on resource *",
        IAM_DOCUMENT_TYPES,
        no_star,
    ),
    resource_rule(
        "iam-no-service-wildcards",
        "No IAM statement allows a whole service (s3:*, iam:*)",
        IAM_DOCUMENT_TYPES,
        service_wildcards,
    ),
    resource_rule(
        "iam-no-write-on-any-resource",
        'IAM statements on Resource "*" only read (Describe/Get/List...)',
        IAM_DOCUMENT_TYPES,
        write_on_any_resource,
    ),
    resource_rule(
        "iam-no-not-action",
        "No Allow statement uses NotAction, NotResource or NotPrincipal",
        IAM_DOCUMENT_TYPES,
        not_action,
    ),
    resource_rule(
        "iam-no-broad-managed-policies",
        "No AdministratorAccess, PowerUserAccess or *FullAccess managed policy is attached",
        {
            "aws:iam/rolePolicyAttachment:RolePolicyAttachment",
            "aws:iam/policyAttachment:PolicyAttachment",
            "aws:iam/role:Role",
        },
        broad_managed,
    ),
    resource_rule(
        "iam-trust-no-wildcard-principal",
        'No trust policy lets any AWS principal ("*") assume a role',
        {"aws:iam/role:Role"},
        trust_wildcard,
    ),
    resource_rule(
        "pod-identity-trust-scoped",
        "Pod Identity roles trust one cluster, namespace and service account (session tags)",
        {"aws:iam/role:Role"},
        pod_identity_scoped,
    ),
    resource_rule(
        "sqs-policy-source-scoped",
        "Services may send to a queue only for named source ARNs",
        {"aws:sqs/queuePolicy:QueuePolicy"},
        queue_policy_scoped,
    ),
    resource_rule(
        "no-public-buckets",
        "No bucket ACL, grant, policy or public access block makes a bucket public",
        lambda t: t.startswith("aws:s3/"),
        public_bucket,
    ),
    resource_rule(
        "pods-no-host-access",
        "No pod uses hostNetwork, hostPID, hostIPC, hostPath, privileged or capabilities "
        "beyond Pod Security baseline",
        lambda t: t in TRAINING_POD_TYPES or t in POD_TEMPLATE_PATHS,
        host_access,
    ),
    resource_rule(
        "pods-restricted",
        "Pod containers and init containers run as non-root (an init container preparing a "
        "volume may be root adding only CHOWN and DAC_OVERRIDE), without privilege escalation, "
        "with RuntimeDefault seccomp, ALL capabilities dropped and none added but "
        "NET_BIND_SERVICE",
        lambda t: t in TRAINING_POD_TYPES or t in POD_TEMPLATE_PATHS,
        restricted,
    ),
    resource_rule(
        "team-namespaces-pod-security",
        "Team namespaces enforce Pod Security Admission (baseline or restricted)",
        {"kubernetes:core/v1:Namespace"},
        namespace_psa,
    ),
    resource_rule(
        "ecr-scan-on-push",
        "ECR repositories scan on push",
        {"aws:ecr/repository:Repository"},
        scan_on_push,
    ),
    resource_rule(
        "ecr-immutable-tags",
        "ECR repositories have immutable tags",
        {"aws:ecr/repository:Repository"},
        immutable_tags,
    ),
    stack_rule(
        "s3-private-and-tls-only",
        "Every bucket (Bucket or BucketV2) blocks public access and denies non-TLS",
        s3_private_and_tls,
    ),
    stack_rule(
        "job-gpus-fit-node",
        "No job pod asks more GPUs than the nodes of its pool have",
        job_gpus_fit,
    ),
    stack_rule(
        "mpi-ssh-isolated",
        "Every MPIJob has a NetworkPolicy admitting only its own pods",
        mpi_ssh_isolated,
    ),
    stack_rule(
        "cost-budget",
        "The hourly cost ceiling of every priced resource (the plan's cost table) stays under the "
        "budget, and no NodePool is without one",
        cost_budget,
        {"budgetUsdPerHour": {"type": "number"}, "region": {"type": "string"}},
    ),
]
