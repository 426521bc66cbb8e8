"""The node side of the local API: a StatefulSet controller and a kubelet whose pods are local
processes.

- stateful_sets follows pkg/controller/statefulset (stateful_set_utils.go: pod `<set>-<i>` with
  labels statefulset.kubernetes.io/pod-name and apps.kubernetes.io/pod-index, a controller owner
  reference that blocks owner deletion, claims `<template>-<set>-<i>` from volumeClaimTemplates
  owned by the set only with persistentVolumeClaimRetentionPolicy.whenDeleted: Delete; pods at or
  above `replicas` are deleted; a set being deleted is left to the garbage collector).
- Kubelet runs each pod that has no scheduling gate (Kueue holds pods with one) as `sleep` in
  PID, mount and UTS namespaces of its own (`unshare`): the pod's container, with a root
  filesystem of its own (this machine's root under a writable overlay layer, the pod's volumes
  mounted at their paths, /etc/hosts naming the namespace's pods), terminals of its own (a
  devpts instance), its hostname, environment and user. Exec runs the command in those
  namespaces, root and environment (`nsenter`), so it sees the pod's processes and files and
  nothing else. The pods share this machine's network:
  a container port reaches whatever the test put on the loopback port it `expose`d for it
  (e.g. an SSH server), as the pod's network would.
"""

import asyncio
import base64
import contextlib
import copy
import functools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs

from aiohttp import WSMsgType, web

from tests.kube_api.server import ApiError, Kind, KubeAPI, now
from tests.openssh import SYSTEM_PATH

POD_NAME_LABEL = "statefulset.kubernetes.io/pod-name"
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
# wsstream channel numbers of exec (remotecommand v4/v5)
STDIN, STDOUT, STDERR, ERROR, CLOSE = 0, 1, 2, 3, 255


def _kind(api: KubeAPI, group: str, plural: str) -> Kind:
    return next(k for k in api.kinds.values() if (k.group, k.plural) == (group, plural))


def _owner(obj: dict) -> dict:
    meta = obj["metadata"]
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def stateful_sets(api: KubeAPI) -> None:
    sets, pods = _kind(api, "apps", "statefulsets"), _kind(api, "", "pods")
    claims = _kind(api, "", "persistentvolumeclaims")
    for sts in api.select(sets):
        meta, spec = sts["metadata"], sts["spec"]
        if meta.get("deletionTimestamp"):
            continue
        namespace, name, replicas = meta["namespace"], meta["name"], spec.get("replicas", 1)
        retention = spec.get("persistentVolumeClaimRetentionPolicy") or {}
        for i in range(replicas):
            pod_name = f"{name}-{i}"
            volumes = []
            for template in spec.get("volumeClaimTemplates") or []:
                claim_name = f"{template['metadata']['name']}-{pod_name}"
                volumes.append(
                    {
                        "name": template["metadata"]["name"],
                        "persistentVolumeClaim": {"claimName": claim_name},
                    }
                )
                if (claims.group, claims.plural, namespace, claim_name) not in api.store:
                    claim = {
                        "metadata": {
                            **copy.deepcopy(template["metadata"]),
                            "name": claim_name,
                            "labels": dict(template["metadata"].get("labels") or {}),
                        },
                        "spec": copy.deepcopy(template["spec"]),
                    }
                    if retention.get("whenDeleted") == "Delete":
                        claim["metadata"]["ownerReferences"] = [_owner(sts)]
                    api.create(claims, namespace, claim)
            if (pods.group, pods.plural, namespace, pod_name) in api.store:
                continue
            template = copy.deepcopy(spec["template"])
            pod_spec = template["spec"]
            pod_spec.update(hostname=pod_name, subdomain=spec.get("serviceName", ""))
            pod_spec["volumes"] = [*(pod_spec.get("volumes") or []), *volumes]
            labels = {
                **(template["metadata"].get("labels") or {}),
                POD_NAME_LABEL: pod_name,
                POD_INDEX_LABEL: str(i),
            }
            pod_meta = {
                "name": pod_name,
                "labels": labels,
                "annotations": template["metadata"].get("annotations") or {},
                "ownerReferences": [_owner(sts)],
            }
            api.create(pods, namespace, {"metadata": pod_meta, "spec": pod_spec})
        owned = [
            p
            for p in api.select(pods, namespace)
            if any(r["uid"] == meta["uid"] for r in p["metadata"].get("ownerReferences") or [])
        ]
        for pod in owned:
            index = int(pod["metadata"]["labels"][POD_INDEX_LABEL])
            if index >= replicas and not pod["metadata"].get("deletionTimestamp"):
                api.delete(pods, pod)
        ready = [p for p in owned if _ready(p)]
        status = {
            "observedGeneration": meta.get("generation", 1),
            "replicas": len(owned),
            "readyReplicas": len(ready),
            "availableReplicas": len(ready),
        }
        if sts.get("status") != status:
            api.replace(sets, sts, {**sts, "status": status})


