"""IAM building blocks shared by components: trust policies and Pod Identity roles."""

import json
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from infra.core.context import ClusterContext

POD_IDENTITY_SERVICE = "pods.eks.amazonaws.com"
# EKS add-on controllers (EBS, EFS, FSx CSI) run in this namespace.
ADDON_NAMESPACE = "kube-system"


def assume_role_policy(service: str, actions: list[str] | None = None) -> str:
    """Trust policy letting one AWS service principal assume a role."""
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Principal": {"Service": service},
                    "Action": actions or ["sts:AssumeRole"],
                }
            ],
        }
    )


def policy_document(statements: list[dict]) -> str:
    """An IAM policy document holding `statements`."""
    return json.dumps({"Version": "2012-10-17", "Statement": statements})


NODE_MANAGED_POLICIES = [
    "AmazonEKSWorkerNodePolicy",
    "AmazonEC2ContainerRegistryPullOnly",
    # The VPC CNI add-on runs with the node's role unless given one of its own.
    "AmazonEKS_CNI_Policy",
    "AmazonSSMManagedInstanceCore",
]


def partition() -> str:
    """The stack's AWS partition (aws, aws-cn, aws-us-gov): every ARN is built with it."""
    return aws.get_partition().partition


def managed_policy_arn(path: str) -> str:
    """The ARN of an AWS managed policy, e.g. `service-role/AmazonEBSCSIDriverPolicy`."""
    return f"arn:{partition()}:iam::aws:policy/{path}"


@dataclass(frozen=True)
class GrantedRole:
    """An IAM role and the attachments and inline policy that grant its permissions.

    Whatever acts with the role depends on `ready`: on create it never runs with a role whose
    policies are still missing, on destroy its permissions are removed only after it is gone.
    """

    role: aws.iam.Role
    grants: list[pulumi.Resource]

    @property
    def arn(self) -> pulumi.Output[str]:
        return self.role.arn

    @property
    def name(self) -> pulumi.Output[str]:
        return self.role.name

    @property
    def ready(self) -> list[pulumi.Resource]:
        return [self.role, *self.grants]


def _role(
    name: str,
    trust_policy: pulumi.Input[str],
    managed_policies: list[str],
    tags: dict[str, str],
    opts: pulumi.ResourceOptions,
    inline_policy: pulumi.Input[str] | None,
    role_name: str | None,
) -> GrantedRole:
    role = aws.iam.Role(name, name=role_name, assume_role_policy=trust_policy, tags=tags, opts=opts)
    grants: list[pulumi.Resource] = [
        aws.iam.RolePolicyAttachment(
            f"{name}-{i}", role=role.name, policy_arn=managed_policy_arn(policy), opts=opts
        )
        for i, policy in enumerate(managed_policies)
    ]
    if inline_policy is not None:
        grants.append(aws.iam.RolePolicy(name, role=role.name, policy=inline_policy, opts=opts))
    return GrantedRole(role, grants)


def pod_identity_trust_policy(cluster_name: str, namespace: str, service_account: str) -> str:
    """Trust for EKS Pod Identity, limited to one service account of one cluster.

    Pod Identity passes the cluster, namespace and service account as session tags (EKS user
    guide, "Create IAM role with trust policy required by EKS Pod Identity"); without these
    conditions any association in the account could hand the role to its pods.
    """
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Principal": {"Service": POD_IDENTITY_SERVICE},
                    "Action": ["sts:AssumeRole", "sts:TagSession"],
                    "Condition": {
                        "StringEquals": {
                            "aws:RequestTag/eks-cluster-name": cluster_name,
                            "aws:RequestTag/kubernetes-namespace": namespace,
                            "aws:RequestTag/kubernetes-service-account": service_account,
                        }
                    },
                }
            ],
        }
    )


def pod_identity_role(
    name: str,
    cluster_name: pulumi.Input[str],
    namespace: pulumi.Input[str],
    service_account: pulumi.Input[str],
    managed_policies: list[str],
    tags: dict[str, str],
    opts: pulumi.ResourceOptions,
    inline_policy: pulumi.Input[str] | None = None,
    role_name: str | None = None,
) -> GrantedRole:
    """A role that EKS Pod Identity lets one service account of one cluster assume."""
    trust = pulumi.Output.all(cluster_name, namespace, service_account).apply(
        lambda v: pod_identity_trust_policy(*v)
    )
    return _role(name, trust, managed_policies, tags, opts, inline_policy, role_name)


def node_role(
    name: str, tags: dict[str, str], opts: pulumi.ResourceOptions, role_name: str | None = None
) -> GrantedRole:
    """The role EC2 worker nodes run with: join the cluster, pull images, pod networking, SSM."""
    trust = assume_role_policy("ec2.amazonaws.com")
    return _role(name, trust, NODE_MANAGED_POLICIES, tags, opts, None, role_name)


def csi_driver_addon(
    name: str,
    cluster: ClusterContext,
    addon: str,
    version: str,
    service_account: str,
    opts: pulumi.ResourceOptions,
    configuration: dict | None = None,
    managed_policies: list[str] | None = None,
    inline_policy: pulumi.Input[str] | None = None,
) -> aws.eks.Addon:
    """An EKS add-on whose controller runs as `service_account` with its own Pod Identity role,
    created once the system nodes and the Pod Identity agent are there; `configuration`: its
    configurationValues (infra/storage/csi_addons.py)."""
    role = pod_identity_role(
        name,
        cluster.name,
        ADDON_NAMESPACE,
        service_account,
        managed_policies or [],
        cluster.tags,
        opts,
        inline_policy=inline_policy,
    )
    return aws.eks.Addon(
        name,
        cluster_name=cluster.name,
        addon_name=addon,
        addon_version=version,
        resolve_conflicts_on_update="OVERWRITE",
        pod_identity_associations=[{"role_arn": role.arn, "service_account": service_account}],
        configuration_values=json.dumps(configuration) if configuration else None,
        tags=cluster.tags,
        opts=pulumi.ResourceOptions.merge(
            opts,
            pulumi.ResourceOptions(depends_on=[*cluster.controller_prerequisites, *role.ready]),
        ),
    )
