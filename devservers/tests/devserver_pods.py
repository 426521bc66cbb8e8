"""A DevServer pod's SSH side under real OpenSSH (tests.openssh): its entrypoint run as its
container starts it (the image's non-root user, the container's environment, the scripts
ConfigMap's files, the host key Secret's key), ending in sshd on a loopback address."""

import base64
from pathlib import Path

from devservers.render import HOST_KEY_FILE, POD_INDEX_LABEL, SSH_PORT, host_key_secret_name
from tests.openssh import SYSTEM_PATH, OpenSsh


def run_entrypoint(
    site: OpenSsh,
    name: str,
    address: str,
    files: dict[str, str],
    env: dict[str, str],
    host_key: tuple[str, str],
) -> tuple[Path, dict[str, str]]:
    """Pod `name` as its container starts: the entrypoint of its scripts ConfigMap (`files`),
    run as the image's user with the container's `env`, HOME a directory of its own, and its
    Secret's host key (`host_key`: private, public) where DEVSERVER_HOST_KEY says, mode 0440 as
    the pod's volume has it; sshd on `address` and a free port (two pods on one machine cannot
    both have 2222). Returns its scripts directory and its environment."""
    home = site.mkdir(f"{name}/home")
    scripts = site.mkdir(f"{name}/etc-devserver")
    for file, text in files.items():
        site.write(scripts / file, text).chmod(0o755)
    secret = site.mkdir(f"{name}/host-key")
    site.write(secret / HOST_KEY_FILE, host_key[0]).chmod(0o440)
    public = site.write(secret / f"{HOST_KEY_FILE}.pub", host_key[1])
    env = env | {"HOME": str(home), "DEVSERVER_HOST_KEY": str(secret / HOST_KEY_FILE)}

    def start(port: int) -> list[str]:
        entrypoint = files["start.sh"]
        assert entrypoint.count(f"\nPort {SSH_PORT}\n") == 1
        site.write(
            scripts / "start.sh",
            entrypoint.replace(f"\nPort {SSH_PORT}\n", f"\nPort {port}\nListenAddress {address}\n"),
        ).chmod(0o755)
        return [str(scripts / "start.sh")]  # the container's command

    site.launch(name, address, start, env, public)
    return scripts, env


def pod_env(container: dict, index: int) -> dict[str, str]:
    """The container's env as the kubelet gives it to pod `index` of the StatefulSet."""
    env = {}
    for item in container["env"]:
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            path = item["valueFrom"]["fieldRef"]["fieldPath"]
            assert path == f"metadata.labels['{POD_INDEX_LABEL}']"
            env[item["name"]] = str(index)
    return env


def serve_pod(
    site: OpenSsh,
    cluster,
    server: str,
    index: int,
    host_key: tuple[str, str] | None = None,
    name: str | None = None,
    namespace: str = "dev-alice",
) -> None:
    """Pod `index` of `server` on the local API (`cluster`: tests.devservers_cluster.Cluster),
    from what the API holds: the operator's scripts ConfigMap and host key Secret (or another
    `host_key`, as an impostor would have), the StatefulSet's container env. Its port 2222 then
    leads to that sshd (the kubelet's port-forward). `name`: the sshd's, default the pod's."""
    api, pod = cluster.api, f"{server}-{index}"
    files = api.read("configmaps", namespace, f"{server}-scripts")["data"]
    if host_key is None:
        secret = host_key_secret_name({"metadata": {"name": server}})
        data = api.read("secrets", namespace, secret)["data"]
        host_key = tuple(
            base64.b64decode(data[key]).decode() for key in (HOST_KEY_FILE, f"{HOST_KEY_FILE}.pub")
        )
    sts = api.read("statefulsets", namespace, server, group="apps")
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    env = {"PATH": SYSTEM_PATH} | pod_env(container, index)
    run_entrypoint(site, name or pod, "127.0.0.1", files, env, host_key)
    api.runtime.expose(namespace, pod, SSH_PORT, site.hosts[name or pod].port)
