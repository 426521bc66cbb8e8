"""Stack jobs that run your own code (jobs[].code, a folder of the repository built into an image
over the trainer's) or your own command (jobs[].command, in jobs[].image): what the plan builds
and prints, the manifests the CRDs and policies admit, the revision rule for a folder edit, the
image's Dockerfile under hadolint, and the in-image mode of trainer.user_code and `make
job-local` run for real."""

import json
import os
import shutil
import subprocess
import sys
import uuid

import pytest

from deploy.day_two import consequences
from deploy.plan import summary
from deploy.program import build_platform
from infra.core.config import ConfigError
from infra.core.offline import run_offline
from infra.core.tests.crd_schema import cel_violations, conformance_errors
from infra.images.container_image import source_tag
from infra.integrations import plan_steps
from infra.jobs.config import UserCode
from infra.stack.loading import parse_stack_config
from tests.config_edits import PREBUILT_IMAGE
from tests.integration.test_user_code import policy_refusals
from tests.plugin import ROOT, hadolint, stack_values
from tests.team_cluster import EXAMPLE
from workloads.stack_code import CODE_DIR, dockerfile

JOB = "cnn-example"  # examples/your-own-code as a job of the dev stack
IMAGE = "docker-build:index:Image"
EXAMPLE_CODE = {"workdir": "examples/your-own-code", "run": ["train.py"]}
OWN_IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/team-a/cnn@sha256:" + "1" * 64


CNN = {
    "name": JOB,
    "kind": "TrainJob",
    "nodePool": "cpu",
    "minNodes": 2,
    "maxNodes": 2,
    "queue": "team-a",
    "checkpoint": "efs",
    "code": {
        **EXAMPLE_CODE,
        "run": ["train.py", "--epochs", "4"],
        "requirements": "requirements.txt",
    },
}


def dev_jobs(**changes) -> list[dict]:
    """The dev stack's jobs and the example's, changed; a change to None drops the key."""
    job = {k: v for k, v in {**CNN, **changes}.items() if v is not None}
    return [*stack_values("dev")["training-platform:jobs"], job]


def plan(jobs: list[dict], deployed: dict | None = None):
    values = stack_values("dev", jobs=jobs)
    config = parse_stack_config(values, "Pulumi.dev.yaml")
    return config, run_offline(lambda: build_platform(config), "dev", values, None, deployed)


@pytest.fixture(scope="module")
def code_plan():
    return plan(dev_jobs())[1]


def job_manifest(plan, name: str) -> dict:
    return plan.outputs["jobs"][name]["manifest"]


# -- what the plan builds, runs and prints ---------------------------------------------------


def test_a_code_job_is_its_folder_built_over_the_trainer_image_and_run_by_user_code(code_plan):
    build = code_plan.one(IMAGE, f"job-code-{JOB}").inputs
    assert build["context"]["location"] == "../examples/your-own-code"
    trainer = code_plan.outputs["trainerImages"]["runtime"]
    assert build["buildArgs"] == {"BASE": trainer}
    assert build["push"] is True and build["tags"][0].split(":")[0].endswith("/tp-dev/job-code")
    text = build["dockerfile"]["inline"]
    assert text.splitlines()[:2] == ["ARG BASE", "FROM ${BASE}"]
    assert f"COPY . {CODE_DIR}" in text
    pip = "python -m pip install --no-cache-dir -r requirements.txt"
    assert f'RUN ["sh", "-c", "set -e; {pip}"]' in text
    assert text.splitlines()[-1] == "USER 10001"  # never root at run time
    repository = code_plan.one("aws:ecr/repository:Repository", "job-code").inputs
    assert repository["imageTagMutability"] == "IMMUTABLE"
    assert repository["forceDelete"] is False  # older revisions pull their images from it

    job = job_manifest(code_plan, JOB)
    trainer_spec = job["spec"]["trainer"]
    assert trainer_spec["image"] == code_plan.outputs["codeImages"][JOB]
    assert trainer_spec["command"] == [
        "python", "-m", "trainer.user_code", "--code-dir", CODE_DIR,
        "--checkpoint-dir", f"/efs/checkpoints/{JOB}", "--", "train.py", "--epochs", "4",
    ]  # fmt: skip
    assert "args" not in trainer_spec


