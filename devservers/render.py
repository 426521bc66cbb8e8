"""A DevServer's children, rendered from the server and its flavor: pure functions, no cluster.

Both modes are one StatefulSet (standalone: one pod; distributed: worldSize pods started together)
behind a headless Service for stable pod DNS, with a home volume per pod from volumeClaimTemplates
in the flavor's home StorageClass (kept when the server stops, is replaced or, unless asked,
deleted), the owner's EFS claim where the flavor's nodes mount it, a memory-backed /dev/shm, and a
ConfigMap with the entrypoint and the torchrun helper. Kueue admits the StatefulSet as one pod
group (its `statefulset` integration): all pods or none. A NetworkPolicy lets the server's pods
reach each other, and an SSH load balancer its sshd; the user namespace denies every other
ingress (infra/components/tenant_network.py).
"""

import base64
import hashlib
import json
import re
from dataclasses import dataclass, field

from devservers.api import (
    API_VERSION,
    GPU,
    LOCAL_QUEUE,
    NAMESPACE_PREFIX,
    OWNER_LABEL,
    QUEUE_LABEL,
    SERVER_LABEL,
)

HOME = "/home/dev"
SHARED = "/shared"
SCRIPTS = "/etc/devserver"
SSH_PORT = 2222  # sshd runs as the image's non-root user, so above 1024
RDZV_PORTS = range(29500, 29511)  # c10d rendezvous (29500) and spares for extra process groups
# The server's SSH host key, from its Secret: a volume of its own, since a mount point inside
# the scripts' read-only ConfigMap volume could not be made.
HOST_KEY_DIR = "/etc/devserver-host-key"
HOST_KEY_FILE = "ssh_host_ed25519_key"
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
SHAPE_ANNOTATION = "dev.training-platform.io/pod-shape"
CONTAINER = "dev"

# One `SetEnv` line for sshd_config with the container's environment (the image's PATH and
# LD_LIBRARY_PATH, the pod's HOME, RANK, WORLD_SIZE, MASTER_ADDR, NCCL_*, ...): sshd builds a
# fresh one for each session otherwise. sshd applies SetEnv over its own defaults, honours only
# the first SetEnv line, and splits it into words where `"` quotes and `\` escapes `"` and `\`
# (OpenSSH 8.7+: servconf.c sSetEnv, misc.c argv_split). Left out: what sshd sets per session
# (USER, LOGNAME, SHELL, MAIL, TERM, DISPLAY, SSH_*), the shells' own PWD, OLDPWD, SHLVL and _,
# and values spanning lines, which one config line cannot hold.
SESSION_ENV_AWK = r"""BEGIN {
  line = "SetEnv"
  for (name in ENVIRON) {
    value = ENVIRON[name]
    if (name !~ /^[A-Za-z_][A-Za-z0-9_]*$/) continue
    if (name ~ /^(USER|LOGNAME|SHELL|MAIL|TERM|DISPLAY|SSH_.*|PWD|OLDPWD|SHLVL|_)$/) continue
    if (index(value, "\n")) {
      print "start.sh: " name " spans lines, so SSH sessions go without it" > "/dev/stderr"
      continue
    }
    quoted = ""
    for (i = 1; i <= length(value); i++) {
      c = substr(value, i, 1)
      quoted = quoted (c == "\\" || c == "\"" ? "\\" : "") c
    }
    line = line " \"" name "=" quoted "\""
  }
  print line
}"""

ENTRYPOINT = f"""#!/bin/sh
# DevServer entrypoint: install the owner's SSH keys, then serve SSH as the container's user
# (an image without sshd still runs, reachable with kubectl exec). SSH sessions get the
# container's environment, HOME included: the persistent home, whatever the image's passwd says.
# SFTP (scp since OpenSSH 9.0, sftp, editors' file transfers) is sshd's in-process server, which
# needs no sftp-server binary in the image (sshd_config(5), Subsystem), started in the persistent
# home (-d, sftp-server(8)), not the passwd one.
set -eu
mkdir -p "$HOME/.ssh"
chmod 700 "$HOME/.ssh"
cp "$(dirname "$0")/authorized_keys" "$HOME/.ssh/authorized_keys"
chmod 600 "$HOME/.ssh/authorized_keys"
SSHD=$(command -v sshd || echo /usr/sbin/sshd)
if [ "${{DEVSERVER_SSH:-false}}" = true ] && [ -x "$SSHD" ]; then
  # Only this user may read the config (it holds the environment) and the host key, which is
  # the server's (its Secret, the same on every pod and after every restart: clients check it).
  (
  umask 077
  rm -f "$HOME/.ssh/host_ed25519"
  cat "$DEVSERVER_HOST_KEY" > "$HOME/.ssh/host_ed25519"
  cat > "$HOME/.ssh/sshd_config" <<EOF
Port {SSH_PORT}
HostKey $HOME/.ssh/host_ed25519
PidFile $HOME/.ssh/sshd.pid
AuthorizedKeysFile $HOME/.ssh/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
AllowTcpForwarding yes
Subsystem sftp internal-sftp -d $HOME
EOF
  awk '{SESSION_ENV_AWK}' >> "$HOME/.ssh/sshd_config"
  )
  # Sessions start in the image user's passwd home; the persistent one is where they go.
  [ -f "$HOME/.profile" ] || echo 'cd "$HOME"' > "$HOME/.profile"
  exec "$SSHD" -D -e -f "$HOME/.ssh/sshd_config"
fi
exec sleep infinity
"""

