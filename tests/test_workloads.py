"""Workloads: trainer image, per-job identity, PyTorchJob and MPIJob manifests, the local twin."""

import json
import subprocess
import sys

import pytest

from infra.config import ConfigError, parse_stack_config
from tests.conftest import ROOT, plan_of, stack_values
from tests.crd_schema import conformance_errors
from workloads.local import local_command

PYTORCHJOB = "kubernetes:kubeflow.org/v1:PyTorchJob"
MPIJOB = "kubernetes:kubeflow.org/v2beta1:MPIJob"
DIGEST = "123456789012.dkr.ecr.us-west-2.amazonaws.com/prebuilt/trainer@sha256:" + "b" * 64


def job_of(plan, name):
    (job,) = [
        r
        for r in plan.of_type(PYTORCHJOB) + plan.of_type(MPIJOB)
        if r.inputs["metadata"]["name"] == name
    ]
    return job


def container(template):
    (only,) = template["spec"]["containers"]
    return only


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_every_job_conforms_to_its_crd(stack, request):
    plan = request.getfixturevalue(f"{stack}_plan")
    jobs = plan.of_type(PYTORCHJOB) + plan.of_type(MPIJOB)
    assert {j.inputs["kind"] for j in jobs} == {"PyTorchJob", "MPIJob"}
    for job in jobs:
        assert conformance_errors(job.inputs) == [], job.name


def test_elastic_pytorchjob_on_a_gpu_pool(dev_plan):
    job = job_of(dev_plan, "gpt-small").inputs
    assert job["metadata"]["namespace"] == "team-a"
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    spec = job["spec"]
    assert spec["elasticPolicy"] == {
        "rdzvBackend": "c10d",
        "minReplicas": 2,
        "maxReplicas": 4,
        "maxRestarts": 3,
    }
    assert spec["nprocPerNode"] == "4"  # g5.12xlarge has 4 GPUs
    assert (
        spec["runPolicy"]["backoffLimit"] == 3 and spec["runPolicy"]["ttlSecondsAfterFinished"] > 0
    )
    worker = spec["pytorchReplicaSpecs"]["Worker"]
    assert worker["replicas"] == 4 and worker["restartPolicy"] == "OnFailure"
    template = worker["template"]
    assert template["metadata"]["annotations"] == {"karpenter.sh/do-not-disrupt": "true"}
    pod = template["spec"]
    assert pod["nodeSelector"] == {"training-platform/pool": "gpu-small"}
    assert {
        "key": "nvidia.com/gpu",
        "operator": "Equal",
        "value": "true",
        "effect": "NoSchedule",
    } in pod["tolerations"]
    assert pod["serviceAccountName"] == "gpt-small"
    assert pod["terminationGracePeriodSeconds"] >= 60
    main = container(template)
    assert main["name"] == "pytorch"
    assert main["resources"]["limits"] == {
        "nvidia.com/gpu": "4"
    }  # all the node's GPUs, no EFA on g5 here
    assert "@sha256:" in main["image"]
    assert main["command"][:3] == ["torchrun", "-m", "trainer"]
    bucket = dev_plan.outputs["bucketName"]
    assert main["command"][-2:] == [
        "--checkpoint-dir",
        f"s3://{bucket}/checkpoints/team-a/gpt-small",
    ]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    assert {"name": "dshm", "mountPath": "/dev/shm"} in main["volumeMounts"]
    assert volumes["efs"]["persistentVolumeClaim"] == {"claimName": "efs-shared"}