def test_the_plan_says_what_each_job_runs(code_plan):
    config = parse_stack_config(stack_values("dev", jobs=dev_jobs()), "Pulumi.dev.yaml")
    text = summary(config, code_plan)
    assert "  smoke-cpu runs the trainer --model tiny --steps 200" in text
    image = code_plan.outputs["codeImages"][JOB]
    assert (
        f"  {JOB} runs examples/your-own-code: train.py --epochs 4 (+ requirements.txt), "
        f"built into {image}" in text
    )


@pytest.mark.parametrize("kind", ["PyTorchJob", "TrainJob", "MPIJob"])
def test_a_command_job_runs_its_command_in_its_image_with_the_contracts_folders(kind):
    nodes = {"minNodes": 1, "maxNodes": 2 if kind == "PyTorchJob" else 1}
    jobs = dev_jobs(
        kind=kind, code=None, image=OWN_IMAGE, command=["torchrun", "train.py"], **nodes
    )
    config, found = plan(jobs)
    job = job_manifest(found, JOB)
    assert conformance_errors(job) == [] and cel_violations(job) == []
    if kind == "TrainJob":
        spec = job["spec"]["trainer"]
        command, image, env = spec["command"], spec["image"], spec["env"]
    else:
        replica = "Worker" if kind == "PyTorchJob" else "Launcher"
        specs = job["spec"]["pytorchReplicaSpecs" if kind == "PyTorchJob" else "mpiReplicaSpecs"]
        container = specs[replica]["template"]["spec"]["containers"][0]
        command, image, env = container["command"], container["image"], container["env"]
    assert image == OWN_IMAGE
    assert command[-2:] == ["torchrun", "train.py"]
    variables = {e["name"]: e["value"] for e in env}
    assert [e["name"] for e in env].count("CHECKPOINT_DIR") == 1
    assert variables["CHECKPOINT_DIR"] == f"/efs/checkpoints/{JOB}"
    assert variables["TENSORBOARD_DIR"] == f"/efs/checkpoints/{JOB}/tensorboard"
    assert variables["OUTPUT_DIR"] == f"/efs/checkpoints/{JOB}/outputs"
    if kind == "MPIJob":  # mpirun hands them to every rank
        assert {"-x", "TENSORBOARD_DIR"} <= set(command)
    assert IMAGE not in {r.type for r in found.resources if r.name.startswith("job-code")}


def test_stack_jobs_of_own_code_pass_the_crds_and_every_admission_policy(code_plan):
    job = job_manifest(code_plan, JOB)
    assert conformance_errors(job) == [] and cel_violations(job) == []
    # Created by `pulumi up` with the stack's rights, not a member's: the policies still apply.
    assert policy_refusals(code_plan, job, username="admin") == {}


# -- day two: a folder edit waits for the revision -------------------------------------------


