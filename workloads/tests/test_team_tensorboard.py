"""A team's TensorBoard: what the plan deploys for it, and the real TensorBoard it runs, reached
by a team member through the API server's port-forward as `kubectl port-forward -n <team>
svc/tensorboard 6006` reaches it (tests.kube_api: the member's RBAC from the dev plan, the
Deployment's pod run by the local kubelet with its volumes)."""

import copy
import json
import os
import socket
import subprocess
import sys
import time

import kubernetes_validate
import pytest
import yaml
from kubernetes import config

from devservers.kube import KubeCluster
from infra.core.declared import declared_in
from infra.integrations import system_fit
from infra.stack.tests.test_config import error_for
from tests.kube_api import from_plan, user
from tests.moto_s3 import moto_server, s3_client
from tests.plugin import ROOT
from tests.tensorboard_view import get, wait
from workloads.tensorboard import PORT

DEPLOYMENT = "kubernetes:apps/v1:Deployment"
SYSTEM = {"training-platform/node-role": "system"}


def tensorboard_of(plan, team: str) -> dict:
    return plan.one(DEPLOYMENT, f"tensorboard-{team}").inputs


@pytest.mark.parametrize(
    ("stack", "team", "namespace", "stores"),
    [
        ("dev", "team-a", "team-a", ["efs:/efs/checkpoints"]),
        ("prod", "research", "research-jobs", ["efs:/efs/checkpoints", "fsx:/fsx/checkpoints"]),
    ],
)
def test_each_team_gets_a_restricted_tensorboard_on_the_system_nodes(
    request, stack, team, namespace, stores
):
    plan = request.getfixturevalue(f"{stack}_plan")
    deployment = tensorboard_of(plan, team)
    kubernetes_validate.validate(deployment, "1.34", strict=True)
    pod = deployment["spec"]["template"]["spec"]
    assert deployment["metadata"]["namespace"] == namespace
    assert deployment["spec"]["template"]["metadata"]["labels"] == {
        "app.kubernetes.io/name": "tensorboard"
    }
    assert pod["nodeSelector"] == SYSTEM and pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    bucket = plan.one("aws:s3/bucket:Bucket").outputs["bucket"]
    assert container["command"][:5] == [
        "python",
        "-m",
        "trainer.tensorboard_server",
        "--logdir_spec",
        ",".join([f"s3:s3://{bucket}/checkpoints/{namespace}/", *stores]),
    ]
    # Loopback only: the kubelet's port-forward reaches it, no pod does.
    assert container["command"][5:9] == ["--host", "127.0.0.1", "--port", str(PORT)]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    claims = [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
    assert claims and all(v["persistentVolumeClaim"]["readOnly"] for v in claims)
    mounts = [m for m in container["volumeMounts"] if m["name"] != "tmp"]
    assert mounts and all(m["readOnly"] for m in mounts)
    assert container["image"] == plan.outputs["trainerImages"]["runtime"]

    # Its identity may read the team's prefix, and only read it.
    (association,) = [
        a
        for a in plan.of_type("aws:eks/podIdentityAssociation:PodIdentityAssociation")
        if a.name == f"tensorboard-{team}"
    ]
    assert (association.inputs["namespace"], association.inputs["serviceAccount"]) == (
        namespace,
        "tensorboard",
    )
    policy = json.loads(
        plan.one("aws:iam/rolePolicy:RolePolicy", f"tensorboard-{team}").inputs["policy"]
    )
    objects, listing, *key = policy["Statement"]
    assert objects["Action"] == ["s3:GetObject"]
    assert objects["Resource"].endswith(f":::{bucket}/checkpoints/{namespace}/*")
    assert listing["Condition"]["StringLike"]["s3:prefix"] == [
        f"checkpoints/{namespace}/",
        f"checkpoints/{namespace}/*",
    ]
    assert [k["Action"] for k in key] == ([["kms:Decrypt"]] if stack == "prod" else [])

    # The system nodes' capacity check counts it.
    fit = system_fit(declared_in(plan))
    assert "tensorboard/Deployment" in {p.name for p in fit.placed}
    assert fit.fits


def test_a_job_may_not_take_the_tensorboards_name():
    message = error_for(
        jobs=[
            {
                "name": "tensorboard",
                "nodePool": "cpu",
                "queue": "team-a",
                "checkpoint": "efs",
            }
        ]
    )
    assert (
        "training-platform:jobs[tensorboard].name: tensorboard is the ServiceAccount of team "
        "team-a's TensorBoard; allowed: any other name" in message
    )


def write_curve(folder, points: dict[int, float]) -> None:
    """An event file of the loss curve, as TensorBoard's own writer writes it."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    writer = EventFileWriter(str(folder))
    for step, value in points.items():
        summary = summary_pb2.Summary(
            value=[summary_pb2.Summary.Value(tag="loss/train", simple_value=value)]
        )
        writer.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary))
    writer.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(cluster: KubeCluster, namespace: str, pod: str, path: str) -> bytes | None:
    """GET `path` of the pod's port PORT through the API server's port-forward; None when
    nothing answers yet."""
    try:
        with cluster.connection(namespace, pod, PORT) as sock:
            sock.sendall(f"GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n".encode())
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
    except OSError:
        return None
    head, _, body = data.partition(b"\r\n\r\n")
    return body if head.split(b"\r\n")[0].split()[1:2] == [b"200"] else None


def test_a_member_port_forwards_to_her_teams_tensorboard_which_shows_her_jobs_curves(
    dev_plan, tmp_path, monkeypatch
):
    api = from_plan(dev_plan)
    processes = []
    try:
        # The Deployment's pod, as its ReplicaSet would make it; its working directory is where
        # the image keeps the trainer package (WORKDIR /opt/trainer), here the checkout.
        deployment = tensorboard_of(dev_plan, "team-a")
        template = copy.deepcopy(deployment["spec"]["template"])
        (container,) = template["spec"]["containers"]
        container["workingDir"] = str(ROOT)
        # Its /tmp emptyDir would hide a checkout under /tmp (a CI clone), whose interpreter the
        # pod runs here: TensorBoard's info file goes to the host's /tmp instead.
        container["volumeMounts"] = [
            m for m in container["volumeMounts"] if m["mountPath"] != "/tmp"
        ]
        pods = next(k for k in api.kinds.values() if k.plural == "pods")
        created = api.call(
            api.create,
            pods,
            "team-a",
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {**template["metadata"], "name": "tensorboard-7d9f-x2x4q"},
                "spec": template["spec"],
            },
        )
        api.settle()
        # A job that checkpoints to EFS has written its curve into the team's claim.
        claim = api.runtime.dir / "claims" / "team-a" / "efs-shared"
        write_curve(claim / "checkpoints" / "smoke-cpu" / "tensorboard", {10: 4.5, 20: 3.25})

        # The container's command, on a free port here (the pods share this machine's network)
        # and with this environment's python; S3 has no credentials here, which
        # trainer.tensorboard_server reports and gets past.
        port = free_port()
        command = [sys.executable, *container["command"][1:]]
        command[command.index("--port") + 1] = str(port)
        pod = api.read("pods", "team-a", created["metadata"]["name"])
        log = (tmp_path / "tensorboard.log").open("w")
        processes.append(api.runtime.run_in(pod, command, stdout=log, stderr=log))
        api.runtime.expose("team-a", pod["metadata"]["name"], PORT, port)

        # The member, as kubectl port-forward svc/tensorboard does it: the Service, its pod,
        # the port its targetPort names, then pods/portforward.
        entry = next(
            e.inputs
            for e in dev_plan.of_type("aws:eks/accessEntry:AccessEntry")
            if e.inputs.get("kubernetesGroups") == ["team:team-a"]
        )
        kubeconfig = tmp_path / "kubeconfig"
        member = user(entry["principalArn"], entry["kubernetesGroups"])
        kubeconfig.write_text(yaml.safe_dump(api.kubeconfig(api.add_token(member))))
        monkeypatch.setattr("tempfile.tempdir", str(tmp_path))  # the client's discovery cache
        cluster = KubeCluster(config.new_client_from_config(str(kubeconfig)))
        service = cluster.get("v1", "Service", "tensorboard", "team-a")
        (target,) = cluster.list("v1", "Pod", "team-a", service["spec"]["selector"])
        (named,) = [
            p
            for p in target["spec"]["containers"][0]["ports"]
            if p["name"] == service["spec"]["ports"][0]["targetPort"]
        ]
        assert named["containerPort"] == service["spec"]["ports"][0]["port"] == PORT

        deadline = time.monotonic() + 90
        runs = None
        while time.monotonic() < deadline:
            body = http_get(cluster, "team-a", target["metadata"]["name"], "/data/runs")
            runs = json.loads(body) if body else None
            if runs:
                break
            time.sleep(0.5)
        assert runs == ["efs/smoke-cpu/tensorboard"], (tmp_path / "tensorboard.log").read_text()
        query = "/data/plugin/scalars/scalars?run=efs/smoke-cpu/tensorboard&tag=loss/train"
        points = json.loads(http_get(cluster, "team-a", target["metadata"]["name"], query))
        assert [(step, value) for _, step, value in points] == [(10, 4.5), (20, 3.25)]
        assert "tensorboard: cannot list s3://" in (tmp_path / "tensorboard.log").read_text()
        assert api.refusals == []

        # Another team's member reaches none of it.
        other = next(
            e.inputs
            for e in dev_plan.of_type("aws:eks/accessEntry:AccessEntry")
            if e.inputs.get("kubernetesGroups") == ["team:research"]
        )
        kubeconfig.write_text(
            yaml.safe_dump(
                api.kubeconfig(
                    api.add_token(user(other["principalArn"], other["kubernetesGroups"]))
                )
            )
        )
        outsider = KubeCluster(config.new_client_from_config(str(kubeconfig)))
        with pytest.raises(PermissionError):
            with outsider.connection("team-a", target["metadata"]["name"], PORT):
                pass
        assert len(api.refusals) == 1 and "pods/portforward" in api.refusals[0]
    finally:
        for process in processes:
            process.kill()
            process.wait()
        api.stop()


def test_a_store_that_fails_never_stops_the_other_stores_curves(tmp_path):
    """trainer.tensorboard_server over a real S3 (moto's server) that goes away mid-run, and a
    local folder: listing S3 and reading its run fail at every reload from then on (botocore's
    errors, which TensorBoard 2.20's own reload loop would die of), and a run that appears in
    the folder afterwards still shows."""
    efs = tmp_path / "efs"
    write_curve(efs / "a" / "tensorboard", {1: 2.0})
    log = tmp_path / "tensorboard.log"
    with moto_server() as env:
        s3 = s3_client(env)
        s3.create_bucket(Bucket="curves")
        write_curve(tmp_path / "s3-run", {1: 5.0})
        (event,) = (tmp_path / "s3-run").iterdir()
        s3.upload_file(str(event), "curves", f"checkpoints/team-a/j/tensorboard/{event.name}")
        port = free_port()
        command = [sys.executable, "-m", "trainer.tensorboard_server", "--logdir_spec",
                   f"s3:s3://curves/checkpoints/team-a,efs:{efs}", "--host", "127.0.0.1",
                   "--port", str(port), "--reload_interval", "1"]  # fmt: skip
        with log.open("w") as output:
            process = subprocess.Popen(
                command, env={**os.environ, **env}, stdout=output, stderr=subprocess.STDOUT
            )
        url = f"http://127.0.0.1:{port}"
        try:
            both = ["efs/a/tensorboard", "s3/j/tensorboard"]
            wait(lambda: sorted(get(url, "/data/runs") or []) == both, "both runs", process, log)
        except BaseException:
            process.kill()
            raise
    try:
        write_curve(efs / "b" / "tensorboard", {1: 3.0})
        wait(
            lambda: "efs/b/tensorboard" in (get(url, "/data/runs") or []),
            "the new run in the folder",
            process,
            log,
        )
        said = log.read_text()
        assert (
            "tensorboard: cannot list s3://curves/checkpoints/team-a: EndpointConnectionError"
            in said
        )
    finally:
        process.kill()
        process.wait()


def test_a_team_lists_its_own_prefix_only_and_its_tensorboard_asks_no_more(tmp_path, monkeypatch):
    """team-a's read policy lists `checkpoints/team-a/` as a folder: without the slash it would
    list team-a2's key names too. TensorBoard's own S3 code (its gfile, driven by the
    multiplexer the server runs) reading the logdir the platform gives it asks only for prefixes
    the policy allows."""
    from moto import mock_aws
    from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer

    from infra.core.tests.iam_rules import Principal, Request, allowed
    from infra.storage.bucket import prefix_access_policy
    from workloads.tensorboard import logdir_spec

    policy = prefix_access_policy("arn:aws:s3:::ckpts", "checkpoints/team-a", write=False)
    reader = Principal("arn:aws:iam::123456789012:role/tensorboard-team-a", (policy,))

    def may_list(prefix: str) -> bool:
        request = Request("s3:ListBucket", "arn:aws:s3:::ckpts", reader, {"s3:prefix": prefix})
        return allowed(request, None, "123456789012")

    assert not may_list("checkpoints/team-a") and not may_list("checkpoints/team-a2/")
    assert may_list("checkpoints/team-a/") and may_list("checkpoints/team-a/job/tensorboard/")

    for name, value in {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x",
                        "AWS_DEFAULT_REGION": "us-west-2"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        import boto3

        s3 = boto3.client("s3")
        s3.create_bucket(
            Bucket="ckpts", CreateBucketConfiguration={"LocationConstraint": "us-west-2"}
        )
        write_curve(tmp_path / "run", {1: 5.0})
        (event,) = (tmp_path / "run").iterdir()
        for team in ("team-a", "team-a2"):
            s3.upload_file(str(event), "ckpts", f"checkpoints/{team}/j/tensorboard/{event.name}")
        asked = []
        boto3.setup_default_session()

        def listing(params, model, **_):  # every S3 call: its listings kept
            if model.name.startswith("ListObjects"):
                asked.append(params.get("Prefix", ""))

        boto3.DEFAULT_SESSION.events.register("provide-client-params.s3", listing)
        (s3_store,) = [s for s in logdir_spec("team-a", "ckpts", set()).split(",")]
        multiplexer = EventMultiplexer()
        multiplexer.AddRunsFromDirectory(s3_store.split(":", 1)[1], "s3")
        multiplexer.Reload()
    assert list(multiplexer.Runs()) == ["s3/j/tensorboard"]
    assert asked and all(may_list(prefix) for prefix in asked), asked
