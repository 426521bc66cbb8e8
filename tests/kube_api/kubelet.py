"""The node side of the local API: a StatefulSet controller and a kubelet whose pods are local
processes.

- stateful_sets follows pkg/controller/statefulset (stateful_set_utils.go: pod `<set>-<i>` with
  labels statefulset.kubernetes.io/pod-name and apps.kubernetes.io/pod-index, a controller owner
  reference that blocks owner deletion, claims `<template>-<set>-<i>` from volumeClaimTemplates
  owned by the set only with persistentVolumeClaimRetentionPolicy.whenDeleted: Delete; pods at or
  above `replicas` are deleted; a set being deleted is left to the garbage collector).
- Kubelet runs each pod that has no scheduling gate (Kueue holds pods with one) as `sleep` in a
  PID and mount namespace of its own (`unshare --pid --mount-proc`): the pod's container. Exec
  runs the command in those namespaces (`nsenter`), so it sees the pod's processes and nothing
  else. A container port reaches whatever the test put on the loopback port it `expose`d for it
  (e.g. an SSH server), as the pod's network would.
"""

import asyncio
import copy
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from urllib.parse import parse_qs

from aiohttp import WSMsgType, web

from tests.kube_api.server import ApiError, Kind, KubeAPI, now

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


@dataclass
class _Running:
    process: subprocess.Popen
    init: int  # the pod's PID 1, seen from here


def _start_container() -> _Running:
    process = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "sleep", "infinity"],
        start_new_session=True,
    )
    children = f"/proc/{process.pid}/task/{process.pid}/children"
    for _ in range(200):
        try:
            with open(children) as f:
                found = f.read().split()
        except FileNotFoundError:
            found = []
        if found:
            return _Running(process, int(found[0]))
        time.sleep(0.01)
    process.kill()
    raise RuntimeError("unshare started no container process")


class Kubelet:
    """Runs the pods of a KubeAPI (set it as the API's runtime)."""

    def __init__(self):
        self.running: dict[str, _Running] = {}  # pod uid -> its container
        self.ports: dict[tuple[str, str, int], int] = {}  # (namespace, pod, port) -> local port

    @property
    def controllers(self):
        return [stateful_sets, self.run_pods]

    def expose(self, namespace: str, pod: str, port: int, local_port: int) -> None:
        """Container port `port` of `pod` is 127.0.0.1:`local_port` (where the test listens)."""
        self.ports[(namespace, pod, port)] = local_port

    def run_in(self, pod: dict, command: list[str]) -> subprocess.Popen:
        """Start `command` inside a running pod (a process the pod's user would have started)."""
        running = self.running[pod["metadata"]["uid"]]
        return subprocess.Popen(
            ["nsenter", "--target", str(running.init), "--pid", "--mount", "--", *command]
        )

    def run_pods(self, api: KubeAPI) -> None:
        pods = _kind(api, "", "pods")
        wanted = set()
        for pod in api.select(pods):
            meta, spec = pod["metadata"], pod["spec"]
            if meta.get("deletionTimestamp") or spec.get("schedulingGates"):
                continue
            wanted.add(meta["uid"])
            if meta["uid"] in self.running:
                continue
            self.running[meta["uid"]] = _start_container()
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
                for c in spec.get("containers", [])
            ]
            status = {
                "phase": "Running",
                "podIP": "127.0.0.1",
                "hostIP": "127.0.0.1",
                "startTime": stamp,
                "conditions": conditions,
                "containerStatuses": containers,
            }
            api.replace(pods, pod, {**pod, "status": status})
        for uid in set(self.running) - wanted:
            self._kill(self.running.pop(uid))

    @staticmethod
    def _kill(running: _Running) -> None:
        try:
            os.killpg(running.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        running.process.wait()

    def stop(self) -> None:
        for running in self.running.values():
            self._kill(running)
        self.running.clear()

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
            "nsenter", "--target", str(running.init), "--pid", "--mount", "--",
            *query.get("command", []),
            stdin=asyncio.subprocess.PIPE if flags["stdin"] else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        ws = web.WebSocketResponse(protocols=("v5.channel.k8s.io", "v4.channel.k8s.io"))
        await ws.prepare(request)

        async def pump(stream, channel: int, wanted: bool) -> None:
            while chunk := await stream.read(65536):
                if wanted:
                    await ws.send_bytes(bytes([channel]) + chunk)

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
        await ws.send_bytes(bytes([ERROR]) + json.dumps(status).encode())
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
