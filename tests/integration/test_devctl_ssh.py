"""`devctl ssh-config` with the real OpenSSH client: the entries it writes take `ssh <server>`
(what VS Code's Remote-SSH runs) through `devctl proxy` and the local Kubernetes API's port-forward
(tests.kube_api, the dev stack's RBAC, the real operator) to each pod's sshd, which is the rendered
entrypoint under real sshd (devservers.tests.devserver_pods) serving the host key of the Secret the
operator made. Host-key checking stays on: an sshd with another key is refused."""

import os
import subprocess

from devservers.controller import new_host_key
from devservers.ssh import host_key_alias
from devservers.tests.devserver_pods import serve_pod
from tests.devservers_cluster import Cluster
from tests.openssh import OpenSsh
from tests.plugin import ROOT


def client(dev_cluster: Cluster, program: str, *argv: str) -> subprocess.CompletedProcess:
    """An OpenSSH client program (ssh, scp) with the user's ~/.ssh/config, as an editor runs it
    (they read the config of the home in /etc/passwd, not $HOME's, so the test names it)."""
    config = dev_cluster.home / ".ssh" / "config"
    env = {**os.environ, "HOME": str(dev_cluster.home), "PYTHONPATH": str(ROOT)}
    env.pop("KUBECONFIG", None)  # the entry's ProxyCommand names the kubeconfig itself
    return subprocess.run(
        [program, "-F", str(config), "-o", "BatchMode=yes", *argv],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip


def ssh(dev_cluster: Cluster, host: str, command: str) -> subprocess.CompletedProcess:
    return client(dev_cluster, "ssh", host, command)


def test_ssh_config_entries_reach_every_pod_with_the_servers_host_key(dev_cluster):
    dev_cluster.start_operator()
    status = dev_cluster.create_server("--distributed", "--replicas", "2", "--backend", "gloo")
    host_key = status["sshHostKey"]
    with OpenSsh() as site:
        for index in range(2):
            serve_pod(site, dev_cluster, "box", index)
        configured = dev_cluster.devctl("alice", "ssh-config")
        assert configured.returncode == 0, configured.stderr
        assert "2 host(s)" in configured.stdout and "`ssh box`" in configured.stdout
        ssh_dir = dev_cluster.home / ".ssh"
        entries = (ssh_dir / "devctl" / "dev-alice.conf").read_text()
        known_hosts = ssh_dir / "devctl" / "dev-alice.known_hosts"
        assert known_hosts.read_text() == f"{host_key_alias('dev-alice', 'box')} {host_key}\n"
        assert f"  User {site.account.name}\n" in entries
        assert f"  IdentityFile {dev_cluster.key}\n" in entries
        assert "  StrictHostKeyChecking yes\n" in entries

        # ssh box (pod 0) and ssh box.1 (pod 1), each a session with its pod's environment.
        for host, rank in (("box", "0"), ("box.1", "1")):
            session = ssh(dev_cluster, host, "echo $RANK of $WORLD_SIZE")
            assert session.returncode == 0, session.stderr
            assert session.stdout == f"{rank} of 2\n"

        # scp in and out: OpenSSH 9.0+'s scp speaks SFTP (scp(1), -O for the old protocol), as
        # editors do; relative paths are in the persistent home, where sessions start too.
        sent = dev_cluster.dir / "notes.txt"
        sent.write_text("lr=0.1\n")
        copied = client(dev_cluster, "scp", str(sent), "box.1:notes.txt")
        assert copied.returncode == 0, copied.stderr
        assert ssh(dev_cluster, "box.1", "cat $HOME/notes.txt").stdout == "lr=0.1\n"
        back = dev_cluster.dir / "back.txt"
        copied = client(dev_cluster, "scp", "box.1:notes.txt", str(back))
        assert copied.returncode == 0, copied.stderr
        assert back.read_text() == "lr=0.1\n"

        # Pod 1 fails its readiness (as the kubelet reports it): pod 0 stays reachable, pod 1's
        # entry is refused naming it.
        dev_cluster.client().resources.get(api_version="v1", kind="Pod").status.patch(
            name="box-1",
            namespace="dev-alice",
            body={"status": {"conditions": [{"type": "Ready", "status": "False"}]}},
            content_type="application/merge-patch+json",
        )
        dev_cluster.wait(lambda: dev_cluster.status()["replicasReady"] == 1, "1 of 2 pods ready")
        assert ssh(dev_cluster, "box", "echo $RANK").stdout == "0\n"
        refused = ssh(dev_cluster, "box.1", "true")
        assert refused.returncode == 255
        assert "devctl: pod box-1 of devserver/box is not ready" in refused.stderr

        # Idempotent: the Include once, the same entries.
        config = (ssh_dir / "config").read_text()
        assert dev_cluster.devctl("alice", "ssh-config").returncode == 0
        assert (ssh_dir / "config").read_text() == config and config.count("Include ") == 1
        assert (ssh_dir / "devctl" / "dev-alice.conf").read_text() == entries

        # Another host key behind pod 0's port (a replaced or spoofed sshd): refused.
        site.hosts.pop("box-0").power_off()
        serve_pod(site, dev_cluster, "box", 0, host_key=new_host_key(), name="impostor")
        refused = ssh(dev_cluster, "box", "true")
        assert refused.returncode == 255
        assert "Host key verification failed" in refused.stderr

    # A stopped server keeps its entries (and User); a deleted one's go.
    assert dev_cluster.devctl("alice", "stop", "box").returncode == 0
    dev_cluster.wait(lambda: dev_cluster.status().get("phase") == "Stopped", "box Stopped")
    assert dev_cluster.devctl("alice", "ssh-config").returncode == 0
    assert (ssh_dir / "devctl" / "dev-alice.conf").read_text() == entries
    assert dev_cluster.devctl("alice", "delete", "box").returncode == 0
    assert dev_cluster.devctl("alice", "ssh-config").returncode == 0
    assert "Host" not in (ssh_dir / "devctl" / "dev-alice.conf").read_text()
    assert known_hosts.read_text() == ""
    assert dev_cluster.api.refusals == []