TORCHRUN = """#!/bin/sh
# torchrun on this pod as node $RANK of $WORLD_SIZE; `devctl run` starts it on every pod.
set -eu
exec torchrun --nnodes "$WORLD_SIZE" --node-rank "$RANK" --nproc-per-node "$NPROC_PER_NODE" \\
  --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" "$@"
"""


class RenderError(ValueError):
    """The server cannot be rendered as asked (a message for its status)."""


# The AWS cloud provider tags the load balancer it makes for a Service with these (the legacy
# provider's Classic ELB, and the AWS Load Balancer Controller's NLB, read the same annotation).
LOAD_BALANCER_TAGS = "service.beta.kubernetes.io/aws-load-balancer-additional-resource-tags"
NAMESPACE_SLOT = "{namespace}"


@dataclass(frozen=True)
class Settings:
    """What the platform decides for every server (the operator's environment)."""

    # Source ranges an SSH LoadBalancer may accept; empty: LoadBalancer SSH is refused.
    ssh_cidrs: tuple[str, ...] = field(default_factory=tuple)
    # The VPC's range, from which an SSH load balancer's connections reach the pod (network_policy).
    vpc_cidr: str = ""
    # Idle floors (devServers.idle), unless a server sets its own (lifecycle.idle*Percent).
    idle_gpu_percent: float = 5.0
    idle_cpu_percent: float = 10.0
    # Registries and repositories whose images servers may run (devservers.images); empty:
    # none, every server is refused.
    allowed_images: tuple[str, ...] = field(default_factory=tuple)
    require_image_digest: bool = False
    # USD per hour of the instance types the flavors' pools launch (the stack's price file),
    # for the savings idle stops report.
    prices: dict[str, float] = field(default_factory=dict)
    # What a server bills while it exists (the stack's price file): gp3 per GiB-hour of its
    # homes, and its SSH load balancer's hour, for the savings record.
    kept_prices: dict[str, float] = field(default_factory=dict)
    # Hours of each idle stop the savings report counts as saved (devServers.idle.
    # countedStopHours): the operator writes it into the stop's period.
    counted_stop_hours: float = 8.0
    # AWS tags of an SSH load balancer (`k=v,k=v`, NAMESPACE_SLOT standing for the server's
    # namespace): what its hours bill under.
    load_balancer_tags: str = ""


def kept_usd_per_hour(server: dict, settings: Settings) -> float | None:
    """What the server bills whether it runs or not: a home volume a pod (gp3), and its SSH
    load balancer if it has one; None without the prices."""
    if "homeGibHour" not in settings.kept_prices:
        return None
    size = server["spec"].get("persistentHomeSize", "100Gi")
    gib = int(size[:-2]) * (1024 if size.endswith("Ti") else 1)
    homes = world_size(server) * gib * settings.kept_prices["homeGibHour"]
    balancer = _ssh(server).get("serviceType") == "LoadBalancer" and ssh_enabled(server)
    return homes + (settings.kept_prices.get("sshLoadBalancerHour", 0.0) if balancer else 0.0)


def world_size(server: dict) -> int:
    spec = server["spec"]
    return spec["distributed"]["worldSize"] if spec.get("mode") == "distributed" else 1


def desired_replicas(server: dict) -> int:
    return 0 if server["spec"].get("stopped") else world_size(server)


def gpus_per_pod(flavor: dict) -> int:
    return int(flavor["spec"]["resources"]["limits"].get(GPU, "0"))


