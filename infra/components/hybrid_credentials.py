"""The hybrid nodes' IAM role and where the machines get it: an SSM hybrid activation or IAM Roles
Anywhere, and each machine's spec.hybrid block for its NodeConfig."""

import json

import pulumi
import pulumi_aws as aws

from infra.components.hybrid_machines import IRA_CERTIFICATE, IRA_PRIVATE_KEY
from infra.components.iam import managed_policy_arn, partition, policy_document
from infra.config import HybridConfig


def node_credentials(
    owner: pulumi.Resource,
    name: str,
    config: HybridConfig,
    region: str,
    account: str,
    cluster_arn: pulumi.Output[str],
    tags: dict[str, str],
) -> tuple[aws.iam.Role, pulumi.Output[dict[str, dict]]]:
    """The hybrid node role, its credential source, and each machine's spec.hybrid block."""
    child = pulumi.ResourceOptions(parent=owner)
    inline = [
        # nodeadm reads the endpoint, CA and service CIDR of the cluster.
        {"Effect": "Allow", "Action": "eks:DescribeCluster", "Resource": cluster_arn},
        # The EKS Pod Identity agent on the node fetches pod credentials.
        {
            "Effect": "Allow",
            "Action": "eks-auth:AssumeRoleForPodIdentity",
            "Resource": cluster_arn,
        },
    ]
    managed = [managed_policy_arn("AmazonEC2ContainerRegistryPullOnly")]
    if config.credential_provider == "ssm":
        trust = json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [
                    {
                        "Effect": "Allow",
                        "Principal": {"Service": "ssm.amazonaws.com"},
                        "Action": "sts:AssumeRole",
                        "Condition": {
                            "StringEquals": {"aws:SourceAccount": account},
                            "ArnEquals": {
                                "aws:SourceArn": f"arn:{partition()}:ssm:{region}:{account}:*"
                            },
                        },
                    }
                ],
            }
        )
        managed.append(managed_policy_arn("AmazonSSMManagedInstanceCore"))
        # `nodeadm uninstall` deregisters the machine from SSM: a write, so only on this
        # account's managed instances (the action's resource type); describing needs "*".
        inline += [
            {
                "Effect": "Allow",
                "Action": "ssm:DeregisterManagedInstance",
                "Resource": f"arn:{partition()}:ssm:{region}:{account}:managed-instance/*",
            },
            {"Effect": "Allow", "Action": "ssm:DescribeInstanceInformation", "Resource": "*"},
        ]
    else:
        anchor = aws.rolesanywhere.TrustAnchor(
            f"{name}-anchor",
            name=f"{name}-hybrid-nodes",
            enabled=True,
            source={
                "source_type": "CERTIFICATE_BUNDLE",
                "source_data": {"x509_certificate_data": config.ca_bundle_pem},
            },
            tags=tags,
            opts=child,
        )
        trust = anchor.arn.apply(
            lambda arn: json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [
                        {
                            "Effect": "Allow",
                            "Principal": {"Service": "rolesanywhere.amazonaws.com"},
                            "Action": [
                                "sts:TagSession",
                                "sts:SetSourceIdentity",
                                "sts:AssumeRole",
                            ],
                            # A certificate acts only as the machine its CN names.
                            "Condition": {
                                "StringEquals": {
                                    "sts:RoleSessionName": "${aws:PrincipalTag/x509Subject/CN}"
                                },
                                "ArnEquals": {"aws:SourceArn": arn},
                            },
                        }
                    ],
                }
            )
        )
    role = aws.iam.Role(f"{name}-node", assume_role_policy=trust, tags=tags, opts=child)
    for i, arn in enumerate(managed):
        aws.iam.RolePolicyAttachment(f"{name}-node-{i}", role=role.name, policy_arn=arn, opts=child)
    aws.iam.RolePolicy(
        f"{name}-node",
        role=role.name,
        policy=pulumi.Output.from_input(inline).apply(policy_document),
        opts=child,
    )
    if config.credential_provider == "ssm":
        activation = aws.ssm.Activation(
            f"{name}-activation",
            description=f"EKS hybrid nodes of {name}",
            iam_role=role.name,
            registration_limit=config.ssm_activation.registration_limit,
            expiration_date=config.ssm_activation.expiration_date(),
            tags=tags,
            opts=pulumi.ResourceOptions(parent=owner, depends_on=[role]),
        )
        block = pulumi.Output.all(activation.activation_code, activation.id).apply(
            lambda a: {
                "enableCredentialsFile": True,  # for POD_IDENTITY_ON_HYBRID_NODES
                "ssm": {"activationCode": a[0], "activationId": a[1]},
            }
        )
        return role, block.apply(lambda b: {m.name: b for m in config.machines})
    profile = aws.rolesanywhere.Profile(
        f"{name}-profile",
        name=f"{name}-hybrid-nodes",
        enabled=True,
        role_arns=[role.arn],
        tags=tags,
        opts=child,
    )
    arns = pulumi.Output.all(anchor.arn, profile.arn, role.arn)
    return role, arns.apply(
        lambda a: {
            m.name: {
                "enableCredentialsFile": True,
                "iamRolesAnywhere": {
                    "nodeName": m.name,
                    "trustAnchorArn": a[0],
                    "profileArn": a[1],
                    "roleArn": a[2],
                    "certificatePath": IRA_CERTIFICATE,
                    "privateKeyPath": IRA_PRIVATE_KEY,
                },
            }
            for m in config.machines
        }
    )
