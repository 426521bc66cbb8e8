"""DevServer rendering: both modes validate against Kubernetes 1.34's schemas and carry what
matters (home, shared, /dev/shm, placement, queue label, SSH, torchrun env, owner references)."""

import subprocess

import kubernetes_validate
import pytest

from devservers.api import API_VERSION, QUEUE_LABEL, SERVER_LABEL
from devservers.controller import new_host_key
from devservers.render import (
    HOST_KEY_DIR,
    RDZV_PORTS,
    SHAPE_ANNOTATION,
    RenderError,
    Settings,
    children,
    host_key_secret,
    host_public_key,
    owner_of_namespace,
    stateful_set,
)
from devservers.tests.test_devservers_crds import gpu_flavor
from infra.core.offline import ACCOUNT_ID
from infra.core.tests.crd_schema import cel_violations, conformance_errors, with_defaults

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOr4 alice@laptop"


# The dev stack's trainer repository (devServers' allowed images by default), in the account the
# offline plan's mocks give.
TRAINER_REPOSITORY = f"{ACCOUNT_ID}.dkr.ecr.us-west-2.amazonaws.com/tp-dev/trainer"
IMAGE = f"{TRAINER_REPOSITORY}@sha256:" + "a" * 64


def server(**spec) -> dict:
    manifest = {
        "apiVersion": API_VERSION,
        "kind": "DevServer",
        "metadata": {"name": "box", "namespace": "dev-alice", "uid": "u-1"},
        "spec": {
            "owner": "alice",
            "flavor": "gpu-1",
            "image": IMAGE,
            "ssh": {"authorizedKeys": [KEY]},
            **spec,
        },
    }
    assert conformance_errors(manifest) == [] and cel_violations(manifest) == []
    # The operator sees the object as the API server stores it: with the CRD's defaults.
    return with_defaults(manifest)


DISTRIBUTED = {"mode": "distributed", "distributed": {"worldSize": 3, "backend": "nccl"}}


def by_kind(objects: list[dict]) -> dict[str, dict]:
    return {f"{o['kind']}/{o['metadata']['name']}": o for o in objects}


@pytest.mark.parametrize("spec", [{}, DISTRIBUTED], ids=["standalone", "distributed"])
def test_every_child_validates_against_the_kubernetes_schema(spec):
    for child in children(server(**spec), gpu_flavor(), Settings()):
        kubernetes_validate.validate(child, "1.34", strict=True)


def test_standalone_is_one_pod_with_home_shared_shm_and_gpu_placement():
    objects = by_kind(children(server(), gpu_flavor(), Settings()))
    assert set(objects) == {
        "ConfigMap/box-scripts",
        "Service/box",
        "Service/box-ssh",
        "NetworkPolicy/box",
        "StatefulSet/box",
    }
    sts = objects["StatefulSet/box"]
    assert sts["spec"]["replicas"] == 1
    assert sts["metadata"]["labels"][QUEUE_LABEL] == "dev"
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"] == {
        "whenDeleted": "Retain",
        "whenScaled": "Retain",
    }
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["storageClassName"] == "gp3"
    assert claim["spec"]["resources"]["requests"]["storage"] == "100Gi"
    pod = sts["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts["/home/dev"] == "home" and mounts["/shared"] == "shared"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["shared"]["persistentVolumeClaim"]["claimName"] == "efs-shared"
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "20Gi"}
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert container["resources"]["requests"] == container["resources"]["limits"]
    assert pod["nodeSelector"] == {"training-platform/pool": "gpu-small"}
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert (
        sts["spec"]["template"]["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"] == "true"
    )
    ssh = objects["Service/box-ssh"]["spec"]
    assert ssh["type"] == "ClusterIP" and ssh["selector"]["apps.kubernetes.io/pod-index"] == "0"
    assert KEY in objects["ConfigMap/box-scripts"]["data"]["authorized_keys"]
    for child in objects.values():
        (ref,) = child["metadata"]["ownerReferences"]
        assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == (
            "DevServer",
            "box",
            "u-1",
            True,
        )