def test_mpijob_with_efa_runs_the_trainer_through_mpirun(dev_plan):
    spec = job_of(dev_plan, "gpt-large-mpi").inputs["spec"]
    assert spec["slotsPerWorker"] == 8  # p4d.24xlarge
    worker = spec["mpiReplicaSpecs"]["Worker"]
    assert worker["replicas"] == 2
    resources = container(worker["template"])["resources"]["limits"]
    assert resources == {"nvidia.com/gpu": "8", "vpc.amazonaws.com/efa": "4"}
    env = {e["name"]: e["value"] for e in container(worker["template"])["env"]}
    assert env["FI_PROVIDER"] == "efa"
    launcher = container(spec["mpiReplicaSpecs"]["Launcher"]["template"])
    command = launcher["command"]
    assert command[:3] == ["mpirun", "-np", "16"] and "trainer" in command
    assert command[-2:] == ["--checkpoint-dir", "/efs/checkpoints/gpt-large-mpi"]
    assert "resources" not in launcher  # the launcher takes no GPU
    # Workers serve SSH as the image's non-root user, with the key the operator mounts there.
    assert container(worker["template"])["command"] == [
        "/usr/sbin/sshd",
        "-De",
        "-f",
        "/home/trainer/.sshd_config",
    ]
    assert spec["sshAuthMountPath"] == "/home/trainer/.ssh"
    dockerfile = (ROOT / "trainer" / "Dockerfile").read_text()
    assert "openmpi-bin" in dockerfile and "/home/trainer/.sshd_config" in dockerfile
    launcher_env = {e["name"]: e["value"] for e in launcher["env"]}
    assert launcher_env["MASTER_ADDR"] == "gpt-large-mpi-worker-0.gpt-large-mpi.research.svc"