def _ready(pod: dict) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


# The container's terminals: a devpts of its own, mounted as containerd mounts it for every
# container (pkg/oci/mounts.go, defaultMounts: gid=5, mode=0620, so an sshd that is not root can
# give a session a terminal without chown), with /dev/ptmx its ptmx, as runc links it.
DEVPTS = "nosuid,noexec,newinstance,ptmxmode=0666,mode=0620,gid=5"
# What an image holds, here: the host's root filesystem (with this interpreter and its torchrun
# first on PATH, as /opt/conda/bin in the PyTorch images). Each container sees it through a
# writable layer of its own (overlayfs), with its volumes mounted at their mountPaths; devices,
# sysfs and /tmp (where tests leave what their pods run) are the host's.
IMAGE_ENV = {"PATH": f"{Path(sys.executable).parent}:{SYSTEM_PATH}"}
HOST_PATHS = ("/dev", "/sys", "/tmp")
# Where an image's own programs go, on PATH after the interpreter's folder and before the
# system's: a program written there (Kubelet.write) shadows the system's in that pod alone.
IMAGE_BIN = "/usr/local/bin"
POD_IP = "127.0.0.1"  # every pod's address: they share this machine's network
CLUSTER_DOMAIN = "cluster.local"
START_SECONDS = 60  # a loaded 2-core machine can take a while to set up a container
STARTS_AT_ONCE = 8  # containers set up at once (each mostly waits on its setup processes)


@dataclass
class _Running:
    process: subprocess.Popen
    init: int  # the pod's PID 1, seen from here
    env: dict[str, str]  # the container's environment, which exec'd commands get as well
    hosts: str = ""  # its /etc/hosts, as last written


def _container_script(
    hostname: str, layers: Path, mounts: list[tuple[Path, str]], command: list[str]
) -> str:
    """A shell script that, in mount and UTS namespaces of its own, names the host `hostname`,
    builds the container's root (the host's root under a tmpfs layer, `mounts` bound at their
    paths) and runs `command` there as PID 1 of a new PID namespace with its own /proc."""
    root = layers / "root"
    lines = [
        "set -eu",
        f"echo {shlex.quote(hostname)} > /proc/sys/kernel/hostname",
        f"mount -t tmpfs tmpfs {layers}",
        f"mkdir {layers}/upper {layers}/work {root}",
        f"mount -t overlay overlay -o lowerdir=/,upperdir={layers}/upper,workdir={layers}/work "
        f"{root}",
        *(f"mount --rbind {path} {root}{path}" for path in HOST_PATHS),
        f"mount -t devpts -o {DEVPTS} devpts {root}/dev/pts",
        f"mount --bind {root}/dev/pts/ptmx {root}/dev/ptmx",
    ]
    for source, target in sorted(mounts, key=lambda mount: mount[1].count("/")):  # parents first
        lines += [f"mkdir -p {root}{target}", f"mount --bind {source} {root}{target}"]
    program = ["chroot", str(root), *command]
    lines.append(
        f"exec unshare --pid --fork --kill-child --mount-proc={root}/proc {shlex.join(program)}"
    )
    return "\n".join(lines)


def _start_container(script: str, env: dict[str, str]) -> _Running:
    process = subprocess.Popen(
        ["unshare", "--mount", "--uts", "sh", "-c", script], env=env, start_new_session=True
    )
    children = f"/proc/{process.pid}/task/{process.pid}/children"
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the container exited {process.returncode} while starting")
        try:
            with open(children) as f:
                found = f.read().split()
            with open(f"/proc/{found[0]}/comm") as f:
                started = f.read().strip() == "sleep"
        # A child of the setup script (mount, setpriv) can end between listing and reading it:
        # its /proc entry then gives ENOENT, or ESRCH once opened.
        except (FileNotFoundError, ProcessLookupError, IndexError):
            started = False
        if started:  # past its setup: the container's own process
            return _Running(process, int(found[0]), env)
        time.sleep(0.01)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    raise RuntimeError(f"no container process after {START_SECONDS} s")