def test_distributed_is_world_size_pods_with_rendezvous_ports_and_torchrun_env():
    objects = by_kind(children(server(**DISTRIBUTED), gpu_flavor(), Settings()))
    sts = objects["StatefulSet/box"]
    assert sts["spec"]["replicas"] == 3
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    headless = objects["Service/box"]["spec"]
    assert headless["clusterIP"] == "None" and headless["publishNotReadyAddresses"] is True
    ports = {p["port"] for p in headless["ports"]}
    assert set(RDZV_PORTS) <= ports and min(RDZV_PORTS) == 29500 and max(RDZV_PORTS) == 29510
    env = {e["name"]: e for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["WORLD_SIZE"]["value"] == "3"
    assert env["MASTER_ADDR"]["value"] == "box-0.box.dev-alice.svc.cluster.local"
    assert env["RANK"]["valueFrom"]["fieldRef"]["fieldPath"].endswith(
        "['apps.kubernetes.io/pod-index']"
    )
    assert env["NPROC_PER_NODE"]["value"] == "1"  # one per GPU of the flavor
    script = objects["ConfigMap/box-scripts"]["data"]["torchrun.sh"]
    assert '--nnodes "$WORLD_SIZE" --node-rank "$RANK"' in script


def test_stopped_scales_to_zero_and_keeps_the_pod_shape():
    running = stateful_set(server(), gpu_flavor())
    stopped = stateful_set(server(stopped=True), gpu_flavor())
    assert stopped["spec"]["replicas"] == 0
    shape = SHAPE_ANNOTATION
    assert stopped["metadata"]["annotations"][shape] == running["metadata"]["annotations"][shape]


def test_a_bigger_flavor_changes_the_pod_shape():
    bigger = gpu_flavor()
    for amounts in bigger["spec"]["resources"].values():
        amounts["nvidia.com/gpu"] = "4"
    one = stateful_set(server(), gpu_flavor())["metadata"]["annotations"]
    four = stateful_set(server(), bigger)["metadata"]["annotations"]
    assert one[SHAPE_ANNOTATION] != four[SHAPE_ANNOTATION]


def test_load_balancer_ssh_is_restricted_to_the_platforms_cidrs():
    lb = server(ssh={"serviceType": "LoadBalancer", "authorizedKeys": [KEY]})
    with pytest.raises(RenderError, match="not allowed on this platform"):
        children(lb, gpu_flavor(), Settings())
    objects = by_kind(children(lb, gpu_flavor(), Settings(ssh_cidrs=("203.0.113.0/24",))))
    spec = objects["Service/box-ssh"]["spec"]
    assert spec["type"] == "LoadBalancer"
    assert spec["loadBalancerSourceRanges"] == ["203.0.113.0/24"]


def test_ssh_off_and_shared_off_leave_them_out():
    objects = by_kind(
        children(
            server(ssh={"enabled": False}, shared={"enabled": False}), gpu_flavor(), Settings()
        )
    )
    assert "Service/box-ssh" not in objects
    pod = objects["StatefulSet/box"]["spec"]["template"]["spec"]
    assert {"shared", "host-key"}.isdisjoint(v["name"] for v in pod["volumes"])
    assert "DEVSERVER_HOST_KEY" not in {e["name"] for e in pod["containers"][0]["env"]}


def test_every_pod_serves_the_host_key_of_the_servers_secret(tmp_path):
    private, public = new_host_key()
    secret = host_key_secret(server(), private, public)
    kubernetes_validate.validate(secret, "1.34", strict=True)
    assert secret["metadata"]["name"] == "box-ssh-host-key" and secret["immutable"] is True
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert host_public_key(secret) == public
    # OpenSSH reads the private key and finds the same public key in it.
    (tmp_path / "key").write_text(private)
    (tmp_path / "key").chmod(0o600)
    derived = subprocess.run(
        ["ssh-keygen", "-y", "-f", str(tmp_path / "key")], capture_output=True, text=True
    )
    assert derived.stdout.split()[:2] == public.split()[:2], derived.stderr
    pod = stateful_set(server(**DISTRIBUTED), gpu_flavor())["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["host-key"]["secret"] == {"secretName": "box-ssh-host-key", "defaultMode": 0o440}
    (container,) = pod["containers"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["host-key"] == {"name": "host-key", "mountPath": HOST_KEY_DIR, "readOnly": True}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["DEVSERVER_HOST_KEY"] == f"{HOST_KEY_DIR}/ssh_host_ed25519_key"


def test_more_processes_than_gpus_is_an_error():
    too_many = {"mode": "distributed", "distributed": {"worldSize": 2, "nprocPerNode": 4}}
    with pytest.raises(RenderError, match="exceeds the flavor's 1 GPUs"):
        children(server(**too_many), gpu_flavor(), Settings())


def test_labels_select_the_servers_pods():
    sts = stateful_set(server(), gpu_flavor())
    assert sts["spec"]["selector"]["matchLabels"] == {SERVER_LABEL: "box"}
    assert owner_of_namespace("dev-alice") == "alice"
    assert owner_of_namespace("team-a") is None


def test_server_pods_get_no_kubernetes_credentials():
    pod = stateful_set(server(), gpu_flavor())["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
