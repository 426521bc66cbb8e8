"""EFS keeps tenants apart (issue 28, point 1): the prod plan's file system policy, evaluated
with IAM's rules (infra.core.tests.iam_rules) for the clients that matter, and its volumes' mount
options."""

import json

from infra.core.tests import iam_rules

ACCOUNT = "123456789012"  # the offline plan's account (infra/core/offline.py)


# EFS: a mount is elasticfilesystem:ClientMount (ClientWrite to write) on the file system, with
# aws:SecureTransport "true" over TLS, elasticfilesystem:AccessPointArn when it goes through an
# access point, elasticfilesystem:AccessedViaMountTarget "true" through a mount target (EFS user
# guide, "Using IAM to control access to file systems"); without IAM the client is anonymous.
# With no file system policy of its own, the default one "grants full access to any anonymous
# client that can connect to the file system using a mount target" (same page), as written here.
DEFAULT_EFS_POLICY = {
    "Statement": [
        {
            "Effect": "Allow",
            "Principal": {"AWS": "*"},
            "Action": "elasticfilesystem:Client*",
            "Resource": "*",
            "Condition": {"Bool": {"elasticfilesystem:AccessedViaMountTarget": "true"}},
        }
    ]
}
# What roles that are not the nodes' might be granted in their own policies.
CLIENT_EVERYWHERE = {
    "Statement": [{"Effect": "Allow", "Action": "elasticfilesystem:Client*", "Resource": "*"}]
}


def efs_decisions(plan) -> dict[str, dict[str, bool]]:
    """Per client: whether it may mount (ClientMount) and write (ClientWrite)."""
    (file_system,) = plan.of_type("aws:efs/fileSystem:FileSystem")
    policies = plan.of_type("aws:efs/fileSystemPolicy:FileSystemPolicy")
    policy = json.loads(policies[0].inputs["policy"]) if policies else DEFAULT_EFS_POLICY
    points = {
        a.inputs["rootDirectory"]["path"]: a.outputs["arn"]
        for a in plan.of_type("aws:efs/accessPoint:AccessPoint")
    }
    team_a = points["/namespaces/team-a"]
    node = iam_rules.Principal(f"arn:aws:iam::{ACCOUNT}:role/KarpenterNode-tp-prod")
    tls = {"aws:SecureTransport": "true", "elasticfilesystem:AccessedViaMountTarget": "true"}
    through_team_a = {**tls, "elasticfilesystem:AccessPointArn": team_a}
    other_point = team_a.rsplit("/", 1)[0] + "/fsap-00000000000000000"
    clients = {
        "node, TLS, team-a's access point": (node, through_team_a),
        "node, no TLS, team-a's access point": (
            node,
            {**through_team_a, "aws:SecureTransport": "false"},
        ),
        "anonymous, TLS, team-a's access point": (None, through_team_a),
        "anonymous, no TLS, no access point": (None, {**tls, "aws:SecureTransport": "false"}),
        "node, TLS, the file system's root": (node, tls),
        "node, TLS, an access point not the platform's": (
            node,
            {**tls, "elasticfilesystem:AccessPointArn": other_point},
        ),
        "another account's role allowed everywhere by its own policy": (
            iam_rules.Principal("arn:aws:iam::999999999999:role/elsewhere", (CLIENT_EVERYWHERE,)),
            through_team_a,
        ),
        "a role of this account allowed everywhere by its own policy, the root": (
            iam_rules.Principal(f"arn:aws:iam::{ACCOUNT}:role/broad", (CLIENT_EVERYWHERE,)),
            tls,
        ),
        "a role of this account allowed everywhere by its own policy, team-a's access point": (
            iam_rules.Principal(f"arn:aws:iam::{ACCOUNT}:role/broad", (CLIENT_EVERYWHERE,)),
            through_team_a,
        ),
    }
    return {
        name: {
            action: iam_rules.allowed(
                iam_rules.Request(
                    f"elasticfilesystem:{action}", file_system.outputs["arn"], principal, context
                ),
                policy,
                ACCOUNT,
            )
            for action in ("ClientMount", "ClientWrite")
        }
        for name, (principal, context) in clients.items()
    }


def test_efs_admits_only_tls_mounts_through_the_platforms_access_points(prod_plan):
    decisions = efs_decisions(prod_plan)
    allowed = {name for name, d in decisions.items() if all(d.values())}
    refused = {name for name, d in decisions.items() if not any(d.values())}
    assert allowed == {
        "node, TLS, team-a's access point",
        # IAM allows a same-account principal on its own policy's word, and EFS evaluates no
        # key that could tell the nodes' sessions apart (docs: what remains).
        "a role of this account allowed everywhere by its own policy, team-a's access point",
    }
    assert refused == set(decisions) - allowed


def test_efs_volumes_mount_with_iam_and_the_node_role_may(prod_plan):
    efs = [
        v.inputs["spec"]
        for v in prod_plan.of_type("kubernetes:core/v1:PersistentVolume")
        if v.inputs["spec"]["csi"]["driver"] == "efs.csi.aws.com"
    ]
    assert len(efs) == 4  # three teams, one user
    for spec in efs:
        # tls: the driver adds it to every access point mount (volumeHandle fs::fsap).
        assert spec["mountOptions"] == ["iam"] and "::fsap-" in spec["csi"]["volumeHandle"]
        assert "volumeAttributes" not in spec["csi"]
    (policy,) = prod_plan.of_type("aws:efs/fileSystemPolicy:FileSystemPolicy")
    roles = {r.outputs["arn"] for r in prod_plan.of_type("aws:iam/role:Role")}
    (mounts,) = [
        s for s in json.loads(policy.inputs["policy"])["Statement"] if s["Effect"] == "Allow"
    ]
    (system_nodes,) = [r for r in roles if ":role/cluster-system-node-" in r]
    # Karpenter's nodes run jobs and DevServers; the system nodes run each team's TensorBoard.
    assert mounts["Principal"]["AWS"] == [
        f"arn:aws:iam::{ACCOUNT}:role/KarpenterNode-tp-prod",
        system_nodes,
    ]
