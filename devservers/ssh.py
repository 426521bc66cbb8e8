"""How ssh reaches a DevServer: `devctl ssh`, `devctl ssh-config` and `devctl proxy`.

Every way in is the same ssh options: ProxyCommand `devctl proxy <server> --replica N` (stdin and
stdout tunnelled to the pod's sshd through the API server's port-forward: no local port, nothing
exposed), the pod's user, the key the server authorizes, and host-key checking against the
server's own host key (made once by the operator and kept in a Secret; its public half is in the
server's status) under an alias of the server's, so StrictHostKeyChecking stays on. `devctl ssh`
passes them as -o options; `devctl ssh-config` writes them as Host entries that the system ssh,
and so VS Code's Remote-SSH, reads.
"""

import os
import select
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from devservers.devctl import CliError, Devctl
from devservers.render import CONTAINER, SSH_PORT, ssh_enabled, world_size

CHUNK = 65536
HEADER = (
    "# Written by `devctl ssh-config` for the DevServers of {namespace}; every run rewrites it.\n"
)


def host_key_alias(namespace: str, name: str) -> str:
    """The name a server's host key has in known_hosts: every pod of it presents that key."""
    return f"{name}.{namespace}.devserver"


def known_hosts_line(namespace: str, server: dict) -> str | None:
    key = (server.get("status") or {}).get("sshHostKey")
    alias = host_key_alias(namespace, server["metadata"]["name"])
    return f"{alias} {key}\n" if key else None


def identity_file(server: dict) -> Path | None:
    """The private key in ~/.ssh whose public half (<key>.pub beside it) the server authorizes."""
    authorized = {
        tuple(k.split()[:2]) for k in server["spec"].get("ssh", {}).get("authorizedKeys", [])
    }
    for public in sorted((Path.home() / ".ssh").glob("*.pub")):
        private = public.with_suffix("")
        if private.is_file() and tuple(public.read_text().split()[:2]) in authorized:
            return private
    return None


def ssh_options(
    namespace: str, server: dict, replica: int, user: str | None, known_hosts: Path
) -> dict[str, str]:
    """ssh's options for pod `replica` of `server`. The proxy is this interpreter running devctl
    with this kubeconfig, whatever the environment ssh is started from (an editor's)."""
    from devservers.kube import kubeconfig_paths

    name = server["metadata"]["name"]
    proxy = [sys.executable, "-m", "devservers.cli", "proxy", name, "--replica", str(replica)]
    command = shlex.join(["env", f"KUBECONFIG={kubeconfig_paths()}", *proxy, "-n", namespace])
    options = {"User": user} if user else {}
    options |= {
        "ProxyCommand": command.replace("%", "%%"),  # ssh expands %-tokens in it
        "HostKeyAlias": host_key_alias(namespace, name),
        "UserKnownHostsFile": str(known_hosts),
        "StrictHostKeyChecking": "yes",
    }
    identity = identity_file(server)
    if identity:
        options |= {"IdentityFile": str(identity), "IdentitiesOnly": "yes"}
    return options


def pod_user(devctl: Devctl, pod: str) -> str:
    """Who the pod's sshd logs in: the image's user (a non-root sshd serves only itself)."""
    with devctl.allowed("exec into and port-forward to pods"):
        return devctl.cluster.exec(devctl.namespace, pod, CONTAINER, ["id", "-un"]).strip()


def ssh(devctl: Devctl, name: str, replica: int, extra: list[str]) -> int:
    """The system ssh to pod `replica` of the server, with `extra` (ssh's options, a command)."""
    server = devctl.server(name)
    pod = devctl.pod(server, replica)
    user = pod_user(devctl, pod)
    line = known_hosts_line(devctl.namespace, server)
    if line is None:
        raise CliError(
            f"devserver/{name} has no SSH host key in its status yet (the operator publishes it "
            "when it reconciles the server): try again in a minute"
        )
    with tempfile.TemporaryDirectory(prefix="devctl-ssh-") as directory:
        known_hosts = Path(directory) / "known_hosts"
        known_hosts.write_text(line)
        options = ssh_options(devctl.namespace, server, replica, user, known_hosts)
        flags = [f"-o{key}={value}" for key, value in options.items()]
        return subprocess.call(["ssh", *flags, name, *extra])


def _value(text: str) -> str:
    """An ssh_config argument: double-quoted when it holds spaces."""
    return f'"{text}"' if any(c.isspace() for c in text) else text