def procs_per_node(server: dict, flavor: dict) -> int:
    """Processes per pod: as asked, else one per GPU (one on a CPU flavor)."""
    asked = (server["spec"].get("distributed") or {}).get("nprocPerNode")
    gpus = gpus_per_pod(flavor)
    if asked and gpus and asked > gpus:
        raise RenderError(f"nprocPerNode {asked} exceeds the flavor's {gpus} GPUs per pod")
    return asked or max(gpus, 1)


def ssh_service_name(server: dict) -> str:
    return f"{server['metadata']['name']}-ssh"


def scripts_name(server: dict) -> str:
    return f"{server['metadata']['name']}-scripts"


def home_claims(server: dict) -> list[str]:
    """The home PersistentVolumeClaims the StatefulSet creates, one per pod."""
    name = server["metadata"]["name"]
    return [f"home-{name}-{i}" for i in range(world_size(server))]


def children(server: dict, flavor: dict, settings: Settings) -> list[dict]:
    """Every object the operator keeps in step with `server`, in creation order."""
    rendered = [config_map(server), headless_service(server)]
    if ssh_enabled(server):
        rendered.append(ssh_service(server, settings))
    # Before the pods: they rendezvous as they start.
    rendered.append(network_policy(server, settings))
    rendered.append(stateful_set(server, flavor))
    return rendered


def _ssh(server: dict) -> dict:
    return {"enabled": True, "serviceType": "ClusterIP", **server["spec"].get("ssh", {})}


def ssh_enabled(server: dict) -> bool:
    return _ssh(server)["enabled"]


def _metadata(server: dict, name: str, **extra) -> dict:
    meta = server["metadata"]
    labels = {SERVER_LABEL: meta["name"], OWNER_LABEL: server["spec"]["owner"]}
    return {
        "name": name,
        "namespace": meta["namespace"],
        "labels": {**labels, **extra.pop("labels", {})},
        # The server owns its children: deleting it deletes them (but not the home volumes, which
        # belong to the StatefulSet's claim templates; see the operator's adopt_home_claims).
        "ownerReferences": [
            {
                "apiVersion": API_VERSION,
                "kind": "DevServer",
                "name": meta["name"],
                "uid": meta.get("uid", ""),
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
        **extra,
    }


def _selector(server: dict) -> dict:
    return {SERVER_LABEL: server["metadata"]["name"]}


def master_address(server: dict) -> str:
    meta = server["metadata"]
    return f"{meta['name']}-0.{meta['name']}.{meta['namespace']}.svc.cluster.local"


def config_map(server: dict) -> dict:
    keys = _ssh(server).get("authorizedKeys", [])
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(server, scripts_name(server)),
        "data": {
            "start.sh": ENTRYPOINT,
            "torchrun.sh": TORCHRUN,
            "authorized_keys": "".join(f"{k}\n" for k in keys),
        },
    }


def host_key_secret_name(server: dict) -> str:
    return f"{server['metadata']['name']}-ssh-host-key"


def host_key_secret(server: dict, private_key: str, public_key: str) -> dict:
    """The Secret with the server's SSH host key, made once by the operator: every pod of the
    server presents it, after every restart, so clients keep checking it. Deleting it rotates the
    key (the operator makes a new one; pods load it when they restart)."""
    files = {HOST_KEY_FILE: private_key, f"{HOST_KEY_FILE}.pub": public_key}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(server, host_key_secret_name(server)),
        "type": "Opaque",
        "immutable": True,
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in files.items()},
    }


def host_public_key(secret: dict) -> str:
    """The public key line (`ssh-ed25519 AAAA...`) of a host_key_secret."""
    return base64.b64decode(secret["data"][f"{HOST_KEY_FILE}.pub"]).decode().strip()


def headless_service(server: dict) -> dict:
    """Stable DNS <server>-<i>.<server>.<namespace>.svc for every pod, ready or not."""
    ports = [{"name": "ssh", "port": SSH_PORT, "targetPort": SSH_PORT}]
    if server["spec"].get("mode") == "distributed":
        ports += [{"name": f"torch-{p}", "port": p, "targetPort": p} for p in RDZV_PORTS]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(server, server["metadata"]["name"]),
        "spec": {
            "type": "ClusterIP",
            "clusterIP": "None",
            # Rendezvous needs the peers' names before they pass readiness.
            "publishNotReadyAddresses": True,
            "selector": _selector(server),
            "ports": ports,
        },
    }