def _field(pod: dict, path: str) -> str:
    """A downward API fieldRef (pkg/fieldpath/fieldpath.go, ExtractFieldPathAsString)."""
    meta = pod["metadata"]
    keyed = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if keyed:
        return (meta.get(keyed[1]) or {}).get(keyed[2], "")
    return {
        "metadata.name": meta["name"],
        "metadata.namespace": meta["namespace"],
        "metadata.uid": meta["uid"],
        "status.podIP": POD_IP,
    }[path]


def _hosts(api: KubeAPI, namespace: str) -> str:
    """/etc/hosts as the kubelet writes it (pkg/kubelet/kubelet_pods.go, managedHostsFileContent:
    localhost, then a pod's `<hostname>.<subdomain>.<namespace>.svc.<domain>`), here with every
    pod of the namespace: the names cluster DNS gives a headless Service's pods, as a pod looks
    them up, and the names of headless Services that select them."""
    lines = ["# Kubernetes-managed hosts file.", "127.0.0.1\tlocalhost"]
    pods = api.select(_kind(api, "", "pods"), namespace)
    for pod in pods:
        spec = pod["spec"]
        if spec.get("hostname") and spec.get("subdomain"):
            name = f"{spec['hostname']}.{spec['subdomain']}.{namespace}.svc.{CLUSTER_DOMAIN}"
            # <hostname>.<subdomain> too: what a pod's resolv.conf search list (<namespace>.svc.
            # <domain> first, pkg/kubelet/network/dns/dns.go) makes of the name JobSet's and the
            # Trainer's MASTER_ADDR use.
            short = f"{spec['hostname']}.{spec['subdomain']}"
            lines.append(f"{POD_IP}\t{name}\t{short}\t{spec['hostname']}")
    # A headless Service (clusterIP None) with a selector: cluster DNS answers its name with
    # the IPs of the pods it selects (the training operator's per-replica Services).
    labels = [p["metadata"].get("labels") or {} for p in pods]
    for service in api.select(_kind(api, "", "services"), namespace):
        spec, name = service.get("spec") or {}, service["metadata"]["name"]
        selector = spec.get("selector") or {}
        if spec.get("clusterIP") != "None" or not selector:
            continue
        if any(selector.items() <= own.items() for own in labels):
            lines.append(f"{POD_IP}\t{name}.{namespace}.svc.{CLUSTER_DOMAIN}\t{name}")
    return "\n".join(lines) + "\n"


