"""What an ML engineer does with a run: watch its curves in TensorBoard (local folder and S3),
fetch its newest committed checkpoint as one model file (S3 directly, FSx/EFS through a pod on
the local Kubernetes API) and sample text from it; and every CLI option says its default."""

import shutil
from argparse import SUPPRESS

import boto3
import pytest
import torch
import yaml

from infra.core.tests.crd_schema import CRD_DIR
from tests.e2e.test_policies import plan_with
from tests.integration.test_trainer import event, train, train_here
from tests.kube_api import KubeAPI, Kubelet, admission_policies, rbac_of, user
from tests.kube_api.rbac import Authorizer, request_info
from tests.moto_s3 import moto_server, s3_client
from tests.tensorboard_view import (
    SETTINGS_PAGE,
    line_heights,
    screenshot,
    series,
    tensorboard,
    with_settings,
)
from trainer import bench, data, fetch, sample
from trainer.checkpoint import MARKER, step_name
from trainer.cluster_copy import (
    CLAIMS,
    KUEUE_GATE,
    POD_RULES,
    QUEUE_LABEL,
    SERVICE_ACCOUNT,
    copy_pod,
)
from trainer.model import state_digest
from trainer.options import parser as trainer_parser
from trainer.scalars import TAGS


def logged(recs: list[dict], key: str) -> list[tuple[int, float]]:
    return [(r["step"], r[key]) for r in recs if key in r]


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    """A 2-worker run (torchrun, gloo) checkpointing to a local folder."""
    tmp = tmp_path_factory.mktemp("local")
    ckpt = tmp / "ckpt"
    return ckpt, train(tmp, 2, str(ckpt), "--steps", "20", "--eval-every", "10")