@pytest.fixture
def code_copy():
    """A copy of the example inside the repository (a job's folder must be): build/ is ignored."""
    folder = ROOT / "build" / "test-stack-code" / uuid.uuid4().hex[:8]
    shutil.copytree(EXAMPLE, folder, ignore=shutil.ignore_patterns("__pycache__", "run"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_a_folder_edit_is_a_new_image_held_back_until_the_revision_goes_up(code_copy):
    code = {"workdir": code_copy.relative_to(ROOT).as_posix(), "run": ["train.py"]}
    _, base = plan(dev_jobs(code=code))
    (code_copy / "train.py").write_text((code_copy / "train.py").read_text() + "\n# edited\n")

    config, after = plan(dev_jobs(code=code), base.outputs)
    assert after.outputs["codeImages"][JOB] != base.outputs["codeImages"][JOB]
    effects = consequences(
        plan_steps(base, after), config, "dev", after.outputs["jobs"], after.outputs["runtimes"]
    )
    (held,) = [r for r in effects.restarts if r.startswith(f"job {JOB} keeps revision 1")]
    assert "changes to its image wait for" in held
    assert job_manifest(after, JOB) == job_manifest(base, JOB)  # it runs what it was given

    config, bumped = plan(dev_jobs(code=code, revision=2), base.outputs)
    image = job_manifest(bumped, JOB)["spec"]["trainer"]["image"]
    assert image == after.outputs["codeImages"][JOB]


def test_the_image_tag_follows_what_rebuilds_it(tmp_path):
    (tmp_path / "train.py").write_text("print(1)\n")
    code = UserCode(run=["train.py"])
    tag = source_tag("job", tmp_path, None, dockerfile(code), ("base-1",))
    assert source_tag("job", tmp_path, None, dockerfile(code), ("base-2",)) != tag
    with_setup = UserCode(run=["train.py"], setup="pip install -e .")
    assert source_tag("job", tmp_path, None, dockerfile(with_setup), ("base-1",)) != tag
    (tmp_path / ".dockerignore").write_text("data/\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "big.bin").write_bytes(b"0" * 10)  # not sent to Docker: no rebuild
    assert source_tag("job", tmp_path, None, dockerfile(code), ("base-1",)) != tag  # new ignore
    ignored = source_tag("job", tmp_path, None, dockerfile(code), ("base-1",))
    (tmp_path / "data" / "big.bin").write_bytes(b"1" * 10)
    assert source_tag("job", tmp_path, None, dockerfile(code), ("base-1",)) == ignored


def test_the_code_images_dockerfile_passes_hadolint(tmp_path):
    code = UserCode(
        run=["train.py"],
        requirements="requirements.txt",
        setup="python -m compileall -q .",
        env={"PIP_INDEX_URL": "https://pypi.example/simple"},
    )
    text = dockerfile(code)
    assert "ARG PIP_INDEX_URL" in text  # the install sees the job's variables
    (tmp_path / "Dockerfile").write_text(text)
    assert hadolint(tmp_path / "Dockerfile") == ""


# -- bad stack config: one line naming the key -----------------------------------------------


@pytest.mark.parametrize(
    "changes,said",
    [
        ({"args": ["--model", "tiny"]}, "args and code: one program per job"),
        ({"kind": "MPIJob"}, "an MPIJob under mpirun"),
        ({"checkpoint": "s3"}, "allowed: checkpoint efs or fsx"),
        ({"code": {"workdir": "../elsewhere", "run": ["t.py"]}}, "a folder inside the repository"),
        ({"code": {"workdir": "examples/nope", "run": ["t.py"]}}, "is no folder of the repository"),
        ({"code": {**EXAMPLE_CODE, "run": ["nope.py"]}}, "no script 'nope.py'"),
        ({"code": {**EXAMPLE_CODE, "requirements": "r.txt"}}, "no file 'r.txt'"),
        ({"code": None, "image": OWN_IMAGE}, "image needs command"),
        ({"code": None, "image": "team/cnn:latest", "command": ["x"]}, "is not by digest"),
        ({"code": {**EXAMPLE_CODE, "env": {"RANK": "1"}}}, "RANK: set by the platform"),
    ],
)  # fmt: skip
def test_a_bad_code_or_command_is_one_clear_error_naming_the_job(changes, said):
    jobs = dev_jobs(**changes)
    with pytest.raises(ConfigError) as caught:
        parse_stack_config(stack_values("dev", jobs=jobs), "Pulumi.dev.yaml")
    message = str(caught.value)
    assert said in message and "training-platform:jobs[cnn-example]" in message
    assert "Traceback" not in message


def test_a_stack_of_prebuilt_images_refuses_code_it_cannot_build():
    with pytest.raises(ConfigError) as caught:
        values = stack_values("dev", image={"uri": PREBUILT_IMAGE}, jobs=dev_jobs())
        parse_stack_config(values, "Pulumi.dev.yaml")
    assert "this stack builds no images (image.uri is set)" in str(caught.value)


# -- run for real -----------------------------------------------------------------------------


def test_in_its_image_user_code_runs_the_built_folder_in_place_and_writes_only_the_jobs_folder(
    tmp_path,
):
    folder = tmp_path / "code"  # as the image has it: the folder, read-only to the trainer
    shutil.copytree(EXAMPLE, folder, ignore=shutil.ignore_patterns("__pycache__", "run"))
    for path in [folder, *folder.rglob("*")]:
        path.chmod(0o555 if path.is_dir() else 0o444)
    job = tmp_path / "job"
    done = subprocess.run(
        [sys.executable, "-m", "trainer.user_code", "--code-dir", str(folder), "--checkpoint-dir",
         str(job), "--", "--standalone", "--nproc-per-node=2", "train.py", "--epochs", "1",
         "--samples", "256"],
        cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "done at step 4" in done.stdout and "building environment" not in done.stderr
    assert (job / "outputs" / "model.pt").is_file() and list((job / "tensorboard").iterdir())
    sent = {p.name for p in EXAMPLE.iterdir()} - {"__pycache__", "run"}
    assert {p.name for p in folder.iterdir()} == sent  # nothing written beside the code


def test_user_code_takes_a_snapshot_or_a_built_folder_not_both(tmp_path):
    both = [sys.executable, "-m", "trainer.user_code", "--code-dir", str(tmp_path),
            "--code-store", str(tmp_path), "--code", "0" * 64, "--checkpoint-dir", str(tmp_path),
            "--", "t.py"]  # fmt: skip
    done = subprocess.run(both, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "or --code-dir (a built folder)" in done.stderr
    done = subprocess.run(
        [*both[:5], *both[9:11], "--requirements", "r.txt", "--", "t.py"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "belong to its build" in done.stderr


# `python -m workloads.local` with the dev stack and the example's job in it (the dev stack file
# has no such job): the real main, which ends by exec'ing trainer.user_code.
JOB_LOCAL = """
import json, sys
import workloads.local
from infra.stack.loading import parse_stack_config
config = parse_stack_config(json.loads(sys.argv[1]), "Pulumi.dev.yaml")
workloads.local.load_stack_for_command = lambda stack: config
sys.exit(workloads.local.main(sys.argv[2:]))
"""


def test_make_job_local_runs_a_code_job_as_devctl_submit_local_does(tmp_path):
    short = {**CNN["code"], "run": ["train.py", "--epochs", "1", "--samples", "512"]}
    values = json.dumps(stack_values("dev", jobs=dev_jobs(code=short)))
    done = subprocess.run(
        [sys.executable, "-c", JOB_LOCAL, values, JOB, "--checkpoint-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"+ {JOB}: " in done.stdout and "done at step 8" in done.stdout
    job = tmp_path / "checkpoints" / JOB
    assert (job / "outputs" / "model.pt").is_file()
    assert len(list((tmp_path / "user-code" / "code").glob("*.tar"))) == 1


def test_make_job_local_says_how_to_run_a_command_job(monkeypatch, capsys):
    import workloads.local

    jobs = dev_jobs(code=None, image=OWN_IMAGE, command=["torchrun", "train.py"])
    config = parse_stack_config(stack_values("dev", jobs=jobs), "Pulumi.dev.yaml")
    monkeypatch.setattr(workloads.local, "load_stack_for_command", lambda stack: config)
    assert workloads.local.main([JOB]) == 2
    said = capsys.readouterr().err
    assert "runs its own command (torchrun train.py)" in said and OWN_IMAGE in said