def test_cpu_variant_runs_on_the_cpu_pool_without_gpus(dev_plan):
    spec = job_of(dev_plan, "smoke-cpu").inputs["spec"]
    pod = spec["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    assert spec["nprocPerNode"] == "1"
    assert pod["nodeSelector"] == {"training-platform/pool": "cpu"}
    assert "tolerations" not in pod
    assert "nvidia.com/gpu" not in json.dumps(container({"spec": pod})["resources"])


def test_each_job_has_its_own_identity_limited_to_its_checkpoint_prefix(dev_plan):
    associations = {
        a.inputs["serviceAccount"]: a.inputs
        for a in dev_plan.of_type("aws:eks/podIdentityAssociation:PodIdentityAssociation")
    }
    assert associations["gpt-small"]["namespace"] == "team-a"
    accounts = {
        (s.inputs["metadata"]["namespace"], s.inputs["metadata"]["name"])
        for s in dev_plan.of_type("kubernetes:core/v1:ServiceAccount")
    }
    assert {
        ("team-a", "gpt-small"),
        ("team-a", "smoke-cpu"),
        ("research", "gpt-large-mpi"),
    } <= accounts
    policy = json.loads(
        dev_plan.one("aws:iam/rolePolicy:RolePolicy", "job-gpt-small-pods").inputs["policy"]
    )
    objects, listing = policy["Statement"]
    assert objects["Resource"].endswith("/checkpoints/team-a/gpt-small/*")
    assert listing["Condition"]["StringLike"]["s3:prefix"] == [
        "checkpoints/team-a/gpt-small",
        "checkpoints/team-a/gpt-small/*",
    ]


def test_jobs_wait_for_operators_identity_and_service_account(dev_plan):
    job = job_of(dev_plan, "gpt-small")
    for dependency in (
        "kubernetes:kustomize/v2:Directory",
        "kubernetes:yaml/v2:ConfigFile",
        "aws:eks/podIdentityAssociation:PodIdentityAssociation",
    ):
        assert any(r.urn in job.dependencies for r in dev_plan.of_type(dependency)), dependency


def test_trainer_image_is_built_into_a_scanned_immutable_repository(dev_plan):
    repository = dev_plan.one("aws:ecr/repository:Repository").inputs
    assert repository["imageScanningConfiguration"] == {"scanOnPush": True}
    assert repository["imageTagMutability"] == "IMMUTABLE"
    rules = json.loads(dev_plan.one("aws:ecr/lifecyclePolicy:LifecyclePolicy").inputs["policy"])[
        "rules"
    ]
    assert {r["selection"]["tagStatus"] for r in rules} == {"untagged", "any"}
    image = dev_plan.one("docker-build:index:Image").inputs
    assert image["dockerfile"] == {"location": "trainer/Dockerfile"} and image["push"] is True
    (tag,) = image["tags"]
    assert ":src-" in tag
    digest_ref = dev_plan.outputs["trainerImage"]
    assert (
        container(
            job_of(dev_plan, "gpt-small").inputs["spec"]["pytorchReplicaSpecs"]["Worker"][
                "template"
            ]
        )["image"]
        == digest_ref
    )


def test_prebuilt_image_by_digest_skips_the_build():
    plan = plan_of("dev", image={"uri": DIGEST})
    assert not plan.of_type("docker-build:index:Image") and not plan.of_type(
        "aws:ecr/repository:Repository"
    )
    template = job_of(plan, "gpt-small").inputs["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    assert container(template)["image"] == DIGEST


def bad_job(**changes):
    job = {"name": "j", "nodePool": "gpu-small", "minNodes": 1, "maxNodes": 2, "queue": "team-a"}
    return stack_values("dev", jobs=[{**job, **changes}])


@pytest.mark.parametrize(
    ("changes", "key_path", "message"),
    [
        ({"maxNodes": 5}, "jobs[j].maxNodes", "exceeds pool gpu-small's maxNodes 4"),
        (
            {"queue": "team-z"},
            "jobs[j].queue",
            "'team-z' is not a team queue; did you mean 'team-a'? allowed: team-a, research",
        ),
        ({"nodePool": "gpu-huge"}, "jobs[j].nodePool", "'gpu-huge' is not a node pool"),
        ({"kind": "TFJob"}, "jobs[j].kind", "'PyTorchJob' or 'MPIJob'"),
        ({"minNodes": 3}, "jobs[j]", "minNodes 3 > maxNodes 2"),
        ({"kind": "MPIJob"}, "jobs[j]", "an MPIJob is not elastic"),
        (
            {"checkpoint": "fsx"},
            "jobs[j].checkpoint",
            "fsx is not enabled in storage; allowed: s3, efs",
        ),
        (
            {"args": ["--model", "huge"]},
            "jobs[j].args",
            "--model 'huge'; allowed: tiny, small, gpt2-124m",
        ),
        ({"args": ["--stepz", "5"]}, "jobs[j].args", "unrecognized arguments: --stepz 5"),
        ({"args": ["--checkpoint-dir", "/x"]}, "jobs[j].args", "set by the platform"),
    ],
)
def test_bad_jobs_are_config_errors(changes, key_path, message):
    with pytest.raises(ConfigError) as caught:
        parse_stack_config(bad_job(**changes), "Pulumi.dev.yaml")
    line = next(x for x in str(caught.value).splitlines() if f"training-platform:{key_path}:" in x)
    assert message in line


def test_local_twin_runs_the_jobs_own_arguments(tmp_path):
    config = parse_stack_config(stack_values("dev"), "Pulumi.dev.yaml")
    (job,) = [j for j in config.jobs if j.name == "smoke-cpu"]
    command = local_command(job, nproc=2, steps=3, checkpoint=tmp_path / "ckpt")
    assert command[command.index("trainer") + 1 :] == [
        *job.args,
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
        "--steps",
        "3",
    ]
    result = subprocess.run(
        [sys.executable, "-m", "workloads.local", "smoke-cpu", "--steps", "3"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    done = json.loads(next(line for line in result.stdout.splitlines() if '"done"' in line))
    assert done["step"] == 3 and len(done["param_digests"]) == 2


def test_local_twin_names_the_jobs_there_are():
    result = subprocess.run(
        [sys.executable, "-m", "workloads.local", "nope"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        result.returncode == 2 and "allowed: gpt-small, gpt-large-mpi, smoke-cpu" in result.stderr
    )