def test_tensorboard_shows_the_curves_of_a_two_worker_run(local_run, tmp_path):
    ckpt, recs = local_run
    assert len(list((ckpt / "tensorboard").glob("events.out.tfevents.*"))) == 1  # rank 0's
    with tensorboard(str(ckpt), tmp_path / "tensorboard.log") as url:
        for key in ("loss", "val_loss", "lr", "grad_norm", "tokens_per_s"):
            expected = logged(recs, key)
            shown = series(url, "tensorboard", TAGS[key], len(expected))
            assert [step for step, _ in shown] == [step for step, _ in expected], key
            assert [v for _, v in shown] == pytest.approx([v for _, v in expected], rel=1e-6)
        # Unsmoothed, outliers not ignored (clipping the line), the filter matching loss/train.
        settings = {"_ignoreYOutliers": "false"}
        page = f"{SETTINGS_PAGE}#scalars&tagFilter=loss%2Ftrain&_smoothingWeight=0"
        with with_settings(url, settings) as proxied:
            shot = screenshot(proxied + page, tmp_path / "scalars.png")
    # The page's first card holds the tags the filter matches, loss/train alone: above y = 470 in
    # a window 1400 wide (TensorBoard 2.20), right of the runs list (whose checkbox has the run's
    # colour). Its line falls from step to step as the loss does, scaled to the chart.
    card = shot.crop((shot.width // 4, 0, shot.width, 470))
    losses = logged(recs, "loss")
    heights = line_heights(card, [step for step, _ in losses])
    assert len(heights) == len(losses) >= 4, heights
    drops = [(h - heights[0]) / (heights[-1] - heights[0]) for h in heights]
    loss_drops = [(v - losses[0][1]) / (losses[-1][1] - losses[0][1]) for _, v in losses]
    assert drops == pytest.approx(loss_drops, abs=0.02), (heights, losses)
    assert heights[-1] - heights[0] > 100  # falling down the chart, from top to bottom


@pytest.fixture(scope="module")
def s3_run(tmp_path_factory):
    """A run checkpointing to S3 (moto's) to step 20 whose last checkpoint never committed (a
    crash while saving), restarted from step 10 to step 25: it logs steps 15 and 20 again.
    Its environment, URI and the two runs' records."""
    tmp = tmp_path_factory.mktemp("s3")
    with moto_server() as env:
        s3 = s3_client(env)
        s3.create_bucket(Bucket="ckpts")
        uri = "s3://ckpts/checkpoints/team-a/job"
        # One thread: a second one, on a machine whose cores are busy, mostly waits for it.
        args = ["--eval-every", "10", "--threads", "1"]
        first = train_here(tmp, uri, "--steps", "20", *args, env=env)
        s3.delete_object(Bucket="ckpts", Key=f"checkpoints/team-a/job/{step_name(20)}/{MARKER}")
        second = train_here(tmp, uri, "--steps", "25", *args, env=env)
        assert event(second, "start")["resumed_from"] == 10
        yield env, uri, first, second


def test_tensorboard_reads_one_curve_per_metric_from_s3_across_a_restart(s3_run, tmp_path):
    env, uri, first, second = s3_run
    keys = [o["Key"] for o in s3_client(env).list_objects_v2(Bucket="ckpts")["Contents"]]
    prefix = "checkpoints/team-a/job/tensorboard/events.out.tfevents."
    assert len([k for k in keys if k.startswith(prefix)]) == 2  # one per run
    # A team's TensorBoard reads all its jobs: each job's curves are a run of their own. Up to
    # the checkpoint the restart resumed from, the first run's points; after it, the
    # restart's alone: no step twice.
    with tensorboard("s3://ckpts/checkpoints/team-a", tmp_path / "tensorboard.log", env) as url:
        for key in ("loss", "val_loss", "lr", "grad_norm", "tokens_per_s"):
            expected = [p for p in logged(first, key) if p[0] <= 10] + logged(second, key)
            shown = series(url, "job/tensorboard", TAGS[key], len(expected))
            assert [step for step, _ in shown] == [step for step, _ in expected], key
            assert [v for _, v in shown] == pytest.approx([v for _, v in expected], rel=1e-6)


def fetched(capsys, *argv: str) -> tuple[int, str, str]:
    status = fetch.main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_the_newest_committed_s3_checkpoint_becomes_one_model_file_that_samples_text(
    s3_run, tmp_path, capsys, monkeypatch
):
    env, uri, _, second = s3_run
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    out = tmp_path / "model.pt"
    status, printed, err = fetched(capsys, uri, "--out", str(out))
    assert status == 0, err
    model = torch.load(out, weights_only=True)
    assert (model["model"], model["step"]) == ("tiny", 25)
    # Bit for bit the parameters the run ended with.
    (digest,) = event(second, "done")["param_digests"]
    assert state_digest(model["state_dict"]) == digest and digest in printed

    texts = [sampled(capsys, out, seed) for seed in ("7", "7", "8")]
    assert texts[0] == texts[1] != texts[2]
    assert texts[0].startswith("def ") and len(texts[0].strip()) > len("def ")


def sampled(capsys, model, seed: str) -> str:
    """What trainer.sample writes from the model file `model` after the prompt `def `."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one sequence at a time: a second thread only waits
    try:
        assert sample.main(["--model", str(model), "--prompt", "def ", "--tokens", "40",
                            "--seed", seed]) == 0  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    return capsys.readouterr().out


def without_aws_credentials(monkeypatch, tmp_path) -> None:
    """This process as a fresh one of a user with no AWS credentials anywhere."""
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # none cached
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def test_fetching_from_s3_without_aws_credentials_says_so_in_one_line(
    s3_run, tmp_path, capsys, monkeypatch
):
    env, uri, _, _ = s3_run
    without_aws_credentials(monkeypatch, tmp_path)
    monkeypatch.setenv("AWS_ENDPOINT_URL", env["AWS_ENDPOINT_URL"])
    status, _, err = fetched(capsys, uri, "--out", str(tmp_path / "model.pt"))
    assert status == 2
    assert err == "python -m trainer.fetch: error: no AWS credentials found: run `aws sso login` "\
        "or `aws configure`, or set AWS_PROFILE\n"  # fmt: skip
    assert not (tmp_path / "model.pt").exists()


def test_fetching_a_folder_without_a_committed_checkpoint_says_so(tmp_path, capsys):
    (tmp_path / step_name(5)).mkdir()  # a save cut short
    status, _, err = fetched(capsys, str(tmp_path), "--out", str(tmp_path / "model.pt"))
    assert status == 2
    assert err.endswith(f"no committed checkpoint in {tmp_path} (1 uncommitted: being saved, "
                        "or cut short)\n")  # fmt: skip


TEAM, IMAGE = "team-a", "registry.example/trainer@sha256:" + "a" * 64
MEMBERS = f"team:{TEAM}"  # the group a team member's EKS access entry maps her to


@pytest.fixture
def cluster(dev_plan, tmp_path, monkeypatch):
    """The local Kubernetes API with the dev plan's RBAC and admission policies: a team
    namespace (as the plan labels it) whose members (the group team:<team> their access entries
    map them to) have the team's Role; pods run as local processes (tests.kube_api.kubelet)."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))  # the client's discovery cache
    api = KubeAPI(Authorizer(rbac_of(dev_plan))).start()
    api.runtime = Kubelet()
    api.policies = admission_policies(dev_plan)
    served = {k.plural: k for k in api.kinds.values()}
    (namespace,) = [n.inputs for n in dev_plan.of_type("kubernetes:core/v1:Namespace")
                    if n.inputs["metadata"]["name"] == TEAM]  # fmt: skip
    api.call(api.create, served["namespaces"], "", namespace)
    # Kueue's LocalQueue (its upstream CRD) and the team's, as the plan declares it.
    crd = yaml.safe_load((CRD_DIR / "kueue" / "kueue.x-k8s.io_localqueues.yaml").read_text())
    api.call(api.create, served["customresourcedefinitions"], "", crd)
    api.settle()
    (queue,) = [q.inputs for q in dev_plan.of_type("kubernetes:kueue.x-k8s.io/v1beta2:LocalQueue")
                if q.inputs["metadata"]["namespace"] == TEAM]  # fmt: skip
    local_queues = next(k for k in api.kinds.values() if k.plural == "localqueues")
    api.call(api.create, local_queues, TEAM, queue)
    yield api
    api.stop()


def use_kubeconfig(api: KubeAPI, who, path, monkeypatch) -> None:
    path.write_text(yaml.safe_dump(api.kubeconfig(api.add_token(who))))
    monkeypatch.setenv("KUBECONFIG", str(path))


def test_an_efs_checkpoint_is_fetched_through_a_pod_that_is_gone_after(
    local_run, cluster, tmp_path, capsys, monkeypatch
):
    ckpt, recs = local_run
    # The team's EFS claim is a folder the local kubelet mounts into the pod; the job's
    # checkpoints are where it writes them (workloads.manifests.checkpoint_dir).
    claim = cluster.runtime.dir / "claims" / TEAM / CLAIMS["/efs"]
    shutil.copytree(ckpt, claim / "checkpoints" / "job")
    alice = user("alice", [MEMBERS])
    use_kubeconfig(cluster, alice, tmp_path / "kubeconfig", monkeypatch)
    out = tmp_path / "model.pt"
    status, printed, err = fetched(capsys, "/efs/checkpoints/job", "--namespace", TEAM, "--image",
                                   IMAGE, "--out", str(out))  # fmt: skip
    assert status == 0, err
    model = torch.load(out, weights_only=True)
    assert model["step"] == 20 and model["source"] == (
        f"/efs/checkpoints/job/{step_name(20)} (namespace {TEAM})"
    )
    assert state_digest(model["state_dict"]) == event(recs, "done")["param_digests"][0]
    assert cluster.objects("pods", TEAM) == [] and cluster.refusals == []
    (pod,) = [obj for _, kind, what, obj, _ in cluster.history
              if kind.plural == "pods" and what == "ADDED"]  # fmt: skip
    (mount,) = pod["spec"]["containers"][0]["volumeMounts"]
    assert mount == {"name": "checkpoints", "mountPath": "/efs", "readOnly": True}
    # In the team's queue (its namespace's one LocalQueue), as a member's pods must be.
    assert pod["metadata"]["labels"][QUEUE_LABEL] == TEAM
    assert pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "efs-shared"


def pod_identity(plan, env: dict):
    """EKS Pod Identity as the test stands it in: a pod of a service account the plan associates
    with a role gets credentials in its environment (here those of the moto server `env` names,
    and its endpoint); any other pod gets none."""
    associated = {
        (a.inputs["namespace"], a.inputs["serviceAccount"])
        for a in plan.of_type("aws:eks/podIdentityAssociation:PodIdentityAssociation")
    }

    def inject(kind, obj):
        spec = obj.get("spec") or {}
        account = (obj["metadata"].get("namespace"), spec.get("serviceAccountName", "default"))
        if kind.kind == "Pod" and account in associated:
            for container in spec["containers"]:
                container["env"] = [*(container.get("env") or []),
                                    *({"name": k, "value": v} for k, v in env.items())]  # fmt: skip

    return inject


def test_an_s3_checkpoint_is_fetched_through_a_pod_with_the_teams_identity_alone(
    s3_run, cluster, dev_plan, tmp_path, capsys, monkeypatch
):
    """A member has no rights on the bucket (nor its KMS key in prod): the copy pod reads S3 as
    the team's self-service service account, and streams the checkpoint out as from EFS."""
    env, uri, _, second = s3_run
    cluster.admission.append(pod_identity(dev_plan, env))
    without_aws_credentials(monkeypatch, tmp_path)
    use_kubeconfig(cluster, user("alice", [MEMBERS]), tmp_path / "kubeconfig", monkeypatch)
    out = tmp_path / "model.pt"
    status, printed, err = fetched(capsys, uri, "--namespace", TEAM, "--image", IMAGE, "--out",
                                   str(out))  # fmt: skip
    assert status == 0, err
    model = torch.load(out, weights_only=True)
    assert model["step"] == 25 and model["source"] == f"{uri}/{step_name(25)} (namespace {TEAM})"
    (digest,) = event(second, "done")["param_digests"]
    assert state_digest(model["state_dict"]) == digest and digest in printed
    assert sampled(capsys, out, "7").startswith("def ")
    (pod,) = [obj for _, kind, what, obj, _ in cluster.history
              if kind.plural == "pods" and what == "ADDED"]  # fmt: skip
    assert pod["spec"]["serviceAccountName"] == SERVICE_ACCOUNT and "volumes" not in pod["spec"]
    assert cluster.objects("pods", TEAM) == [] and cluster.refusals == []

    # What S3 answers the pod, in one line.
    status, _, err = fetched(capsys, "s3://nowhere/checkpoints/team-a/job", "--namespace", TEAM,
                             "--image", IMAGE)  # fmt: skip
    assert (status, err) == (2, "python -m trainer.fetch: error: cannot list s3://nowhere/"
        f"checkpoints/team-a/job in namespace {TEAM} (does the job write its checkpoints "
        "there?): An error occurred (NoSuchBucket) when calling the ListObjectsV2 operation: The "
        "specified bucket does not exist\n")  # fmt: skip
    assert cluster.objects("pods", TEAM) == []


def test_without_the_rights_in_the_namespace_the_copy_says_so_in_one_line(
    cluster, tmp_path, capsys, monkeypatch
):
    use_kubeconfig(cluster, user("bob", ["other-team"]), tmp_path / "kubeconfig", monkeypatch)
    argv = ["/fsx/checkpoints/job", "--namespace", TEAM, "--image", IMAGE]
    status, _, err = fetched(capsys, *argv)
    assert status == 2 and err == (
        f"python -m trainer.fetch: error: listing the LocalQueues of namespace {TEAM}: "
        'localqueues.kueue.x-k8s.io is forbidden: User "bob" cannot list resource '
        f'"localqueues" in API group "kueue.x-k8s.io" in the namespace "{TEAM}"\n'
    )
    status, _, err = fetched(capsys, *argv, "--queue", TEAM)
    assert status == 2 and "Traceback" not in err
    assert err == (
        f"python -m trainer.fetch: error: creating a pod in namespace {TEAM}: pods is forbidden: "
        f'User "bob" cannot create resource "pods" in API group "" in the namespace "{TEAM}"\n'
    )


def test_a_folder_that_is_not_on_the_claim_is_named_and_the_pod_deleted(
    cluster, tmp_path, capsys, monkeypatch
):
    use_kubeconfig(cluster, user("alice", [MEMBERS]), tmp_path / "kc", monkeypatch)
    status, _, err = fetched(capsys, "/fsx/checkpoints/none", "--namespace", TEAM, "--image", IMAGE)
    assert status == 2
    assert err.startswith(
        f"python -m trainer.fetch: error: cannot list /fsx/checkpoints/none in namespace {TEAM} "
        "(does the job write its checkpoints there?): command terminated with non-zero exit code"
    )
    assert cluster.objects("pods", TEAM) == [] and cluster.refusals == []


def test_a_copy_pod_its_queue_does_not_admit_says_so_and_is_deleted(
    cluster, tmp_path, capsys, monkeypatch
):
    def kueue(kind, obj):  # Kueue's pod webhook: a pod that names a queue waits for it, gated
        if kind.kind == "Pod" and QUEUE_LABEL in obj["metadata"].get("labels", {}):
            obj["spec"]["schedulingGates"] = [{"name": KUEUE_GATE}]

    cluster.admission.append(kueue)
    use_kubeconfig(cluster, user("alice", [MEMBERS]), tmp_path / "kc", monkeypatch)
    status, _, err = fetched(capsys, "/efs/checkpoints/job", "--namespace", TEAM, "--image", IMAGE,
                             "--queue", "busy", "--start-timeout", "2")  # fmt: skip
    assert status == 2
    assert err.startswith("python -m trainer.fetch: error: pod checkpoint-copy-")
    assert err.endswith(
        f" in namespace {TEAM} did not start within 2 s (queue busy has not admitted it: "
        "`kubectl get workloads` says why)\n"
    )
    assert cluster.objects("pods", TEAM) == [] and cluster.refusals == []


def test_a_teams_members_may_do_what_the_copy_needs_in_its_namespace_only(dev_plan):
    authorizer, alice = Authorizer(rbac_of(dev_plan)), user("alice", [MEMBERS])
    methods = {"get": "GET", "list": "GET", "create": "POST", "delete": "DELETE"}
    for rule in POD_RULES:
        (group,) = rule["apiGroups"]
        root = f"/apis/{group}/v1beta2" if group else "/api/v1"
        for resource in rule["resources"]:
            plural, _, sub = resource.partition("/")
            for verb in rule["verbs"]:
                for namespace, allowed in ((TEAM, True), ("research", False)):
                    name = "" if verb in ("create", "list") and not sub else "/p"
                    tail = f"/{sub}" if sub else ""
                    path = f"{root}/namespaces/{namespace}/{plural}{name}{tail}"
                    info = request_info(methods[verb], path)
                    assert authorizer.allows(alice, info) is allowed, (verb, path)


def test_the_copy_pod_is_restricted_and_reads_a_claim_read_only_or_s3_as_the_team():
    from policies.offline import check

    rules = {"pods-restricted", "pods-no-host-access"}
    for mount, claim in CLAIMS.items():
        pod = copy_pod(TEAM, f"{mount}/checkpoints/job", IMAGE, TEAM)
        violations = check(plan_with(("kubernetes:core/v1:Pod", pod)))
        assert [v for v in violations if v.policy in rules] == []
        assert pod["spec"]["volumes"][0]["persistentVolumeClaim"] == {
            "claimName": claim,
            "readOnly": True,
        }
    pod = copy_pod(TEAM, "s3://b/checkpoints/team-a/job", IMAGE, TEAM)
    assert [v for v in check(plan_with(("kubernetes:core/v1:Pod", pod))) if v.policy in rules] == []
    assert pod["spec"]["serviceAccountName"] == SERVICE_ACCOUNT and "volumes" not in pod["spec"]


def test_the_teams_service_account_is_the_one_its_role_is_associated_with(dev_plan):
    from infra.jobs.config import SELF_SERVICE_ACCOUNT

    associated = {
        (a.inputs["namespace"], a.inputs["serviceAccount"])
        for a in dev_plan.of_type("aws:eks/podIdentityAssociation:PodIdentityAssociation")
    }
    assert SERVICE_ACCOUNT == SELF_SERVICE_ACCOUNT
    assert {(team, SERVICE_ACCOUNT) for team in ("team-a", "research")} <= associated


def test_the_claims_are_the_ones_job_pods_mount():
    from workloads.manifests import MOUNTS

    assert {mounts[0].path: mounts[0].claim for mounts in MOUNTS.values()} == CLAIMS


def test_the_copy_pod_names_its_queue_and_knows_kueues_gate_as_the_platform_does():
    from devservers.controller import KUEUE_GATE as GATE
    from infra.teams.access import QUEUE_LABEL as LABEL

    assert (QUEUE_LABEL, KUEUE_GATE) == (LABEL, GATE)


@pytest.mark.parametrize(
    "parser",
    [trainer_parser(add_help=True), fetch.parser(), sample.parser(), data.parser(), bench.parser()],
    ids=lambda p: p.prog,
)
def test_every_option_says_what_it_does_and_its_default(parser):
    """--help (and the docs made from these parsers) describe each option and its default."""
    for action in parser._actions:
        if not action.option_strings or action.dest == "help" or action.help == SUPPRESS:
            continue  # positionals are required (no default); hidden options are internal
        text = (action.help or "") % {"default": action.default}
        assert len(text) > 20 and "default" in text, action.option_strings
        if "%(default)s" in action.help:
            assert f"default: {action.default})" in text, action.option_strings


def test_without_queue_the_namespaces_one_local_queue_is_taken_or_the_copy_asks_for_one(
    cluster, tmp_path, capsys, monkeypatch
):
    """A team's LocalQueue is named after the team, not always its namespace (prod's research
    team queues in research-jobs): the copy asks the namespace, and asks the user when it has
    none or several."""
    local_queues = next(k for k in cluster.kinds.values() if k.plural == "localqueues")
    (queue,) = cluster.objects("localqueues", TEAM, "kueue.x-k8s.io")
    cluster.call(cluster.create, local_queues, TEAM, {**queue, "metadata": {"name": "second"}})
    use_kubeconfig(cluster, user("alice", [MEMBERS]), tmp_path / "kubeconfig", monkeypatch)
    argv = ["/efs/checkpoints/job", "--namespace", TEAM, "--image", IMAGE]
    assert fetched(capsys, *argv)[2] == (
        f"python -m trainer.fetch: error: namespace {TEAM} has LocalQueues second, {TEAM}: name "
        "the team's with --queue\n"
    )
    assert cluster.objects("pods", TEAM) == []
