"""The hybrid nodes' IAM role and where the machines get it: an SSM hybrid activation per machine
or IAM Roles Anywhere, and each machine's spec.hybrid block for its NodeConfig."""

import json

import pulumi
import pulumi_aws as aws

from infra.core.iam import managed_policy_arn, partition, policy_document
from infra.hybrid.config import HybridConfig
from infra.hybrid.machines import IRA_CERTIFICATE, IRA_PRIVATE_KEY

# The tag naming the machine an activation is for.
MACHINE_TAG = "training-platform/machine"


def node_credentials(
    owner: pulumi.Resource,
    name: str,
    config: HybridConfig,
    region: str,
    account: str,
    cluster_arn: pulumi.Output[str],
    tags: dict[str, str],
) -> tuple[aws.iam.Role, pulumi.Output[dict[str, dict]], dict[str, pulumi.Output[str]]]:
    """The hybrid node role, its credential source, each machine's spec.hybrid block, and (SSM)
    each machine's activation ID, which the gateway matches its node by."""
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
        # No ssm:DeregisterManagedInstance: its one resource is the managed instance the request
        # names, and IAM offers no way to tie it to the caller's own (the caller's is known only
        # as a whole ARN, ${ssm:SourceInstanceARN}, never as the mi-id a Resource ARN ends
        # with), so any grant would let one machine deregister every other. The administrator
        # deregisters a machine that leaves (docs: GPUs outside AWS); `nodeadm uninstall`
        # reports its own deregistration step as denied and removes the rest.
        managed.append(managed_policy_arn("AmazonSSMManagedInstanceCore"))
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
        blocks, activation_ids = {}, {}
        for machine in config.machines:
            # One registration each: the code joins this machine once, as mi-<id>, which the
            # gateway matches to the machine by the activation it came from.
            activation = aws.ssm.Activation(
                f"{name}-activation-{machine.name}",
                name=machine.name,
                description=f"EKS hybrid node {machine.name} of {name}",
                iam_role=role.name,
                registration_limit=1,
                expiration_date=config.activation_expiration(machine),
                tags={**tags, MACHINE_TAG: machine.name},
                opts=pulumi.ResourceOptions(parent=owner, depends_on=[role]),
            )
            activation_ids[machine.name] = activation.id
            blocks[machine.name] = pulumi.Output.all(
                activation.activation_code, activation.id
            ).apply(
                lambda a: {
                    "enableCredentialsFile": True,  # for POD_IDENTITY_ON_HYBRID_NODES
                    "ssm": {"activationCode": a[0], "activationId": a[1]},
                }
            )
        return role, pulumi.Output.all(**blocks), activation_ids
    profile = aws.rolesanywhere.Profile(
        f"{name}-profile",
        name=f"{name}-hybrid-nodes",
        enabled=True,
        role_arns=[role.arn],
        tags=tags,
        opts=child,
    )
    arns = pulumi.Output.all(anchor.arn, profile.arn, role.arn)
    blocks = arns.apply(
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
    return role, blocks, {}
