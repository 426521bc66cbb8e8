"""Workloads: trainer image, per-job identity, PyTorchJob and MPIJob manifests, the local twin."""

import json
import shutil
import subprocess
import sys

import pytest

from infra.core.config import ConfigError
from infra.core.tests.crd_schema import conformance_errors
from infra.images.container_image import context_files, source_tag
from infra.stack.loading import parse_stack_config
from tests.plugin import ROOT, plan_of, stack_values
from workloads.image import CONTEXT, trainer_tag
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
    # A finished job stays (no TTL), so `pulumi up --refresh` never recreates and re-runs it.
    assert spec["runPolicy"] == {"backoffLimit": 3, "cleanPodPolicy": "None"}
    worker = spec["pytorchReplicaSpecs"]["Worker"]
    assert worker["replicas"] == 4 and worker["restartPolicy"] == "OnFailure"
    template = worker["template"]
    assert template["metadata"]["annotations"] == {"karpenter.sh/do-not-disrupt": "true"}
    pod = template["spec"]
    assert pod["nodeSelector"] == {
        "training-platform.node-restriction.kubernetes.io/pool": "gpu-small"
    }
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
    # All the node's GPUs (no EFA on g5 here), and the CPU and memory the node has left for it
    # (g5.12xlarge: 48 vCPU, 192 GiB): Kueue charges them, and the pod is never BestEffort.
    assert main["resources"] == {
        "requests": {"cpu": "43", "memory": "163Gi", "nvidia.com/gpu": "4"},
        "limits": {"memory": "163Gi", "nvidia.com/gpu": "4"},
    }
    assert "@sha256:" in main["image"]
    assert main["command"][:5] == ["python", "-m", "trainer.launch", "-m", "trainer"]
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
    resources = container(worker["template"])["resources"]
    # p4d.24xlarge: 96 vCPU, 1152 GiB, 8 GPUs, 4 EFA network cards.
    assert resources["limits"] == {
        "memory": "979Gi",
        "nvidia.com/gpu": "8",
        "vpc.amazonaws.com/efa": "4",
    }
    assert resources["requests"] == {"cpu": "86", **resources["limits"]}
    env = {e["name"]: e["value"] for e in container(worker["template"])["env"]}
    assert env["FI_PROVIDER"] == "efa"
    launcher = container(spec["mpiReplicaSpecs"]["Launcher"]["template"])
    command = launcher["command"]
    assert command[:3] == ["mpirun", "-np", "16"] and "trainer" in command
    assert command[-2:] == ["--checkpoint-dir", "/efs/checkpoints/gpt-large-mpi"]
    # The launcher takes no GPU, only a little CPU and memory.
    assert launcher["resources"] == {
        "requests": {"cpu": "1", "memory": "2Gi"},
        "limits": {"memory": "2Gi"},
    }
    # The EFA pool's jobs run the image target with libfabric and aws-ofi-nccl.
    images = dev_plan.outputs["trainerImages"]
    assert container(worker["template"])["image"] == images["efa"] == launcher["image"]
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
    assert pod["nodeSelector"] == {"training-platform.node-restriction.kubernetes.io/pool": "cpu"}
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
        "checkpoints/team-a/gpt-small/",
        "checkpoints/team-a/gpt-small/*",
    ]


def test_jobs_wait_for_operators_identity_and_its_permissions(dev_plan):
    job = job_of(dev_plan, "gpt-small")
    for operator in dev_plan.of_type("kubernetes:kustomize/v2:Directory"):
        assert operator.urn in job.dependencies, operator.name
    identity = dev_plan.one(
        "aws:eks/podIdentityAssociation:PodIdentityAssociation", "job-gpt-small"
    )
    assert identity.urn in job.dependencies
    # The identity exists only once its role may do what the job needs, and on destroy the
    # permissions outlive it.
    grant = dev_plan.one("aws:iam/rolePolicy:RolePolicy", "job-gpt-small-pods")
    assert grant.urn in identity.dependencies


def test_trainer_image_is_built_into_a_scanned_immutable_protected_repository(dev_plan):
    resource = dev_plan.one("aws:ecr/repository:Repository", "trainer-image")
    repository = resource.inputs
    assert repository["imageScanningConfiguration"] == {"scanOnPush": True}
    assert repository["imageTagMutability"] == "IMMUTABLE"
    # Running jobs pull from it: never emptied by a deletion, protected (tests/e2e/test_day_two.py).
    assert repository["forceDelete"] is False and resource.protect
    rules = json.loads(
        dev_plan.one("aws:ecr/lifecyclePolicy:LifecyclePolicy", "trainer-image").inputs["policy"]
    )["rules"]
    assert {r["selection"]["tagStatus"] for r in rules} == {"untagged", "any"}
    images = dev_plan.outputs["trainerImages"]
    assert set(images) == {"runtime", "efa"}
    for target in images:
        image = dev_plan.one("docker-build:index:Image", f"trainer-image-{target}").inputs
        # Paths as the engine resolves them, from the program's working directory (deploy/).
        assert image["context"] == {"location": "../trainer"}
        assert image["dockerfile"] == {"location": "../trainer/Dockerfile"}
        assert image["target"] == target and image["push"] is True
        (tag,) = image["tags"]
        assert tag.endswith(f":{trainer_tag(target)}")
    gpt_small = job_of(dev_plan, "gpt-small").inputs["spec"]["pytorchReplicaSpecs"]["Worker"]
    assert container(gpt_small["template"])["image"] == images["runtime"]