def configured_users(config: Path) -> dict[str, str]:
    """Each Host's User in a config devctl wrote: what a stopped server's entry keeps."""
    users, host = {}, None
    for line in config.read_text().splitlines() if config.is_file() else []:
        words = line.split()
        if words[:1] == ["Host"] and len(words) > 1:
            host = words[1]
        elif words[:1] == ["User"] and len(words) > 1 and host:
            users[host] = words[1]
    return users


def ssh_config_paths(namespace: str) -> tuple[Path, Path]:
    """(the Host entries, their known_hosts) of a namespace's servers."""
    directory = Path.home() / ".ssh" / "devctl"
    return directory / f"{namespace}.conf", directory / f"{namespace}.known_hosts"


def include_line() -> str:
    return f"Include {_value(str(Path.home() / '.ssh' / 'devctl' / '*.conf'))}"


def ensure_included() -> bool:
    """Put devctl's Include at the top of ~/.ssh/config (outside any Host block, and first:
    ssh keeps each option's first value) unless it is there. True if it was added."""
    config = Path.home() / ".ssh" / "config"
    text = config.read_text() if config.is_file() else ""
    if include_line() in text.splitlines():
        return False
    config.parent.mkdir(mode=0o700, exist_ok=True)
    config.write_text(f"# Added by devctl ssh-config: your DevServers.\n{include_line()}\n\n{text}")
    return True


def write_ssh_config(devctl: Devctl) -> None:
    """A Host entry per pod of each of the namespace's servers (`<server>` and `<server>.0` for
    pod 0, `<server>.<i>` for pod i), their host keys, and the Include that reads them; entries
    of deleted servers go. A server that is not running keeps the User it had."""
    config, known_hosts = ssh_config_paths(devctl.namespace)
    before = configured_users(config)
    servers = devctl.servers()
    entries, keys, hosts, notes = [], [], [], []
    for server in sorted(servers, key=lambda s: s["metadata"]["name"]):
        if not ssh_enabled(server):
            continue
        name = server["metadata"]["name"]
        try:
            first = devctl.pod(server, 0)
        except CliError:
            first = None  # stopped or pod 0 not ready: no pod to ask for its user
        user = pod_user(devctl, first) if first else before.get(name)
        if user is None:
            notes.append(
                f"{name}: not running, so its entries have no User: start it and run "
                "devctl ssh-config again"
            )
        line = known_hosts_line(devctl.namespace, server)
        if line is None:
            notes.append(
                f"{name}: no host key published yet (the operator does it when it "
                "reconciles the server): run devctl ssh-config again in a minute"
            )
        else:
            keys.append(line)
        if identity_file(server) is None:
            notes.append(
                f"{name}: no key in ~/.ssh matches its authorizedKeys; ssh offers its defaults"
            )
        for replica in range(world_size(server)):
            names = [name, f"{name}.0"] if replica == 0 else [f"{name}.{replica}"]
            options = ssh_options(devctl.namespace, server, replica, user, known_hosts)
            entries.append(
                f"Host {' '.join(names)}\n"
                + "".join(
                    f"  {key} {value if key == 'ProxyCommand' else _value(value)}\n"
                    for key, value in options.items()
                )
            )
            hosts += names[:1]
    config.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    known_hosts.write_text("".join(keys))
    config.write_text(HEADER.format(namespace=devctl.namespace) + "\n".join(entries))
    included = " (Include added to ~/.ssh/config)" if ensure_included() else ""
    print(
        f"{len(hosts)} host(s) in {config}{included}: {', '.join(hosts) or 'none'}"
        + (f"; try `ssh {hosts[0]}`" if hosts else ""),
        file=devctl.out,
    )
    for note in notes:
        print(f"devctl: {note}", file=sys.stderr)


def relay(local_in: int, local_out: int, remote) -> None:
    """Copy bytes from file descriptor `local_in` to socket `remote` and from `remote` to
    `local_out` until either side ends."""
    try:
        while True:
            readable, _, _ = select.select([local_in, remote], [], [])
            if local_in in readable:
                data = os.read(local_in, CHUNK)
                if not data:
                    return
                remote.sendall(data)
            if remote in readable:
                data = remote.recv(CHUNK)
                if not data:
                    return
                while data:
                    data = data[os.write(local_out, data) :]
    except BrokenPipeError:
        return  # ssh went away first


def proxy(devctl: Devctl, name: str, replica: int) -> int:
    """ssh's ProxyCommand: this process's stdin and stdout are a connection to the pod's sshd."""
    pod = devctl.pod(devctl.server(name), replica)
    with devctl.allowed("port-forward to pods"):
        with devctl.cluster.connection(devctl.namespace, pod, SSH_PORT) as remote:
            relay(sys.stdin.fileno(), sys.stdout.fileno(), remote)
    return 0