class Kubelet:
    """Runs the pods of a KubeAPI (set it as the API's runtime).

    A pod's first container is its one process (`sleep`, whatever its command), run as `account`
    (the image's user: tests.openssh.Account; None: this process's user) with the container's
    environment (IMAGE_ENV, then its `env` with fieldRefs resolved) in its workingDir. Volumes:
    a persistentVolumeClaim is a directory per claim that outlives pods, an emptyDir one per pod,
    a configMap or secret its data written out with its defaultMode (the pod waits while it does
    not exist, as in ContainerCreating); all owned by the account, as fsGroup makes them usable.
    Not modelled: more containers, items and subPath, readOnly mounts, $(VAR) in env values.
    """

    def __init__(self, account=None):
        self.account = account
        self.dir = Path(tempfile.mkdtemp(prefix="kubelet-"))
        self.running: dict[str, _Running] = {}  # pod uid -> its container
        self.starting: dict[str, Future] = {}  # pod uid -> its container being set up
        self._workers = ThreadPoolExecutor(STARTS_AT_ONCE, thread_name_prefix="kubelet")
        self._failures: list[BaseException] = []  # raised by the next run_pods
        self.ports: dict[tuple[str, str, int], int] = {}  # (namespace, pod, port) -> local port

    @property
    def controllers(self):
        return [stateful_sets, self.run_pods]

    def expose(self, namespace: str, pod: str, port: int, local_port: int) -> None:
        """Container port `port` of `pod` is 127.0.0.1:`local_port` (where the test listens)."""
        self.ports[(namespace, pod, port)] = local_port

    def _as_user(self, command: list[str]) -> list[str]:
        return self.account.command(command) if self.account else command

    @staticmethod
    def _inside(running: _Running) -> list[str]:
        return [
            "nsenter", "--target", str(running.init), "--pid", "--mount", "--uts", "--root",
            "--wd", "--",
        ]  # fmt: skip

    def enter(self, pod: dict) -> tuple[str, ...]:
        """The prefix that runs a command in a running pod's namespaces, root and working
        directory, as whoever runs it (tests.openssh switches to the image's user itself)."""
        return tuple(self._inside(self.running[pod["metadata"]["uid"]]))

    def _enter(self, running: _Running, command: list[str]) -> list[str]:
        """`command` in a running pod: its namespaces, root and working directory, as its user."""
        return [*self._inside(running), *self._as_user(command)]

    def run_in(self, pod: dict, command: list[str], **popen) -> subprocess.Popen:
        """Start `command` inside a running pod (a process the pod's user would have started)."""
        running = self.running[pod["metadata"]["uid"]]
        return subprocess.Popen(self._enter(running, command), env=running.env, **popen)

    def write(self, pod: dict, path: str, text: str, mode: int = 0o755) -> None:
        """Put a file at `path` in a running pod's root, as its image or its root user would
        have it: in the container's own writable layer, which no other pod sees. Not under the
        host's HOST_PATHS, which every pod shares (a checkout under /tmp, its interpreter's
        folder included)."""
        shared = [p for p in HOST_PATHS if path == p or path.startswith(f"{p}/")]
        if shared or not path.startswith("/"):
            raise ValueError(f"{path}: not in the pod's own layer (HOST_PATHS: {HOST_PATHS})")
        inside = self._inside(self.running[pod["metadata"]["uid"]])
        script = 'cat > "$0" && chmod "$1" "$0"'
        subprocess.run(
            [*inside, "sh", "-c", script, path, f"{mode:o}"], input=text.encode(), check=True
        )

    def processes(self, pod: dict) -> list[str]:
        """The names of the live processes of a running pod (its PID namespace's; zombies,
        which a PID 1 that reaps nothing leaves, aside)."""
        init = self.running[pod["metadata"]["uid"]].init
        namespace, found = os.readlink(f"/proc/{init}/ns/pid"), []
        for entry in Path("/proc").iterdir():
            try:
                if not entry.name.isdigit() or os.readlink(entry / "ns" / "pid") != namespace:
                    continue
                stat = (entry / "stat").read_text()
            except OSError:
                continue  # gone meanwhile
            name, state = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2]
            if state != "Z":
                found.append(name)
        return found

    def _own(self, path: Path) -> None:
        if self.account is None:
            return
        for found in [path, *path.rglob("*")]:
            self.account.own(found)

    def _volumes(self, api: KubeAPI, pod: dict) -> dict[str, Path] | None:
        """Each volume of `pod` as a directory here; None while a ConfigMap or Secret it mounts
        does not exist."""
        meta = pod["metadata"]
        namespace, found = meta["namespace"], {}
        for volume in pod["spec"].get("volumes") or []:
            name, path = volume["name"], self.dir / "pods" / meta["uid"] / volume["name"]
            if "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                path = self.dir / "claims" / namespace / claim
                path.mkdir(parents=True, exist_ok=True)
            elif "emptyDir" in volume:
                path.mkdir(parents=True, exist_ok=True)
            elif "configMap" in volume or "secret" in volume:
                source = volume.get("configMap") or volume["secret"]
                plural = "configmaps" if "configMap" in volume else "secrets"
                obj = api.store.get(
                    ("", plural, namespace, source.get("name", source.get("secretName")))
                )
                if obj is None and not source.get("optional"):
                    return None
                path.mkdir(parents=True, exist_ok=True)
                for key, value in ((obj or {}).get("data") or {}).items():
                    data = value.encode() if plural == "configmaps" else base64.b64decode(value)
                    (path / key).write_bytes(data)
                    (path / key).chmod(source.get("defaultMode", 0o644))
            else:
                raise RuntimeError(f"volume {name} of {meta['name']}: a kind not modelled here")
            self._own(path)
            found[name] = path
        return found

    def _start(self, pod: dict, volumes: dict[str, Path]) -> _Running:
        container = pod["spec"]["containers"][0]
        env = {**IMAGE_ENV, "HOSTNAME": pod["metadata"]["name"]}
        for item in container.get("env") or []:
            if "value" in item:
                env[item["name"]] = item["value"]
            else:
                env[item["name"]] = _field(pod, item["valueFrom"]["fieldRef"]["fieldPath"])
        mounts = [(volumes[m["name"]], m["mountPath"]) for m in container.get("volumeMounts") or []]
        layers = self.dir / "pods" / pod["metadata"]["uid"] / "layers"
        layers.mkdir(parents=True)
        command = self._as_user(
            ["sh", "-c", 'cd "$0" && exec sleep infinity', container.get("workingDir", "/")]
        )
        hostname = pod["spec"].get("hostname") or pod["metadata"]["name"]
        return _start_container(_container_script(hostname, layers, mounts, command), env)

    def busy(self) -> bool:
        """Whether containers are being set up (KubeAPI.settle waits for them)."""
        return bool(self.starting)

    def run_pods(self, api: KubeAPI) -> None:
        """Start the containers of pods that should run, each in a worker of its own (as the
        kubelet's pod workers do), so the API answers meanwhile; kill those of pods that should
        not; keep every running pod's /etc/hosts current."""
        if self._failures:
            raise self._failures.pop(0)
        pods = _kind(api, "", "pods")
        wanted = set()
        for pod in api.select(pods):
            meta, spec = pod["metadata"], pod["spec"]
            if meta.get("deletionTimestamp") or spec.get("schedulingGates"):
                continue
            wanted.add(meta["uid"])
            if meta["uid"] in self.running or meta["uid"] in self.starting:
                continue
            volumes = self._volumes(api, pod)
            if volumes is None:
                continue  # ContainerCreating until its ConfigMaps and Secrets exist
            started = self._workers.submit(self._start, pod, volumes)
            self.starting[meta["uid"]] = started
            asyncio.wrap_future(started).add_done_callback(
                functools.partial(self._started, api, meta["namespace"], meta["name"], meta["uid"])
            )
        for uid in set(self.running) - wanted:
            self._kill(self.running.pop(uid))
        hosts = {}
        for pod in api.select(pods):
            running = self.running.get(pod["metadata"]["uid"])
            namespace = pod["metadata"]["namespace"]
            if running is None:
                continue
            if namespace not in hosts:
                hosts[namespace] = _hosts(api, namespace)
            if running.hosts != hosts[namespace]:
                Path(f"/proc/{running.init}/root/etc/hosts").write_text(hosts[namespace])
                running.hosts = hosts[namespace]

    def _started(self, api: KubeAPI, namespace: str, name: str, uid: str, _) -> None:
        """A container is set up (on the API's loop): the pod runs and is ready, unless it was
        deleted meanwhile."""
        started = self.starting.pop(uid)
        api._notify()
        if started.exception() is not None:
            self._failures.append(started.exception())
            return
        pods = _kind(api, "", "pods")
        pod = api.store.get((pods.group, pods.plural, namespace, name))
        if pod is None or pod["metadata"]["uid"] != uid or pod["metadata"].get("deletionTimestamp"):
            self._kill(started.result())
            return
        self.running[uid] = started.result()
        stamp = now()
        conditions = [
            {"type": t, "status": "True", "lastTransitionTime": stamp}
            for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
        ]
        containers = [
            {
                "name": c["name"],
                "image": c.get("image", ""),
                "ready": True,
                "started": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": stamp}},
            }
            for c in pod["spec"].get("containers", [])
        ]
        status = {
            "phase": "Running",
            "podIP": POD_IP,
            "hostIP": POD_IP,
            "startTime": stamp,
            "conditions": conditions,
            "containerStatuses": containers,
        }
        api.replace(pods, pod, {**pod, "status": status})

    @staticmethod
    def _kill(*containers: _Running) -> None:
        """Kill the containers' process groups, all of them first, then wait for each."""
        for running in containers:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(running.process.pid, signal.SIGKILL)
        for running in containers:
            running.process.wait()

    def stop(self) -> None:
        self._workers.shutdown(wait=True)
        started = [s.result() for s in self.starting.values() if s.exception() is None]
        self._kill(*started, *self.running.values())
        self.starting.clear()
        self.running.clear()
        shutil.rmtree(self.dir, ignore_errors=True)

    # pods/exec and pods/portforward (websockets)

    async def connect(self, request: web.Request, subresource: str, pod: dict):
        running = self.running.get(pod["metadata"]["uid"])
        if running is None:
            raise ApiError(400, "BadRequest", f"pod {pod['metadata']['name']} is not running")
        query = parse_qs(request.query_string)
        if subresource == "exec":
            return await self._exec(request, running, query)
        return await self._forward(request, pod, query)

    async def _exec(self, request, running: _Running, query: dict) -> web.WebSocketResponse:
        flags = {
            k: query.get(k, ["false"])[0].lower() in ("true", "1")
            for k in ("stdin", "stdout", "stderr", "tty")
        }
        if not (flags["stdin"] or flags["stdout"] or flags["stderr"]):
            raise ApiError(
                400, "BadRequest", "you must specify at least 1 of stdin, stdout, stderr"
            )
        process = await asyncio.create_subprocess_exec(
            *self._enter(running, query.get("command", [])),
            env=running.env,
            stdin=asyncio.subprocess.PIPE if flags["stdin"] else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        ws = web.WebSocketResponse(protocols=("v5.channel.k8s.io", "v4.channel.k8s.io"))
        await ws.prepare(request)

        async def send(data: bytes) -> None:
            # A client that went away leaves the command running, its output unread (as the
            # kubelet's streaming server does).
            with contextlib.suppress(ConnectionResetError):
                await ws.send_bytes(data)

        async def pump(stream, channel: int, wanted: bool) -> None:
            while chunk := await stream.read(65536):
                if wanted:
                    await send(bytes([channel]) + chunk)

        async def feed() -> None:
            async for message in ws:
                data = message.data if message.type == WSMsgType.BINARY else b""
                if message.type == WSMsgType.TEXT:
                    data = message.data.encode()
                if not data or process.stdin is None:
                    continue
                if data[0] == STDIN:
                    process.stdin.write(data[1:])
                    await process.stdin.drain()
                elif data[0] == CLOSE and data[1:2] == bytes([STDIN]):
                    process.stdin.close()

        feeder = asyncio.create_task(feed())
        await asyncio.gather(
            pump(process.stdout, STDOUT, flags["stdout"]),
            pump(process.stderr, STDERR, flags["stderr"]),
        )
        code = await process.wait()
        # The exit as kubelet reports it (pkg/kubelet/cri/streaming/remotecommand/websocket.go).
        status = {"metadata": {}, "status": "Success"}
        if code:
            status = {
                "metadata": {},
                "status": "Failure",
                "message": f"command terminated with non-zero exit code: exit status {code}",
                "reason": "NonZeroExitCode",
                "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
            }
        await send(bytes([ERROR]) + json.dumps(status).encode())
        feeder.cancel()
        await ws.close()
        return ws

    async def _forward(self, request, pod: dict, query: dict) -> web.WebSocketResponse:
        meta = pod["metadata"]
        ports = [int(p) for p in ",".join(query.get("ports", [])).split(",") if p]
        if not ports:
            raise ApiError(400, "BadRequest", "at least 1 port must be specified")
        ws = web.WebSocketResponse(protocols=("v4.channel.k8s.io",))
        await ws.prepare(request)
        writers, pumps = {}, []

        async def pump(reader, channel: int) -> None:
            while chunk := await reader.read(65536):
                await ws.send_bytes(bytes([channel]) + chunk)
            await ws.close()

        for i, port in enumerate(ports):
            opening = port.to_bytes(2, "little")
            await ws.send_bytes(bytes([2 * i]) + opening)
            await ws.send_bytes(bytes([2 * i + 1]) + opening)
            local = self.ports.get((meta["namespace"], meta["name"], port))
            try:
                if local is None:
                    raise ConnectionRefusedError("connection refused")
                reader, writer = await asyncio.open_connection("127.0.0.1", local)
            except OSError as e:
                message = (
                    f"error forwarding port {port} to pod {meta['uid']}, uid : failed to connect "
                    f"to localhost:{port} inside namespace: {e}"
                )
                await ws.send_bytes(bytes([2 * i + 1]) + message.encode())
                continue
            writers[2 * i] = writer
            pumps.append(asyncio.create_task(pump(reader, 2 * i)))
        async for message in ws:
            if message.type == WSMsgType.BINARY and message.data and message.data[0] in writers:
                writers[message.data[0]].write(message.data[1:])
                await writers[message.data[0]].drain()
        for writer in writers.values():
            writer.close()
        for task in pumps:
            task.cancel()
        return ws