def test_build_context_is_the_trainer_folder_less_dockerignore():
    files = {p.relative_to(ROOT / "trainer").as_posix() for p in context_files(CONTEXT)}
    assert {"train.py", "requirements.txt", "__init__.py"} <= files
    assert not any("__pycache__" in f or f.endswith(".pyc") for f in files)
    assert "Dockerfile" not in files and ".dockerignore" not in files


def test_image_tag_changes_exactly_when_the_build_would(tmp_path):
    """ECR tags are immutable: a rebuild (new digest) must come with a new tag, and a tag must
    not change when nothing the build reads did."""
    context = tmp_path / "trainer"
    shutil.copytree(ROOT / "trainer", context, ignore=shutil.ignore_patterns("__pycache__"))
    dockerfile = context / "Dockerfile"
    before = source_tag("runtime", context, dockerfile)
    assert source_tag("efa", context, dockerfile) != before
    (context / "__pycache__").mkdir()
    (context / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"ignored by docker")
    assert source_tag("runtime", context, dockerfile) == before
    (context / "train.py").write_text((context / "train.py").read_text() + "\n# changed\n")
    changed = source_tag("runtime", context, dockerfile)
    assert changed != before
    (context / "train.py").chmod(0o755)
    assert source_tag("runtime", context, dockerfile) != changed
    dockerfile.write_text(dockerfile.read_text() + "\n# changed\n")
    assert source_tag("runtime", context, dockerfile) not in {before, changed}


def test_prebuilt_image_by_digest_skips_the_build():
    plan = plan_of(
        "dev",
        image={"uri": DIGEST},
        devServers={"operatorImage": {"uri": DIGEST}},
        karpenter={"gpuRegistrationWatchImage": {"uri": DIGEST}},
        billing={"usageRecorderImage": {"uri": DIGEST}},
    )
    assert not plan.of_type("docker-build:index:Image") and not plan.of_type(
        "aws:ecr/repository:Repository"
    )
    template = job_of(plan, "gpt-small").inputs["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    assert container(template)["image"] == DIGEST
    # A prebuilt image serves EFA pools too: the README says it must ship libfabric and
    # aws-ofi-nccl (as `docker build --target efa trainer/` does).
    worker = job_of(plan, "gpt-large-mpi").inputs["spec"]["mpiReplicaSpecs"]["Worker"]
    assert container(worker["template"])["image"] == DIGEST
    for name in ("gpu-registration-watch", "usage-recorder"):
        cronjob = plan.one("kubernetes:batch/v1:CronJob", name).inputs
        assert container(cronjob["spec"]["jobTemplate"]["spec"]["template"])["image"] == DIGEST


def bad_job(**changes):
    job = {"name": "j", "kind": "PyTorchJob", "nodePool": "gpu-small", "minNodes": 1,
           "maxNodes": 2, "queue": "team-a"}  # fmt: skip
    # A change to None leaves the key out.
    merged = {key: value for key, value in {**job, **changes}.items() if value is not None}
    return stack_values("dev", jobs=[merged])


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
        ({"kind": "TFJob"}, "jobs[j].kind", "'PyTorchJob', 'MPIJob' or 'TrainJob'"),
        ({"minNodes": 3}, "jobs[j]", "minNodes 3 > maxNodes 2"),
        ({"kind": "MPIJob"}, "jobs[j]", "an MPIJob is not elastic"),
        ({"kind": "TrainJob"}, "jobs[j]", "a TrainJob (the default kind) is not elastic"),
        ({"kind": None}, "jobs[j]", "a TrainJob (the default kind) is not elastic"),
        (
            {"maxNodes": 1},
            "jobs[j].kind",
            "a PyTorchJob runs on the training operator v1, which upstream no longer maintains: "
            "it is kept for elastic jobs and the hybrid machines alone",
        ),
        (
            {"kind": "TrainJob", "minNodes": 2, "name": "9lives"},
            "jobs[9lives]",
            "a TrainJob's name must start with a letter",
        ),
        (
            {"kind": "TrainJob", "minNodes": 2, "checkpoint": "fsx"},
            "jobs[j]",
            "prepare no folder on FSx",
        ),
        (
            {"kind": "TrainJob", "minNodes": 2, "maxRestarts": 5},
            "jobs[j]",
            "a TrainJob restarts as its pool's runtime allows (3 times)",
        ),
        (
            {"name": "self-service-jobs"},
            "jobs[self-service-jobs]",
            "would run as the team's self-service identity",
        ),
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
    """The command `make job-local` runs: the job's arguments with the steps replaced. The docs'
    example (docs/users/jobs.md, `make job-local JOB=smoke-cpu STEPS=20`) runs it to the end
    under tests/e2e/test_docs_examples.py."""
    config = parse_stack_config(stack_values("dev"), "Pulumi.dev.yaml")
    (job,) = [j for j in config.jobs if j.name == "smoke-cpu"]
    command = local_command(list(job.args), nproc=2, steps=3, checkpoint=tmp_path / "ckpt")
    steps = job.args.index("--steps")
    assert command[command.index("trainer") + 1 :] == [
        *job.args[: steps + 1],
        "3",
        *job.args[steps + 2 :],
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
    ]
    assert "--nproc-per-node=2" in command


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