def ssh_service(server: dict, settings: Settings) -> dict:
    """SSH to pod 0: ClusterIP (devctl ssh port-forwards) or a LoadBalancer for allowed CIDRs."""
    spec: dict = {
        "type": _ssh(server)["serviceType"],
        "selector": {**_selector(server), POD_INDEX_LABEL: "0"},
        "ports": [{"name": "ssh", "port": 22, "targetPort": SSH_PORT, "protocol": "TCP"}],
    }
    if spec["type"] == "LoadBalancer":
        if not settings.ssh_cidrs:
            raise RenderError(
                "ssh.serviceType LoadBalancer is not allowed on this platform (no "
                "devServers.sshLoadBalancerCidrs); use ClusterIP and devctl ssh"
            )
        spec["loadBalancerSourceRanges"] = list(settings.ssh_cidrs)
    metadata = _metadata(server, ssh_service_name(server))
    if spec["type"] == "LoadBalancer" and settings.load_balancer_tags:
        tags = settings.load_balancer_tags.replace(NAMESPACE_SLOT, metadata["namespace"])
        metadata["annotations"] = {LOAD_BALANCER_TAGS: tags}
    return {"apiVersion": "v1", "kind": "Service", "metadata": metadata, "spec": spec}


def network_policy(server: dict, settings: Settings) -> dict:
    """Ingress to the server's pods: from its own pods on any port (c10d's store on RDZV_PORTS,
    NCCL's and gloo's sockets on ports they pick), and, with an SSH load balancer, to sshd from
    where the balancer's connections come from. Nothing else: devctl's port-forward and exec
    reach a pod through its node's kubelet, which dials inside the pod's own network namespace
    (containerd pkg/cri/server/sandbox_portforward_linux.go), and no policy can block a pod's
    own node (networking.k8s.io/v1 NetworkPolicySpec.ingress).

    The in-tree load balancer of a LoadBalancer Service (the Classic ELB) connects to a node's
    port, where kube-proxy hands the connection to the pod with the node's address as its source
    (externalTrafficPolicy Cluster), so what the pod sees comes from the VPC's range; the client
    ranges (loadBalancerSourceRanges, the balancer's security group) are listed too, for a
    balancer that keeps clients' addresses. The VPC's range holds every pod's address as well
    (the VPC CNI gives pods VPC addresses): a server with an SSH load balancer accepts SSH
    connections from any pod, as it does from the allowed ranges; sshd takes only its owner's
    keys."""
    own_pods = {"podSelector": {"matchLabels": _selector(server)}}
    rules: list[dict] = [{"from": [own_pods]}]
    if ssh_enabled(server) and _ssh(server)["serviceType"] == "LoadBalancer":
        sources = [*settings.ssh_cidrs, *([settings.vpc_cidr] if settings.vpc_cidr else [])]
        rules.append(
            {
                "from": [{"ipBlock": {"cidr": cidr}} for cidr in sources],
                "ports": [{"protocol": "TCP", "port": SSH_PORT}],
            }
        )
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(server, server["metadata"]["name"]),
        "spec": {
            "podSelector": {"matchLabels": _selector(server)},
            "policyTypes": ["Ingress"],
            "ingress": rules,
        },
    }


def _env(server: dict, flavor: dict) -> list[dict]:
    spec = server["spec"]
    distributed = spec.get("distributed") or {}
    env = [
        {"name": "HOME", "value": HOME},
        {"name": "DEVSERVER_NAME", "value": server["metadata"]["name"]},
        {"name": "DEVSERVER_SSH", "value": str(ssh_enabled(server)).lower()},
        # Node rank = the pod's index in the StatefulSet; torchrun gives each worker its own.
        {
            "name": "RANK",
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{POD_INDEX_LABEL}']"}},
        },
        {"name": "WORLD_SIZE", "value": str(world_size(server))},
        {"name": "NPROC_PER_NODE", "value": str(procs_per_node(server, flavor))},
        {"name": "MASTER_ADDR", "value": master_address(server)},
        {"name": "MASTER_PORT", "value": str(RDZV_PORTS[0])},
        {"name": "TORCH_DISTRIBUTED_BACKEND", "value": distributed.get("backend", "nccl")},
    ]
    if ssh_enabled(server):
        env.append({"name": "DEVSERVER_HOST_KEY", "value": f"{HOST_KEY_DIR}/{HOST_KEY_FILE}"})
    env += [{"name": k, "value": v} for k, v in sorted(distributed.get("ncclEnv", {}).items())]
    return env


