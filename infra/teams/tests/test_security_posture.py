"""Security posture of what the program declares: pods, namespaces, trust policies, secrets."""

import json

from infra.kueue.queues import POD_SECURITY_LABELS
from trainer import TRAINER_UID

PYTORCHJOB = "kubernetes:kubeflow.org/v1:PyTorchJob"
MPIJOB = "kubernetes:kubeflow.org/v2beta1:MPIJob"


def pod_templates(plan):
    for job in plan.of_type(PYTORCHJOB) + plan.of_type(MPIJOB):
        spec = job.inputs["spec"]
        for role, replica in (spec.get("pytorchReplicaSpecs") or spec["mpiReplicaSpecs"]).items():
            yield f"{job.name}/{role}", replica["template"]


def test_every_job_pod_runs_restricted_without_an_api_token(stack_plan):
    templates = dict(pod_templates(stack_plan))
    assert templates
    for where, template in templates.items():
        pod = template["spec"]
        assert pod["automountServiceAccountToken"] is False, where
        assert pod["securityContext"]["runAsNonRoot"] is True, where
        assert pod["securityContext"]["runAsUser"] == TRAINER_UID, where
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, where
        assert not {"hostNetwork", "hostPID", "hostIPC"} & set(pod), where
        for container in pod["containers"]:
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False, where
            assert context["capabilities"] == {"drop": ["ALL"]}, where


def test_mpi_workers_keep_serving_ssh_as_the_trainer_user(dev_plan):
    (job,) = dev_plan.of_type(MPIJOB)
    spec = job.inputs["spec"]
    worker = spec["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    assert worker["containers"][0]["command"][:1] == ["/usr/sbin/sshd"]
    assert spec["sshAuthMountPath"] == "/home/trainer/.ssh"
    assert worker["securityContext"]["runAsUser"] == TRAINER_UID


def test_job_pods_accept_traffic_only_from_their_own_job(stack_plan):
    policies = {
        p.inputs["metadata"]["name"]: p.inputs
        for p in stack_plan.of_type("kubernetes:networking.k8s.io/v1:NetworkPolicy")
    }
    jobs = stack_plan.of_type(PYTORCHJOB) + stack_plan.of_type(MPIJOB)
    for job in jobs:
        name = job.inputs["metadata"]["name"]
        policy = policies[f"{name}-own-pods"]
        own = {"matchLabels": {"training-platform/job": name}}
        assert policy["metadata"]["namespace"] == job.inputs["metadata"]["namespace"]
        assert policy["spec"] == {
            "podSelector": own,
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": own}]}],
        }


def test_team_namespaces_enforce_pod_security(stack_plan):
    labelled = [
        n.inputs["metadata"]
        for n in stack_plan.of_type("kubernetes:core/v1:Namespace")
        if "training-platform/team" in n.inputs["metadata"]["labels"]
    ]
    assert labelled
    for metadata in labelled:
        enforced = metadata["labels"]["pod-security.kubernetes.io/enforce"]
        assert enforced in {"baseline", "restricted"}, metadata["name"]
    teams = [
        n.inputs["metadata"]["labels"]
        for n in stack_plan.of_type("kubernetes:core/v1:Namespace")
        if n.name.startswith("queues-ns-")
    ]
    assert teams
    for labels in teams:
        assert {k: labels[k] for k in POD_SECURITY_LABELS} == {
            "pod-security.kubernetes.io/enforce": "baseline",
            "pod-security.kubernetes.io/warn": "restricted",
            "pod-security.kubernetes.io/audit": "restricted",
        }


def test_pod_identity_roles_trust_one_service_account_of_this_cluster(prod_plan):
    associations = {
        (a.inputs["namespace"], a.inputs["serviceAccount"])
        for a in prod_plan.of_type("aws:eks/podIdentityAssociation:PodIdentityAssociation")
    }
    trusted = set()
    for role in prod_plan.of_type("aws:iam/role:Role"):
        (statement,) = json.loads(role.inputs["assumeRolePolicy"])["Statement"]
        if statement["Principal"] != {"Service": "pods.eks.amazonaws.com"}:
            continue
        tags = statement["Condition"]["StringEquals"]
        assert tags["aws:RequestTag/eks-cluster-name"] == "tp-prod"
        trusted.add(
            (
                tags["aws:RequestTag/kubernetes-namespace"],
                tags["aws:RequestTag/kubernetes-service-account"],
            )
        )
    # Every job and the Karpenter controller (the CSI add-ons associate inside their add-on).
    assert associations <= trusted
    assert {("kube-system", "ebs-csi-controller-sa"), ("research-jobs", "gpt-large-mpi")} <= trusted


def test_interruption_queue_takes_events_only_from_this_clusters_rules(dev_plan):
    (policy,) = dev_plan.of_type("aws:sqs/queuePolicy:QueuePolicy")
    (send, _) = json.loads(policy.inputs["policy"])["Statement"]
    rules = dev_plan.of_type("aws:cloudwatch/eventRule:EventRule")
    expected = [f"arn:aws:events:us-west-2:123456789012:rule/{r.inputs['name']}" for r in rules]
    assert sorted(send["Condition"]["ArnEquals"]["aws:SourceArn"]) == sorted(expected)
    assert all(
        len(r.inputs["name"]) <= 64 and r.inputs["name"].startswith("tp-dev-") for r in rules
    )


def test_ecr_token_is_a_secret_in_the_plan(dev_plan):
    images = dev_plan.of_type("docker-build:index:Image")
    assert images
    for image in images:
        (registry,) = image.inputs["registries"]
        assert registry["password"] == "[secret]"