def pod_template(server: dict, flavor: dict) -> dict:
    spec, placement = server["spec"], flavor["spec"]
    resources = placement["resources"]
    memory_gib = int(resources["limits"]["memory"].removesuffix("Gi"))
    shared = {"enabled": True, "claimName": "efs-shared", **spec.get("shared", {})}
    # The hybrid machines mount no EFS: their servers go without /shared, whatever they ask.
    mount_shared = shared["enabled"] and placement["sharedFileSystem"]
    volumes = [
        {"name": "scripts", "configMap": {"name": scripts_name(server), "defaultMode": 0o555}},
        # Memory-backed: NCCL and DataLoader workers need more than the runtime's 64 MiB.
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{memory_gib // 2}Gi"}},
    ]
    mounts = [
        {"name": "home", "mountPath": HOME},
        {"name": "scripts", "mountPath": SCRIPTS},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    if ssh_enabled(server):
        # Readable by the image's user through fsGroup: the kubelet gives a read-only volume's
        # files that group and mode | 0440 (pkg/volume/volume_linux.go, SetVolumeOwnership).
        secret = {"secretName": host_key_secret_name(server), "defaultMode": 0o440}
        volumes.append({"name": "host-key", "secret": secret})
        mounts.append({"name": "host-key", "mountPath": HOST_KEY_DIR, "readOnly": True})
    if mount_shared:
        volumes.append(
            {"name": "shared", "persistentVolumeClaim": {"claimName": shared["claimName"]}}
        )
        mounts.append({"name": "shared", "mountPath": SHARED})
    pod_spec = {
        "nodeSelector": dict(placement["nodeSelector"]),
        "tolerations": [dict(t) for t in placement.get("tolerations", [])],
        "terminationGracePeriodSeconds": 30,
        "enableServiceLinks": False,
        # The user's code needs no Kubernetes credentials (devctl uses the user's own).
        "automountServiceAccountToken": False,
        # The Pod Security "restricted" level of the user namespaces; the image picks the user.
        "securityContext": {
            "runAsNonRoot": True,
            "fsGroup": 1000,
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            {
                "name": CONTAINER,
                "image": spec["image"],
                "command": [f"{SCRIPTS}/start.sh"],
                "workingDir": HOME,
                "env": _env(server, flavor),
                "ports": [{"name": "ssh", "containerPort": SSH_PORT}]
                + [
                    {"name": f"torch-{p}", "containerPort": p}
                    for p in RDZV_PORTS
                    if spec.get("mode") == "distributed"
                ],
                "resources": {
                    "requests": dict(resources["requests"]),
                    "limits": dict(resources["limits"]),
                },
                "volumeMounts": mounts,
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["ALL"]},
                },
            }
        ],
        "volumes": volumes,
    }
    return {
        "metadata": {
            "labels": {**_selector(server), OWNER_LABEL: spec["owner"]},
            # Karpenter must not consolidate a node away under someone's session.
            "annotations": {"karpenter.sh/do-not-disrupt": "true"},
        },
        "spec": pod_spec,
    }


def pod_shape(template: dict, claim_templates: list[dict]) -> str:
    """A digest of what cannot change in place: Kueue freezes an admitted pod group's spec."""
    text = json.dumps([template, claim_templates], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def stateful_set(server: dict, flavor: dict) -> dict:
    name, spec = server["metadata"]["name"], server["spec"]
    template = pod_template(server, flavor)
    claims = [
        {
            "metadata": {
                "name": "home",
                "labels": {**_selector(server), OWNER_LABEL: spec["owner"]},
            },
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": flavor["spec"]["homeStorageClass"],
                "resources": {"requests": {"storage": spec.get("persistentHomeSize", "100Gi")}},
            },
        }
    ]
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _metadata(
            server,
            name,
            labels={QUEUE_LABEL: LOCAL_QUEUE},
            annotations={SHAPE_ANNOTATION: pod_shape(template, claims)},
        ),
        "spec": {
            "replicas": desired_replicas(server),
            "serviceName": name,
            # Distributed pods start together: Kueue admits them as one group anyway.
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": _selector(server)},
            "template": template,
            "volumeClaimTemplates": claims,
            # Homes outlive stop (scale to zero) and replacement of the StatefulSet.
            "persistentVolumeClaimRetentionPolicy": {
                "whenDeleted": "Retain",
                "whenScaled": "Retain",
            },
        },
    }


def owner_of_namespace(namespace: str) -> str | None:
    """The user a dev-<user> namespace belongs to, or None for any other namespace."""
    match = re.fullmatch(
        re.escape(NAMESPACE_PREFIX) + r"([a-z0-9]([-a-z0-9]*[a-z0-9])?)", namespace
    )
    return match.group(1) if match else None
