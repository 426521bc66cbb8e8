"""Network namespaces for tests that run real WireGuard: one namespace per machine, joined by an
"internet" bridge (the underlay), each running WireGuard in userspace (wireguard-go; the kernel
here has no WireGuard module), brought up by wg-quick from the configs under test.

Needs root, or sudo without a password (GitHub's runners have it); without either a test fails
with a message saying so, never skips. Namespaces and the processes in them are removed when the
test ends, however it ends.
"""

import os
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

PROGRAMS = ("ip", "iptables", "wg", "wg-quick", "wireguard-go", "ping")
# wg-quick starts the userspace implementation when `ip link add ... type wireguard` fails.
USERSPACE = {
    "WG_QUICK_USERSPACE_IMPLEMENTATION": "wireguard-go",
    "WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD": "1",
}


def _privilege() -> list[str]:
    missing = [p for p in PROGRAMS if shutil.which(p) is None]
    if missing:
        pytest.fail(
            f"missing {', '.join(missing)}: install them with tools/system-packages.sh "
            "(make test runs it)"
        )
    if os.geteuid() == 0:
        return []
    probe = subprocess.run(["sudo", "-n", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.fail(
            "network namespaces need root: run the tests as root or with passwordless sudo "
            f"(sudo -n true said: {probe.stderr.strip() or probe.returncode})"
        )
    return ["sudo", "-n"]


class Namespaces:
    """Namespaces named <prefix>-<token>-<name>, on one bridge in <prefix>-<token>-net."""

    def __init__(self, prefix: str):
        self.sudo = _privilege()
        # A token per test: names stay unique beside other runs on the same machine.
        self.token = secrets.token_hex(2)
        self.prefix = f"{prefix}-{self.token}"
        self.names: list[str] = []
        self.net = self.add("net")
        self.run(self.net, "ip", "link", "add", "br0", "type", "bridge")
        self.run(self.net, "ip", "link", "set", "br0", "up")

    def ns(self, name: str) -> str:
        return f"{self.prefix}-{name}"

    def interface(self, name: str) -> str:
        """A WireGuard interface name unique on this machine: wireguard-go's control socket,
        /var/run/wireguard/<name>.sock, is shared by every namespace."""
        return f"t{self.token}{name}"[:15]

    def add(self, name: str, underlay: str | None = None) -> str:
        """A namespace with loopback up and, given an address/prefix, a port on the bridge."""
        ns = self.ns(name)
        self._root("ip", "netns", "add", ns)
        self.names.append(ns)
        self.run(ns, "ip", "link", "set", "lo", "up")
        if underlay:
            port = f"p{len(self.names)}"
            veth = ["type", "veth", "peer", "name", "eth0", "netns", ns]
            self.run(self.net, "ip", "link", "add", port, *veth)
            self.run(self.net, "ip", "link", "set", port, "master", "br0", "up")
            self.run(ns, "ip", "addr", "add", underlay, "dev", "eth0")
            self.run(ns, "ip", "link", "set", "eth0", "up")
        return ns

    def _root(self, *argv: str, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run([*self.sudo, *argv], capture_output=True, text=True, **kwargs)

    def add_behind_nat(self, name: str, router_underlay: str) -> str:
        """A namespace behind a masquerading router (namespace <name>-nat, with a port on the
        bridge): it reaches the bridge's addresses, which cannot reach it, as a machine behind a
        home router without port forwarding."""
        router = self.add(f"{name}-nat", underlay=router_underlay)
        ns = self.add(name)
        self.run(
            router, "ip", "link", "add", "lan0", "type", "veth", "peer", "name", "eth0", "netns", ns
        )
        self.run(router, "ip", "addr", "add", "192.168.77.1/24", "dev", "lan0")
        self.run(router, "ip", "link", "set", "lan0", "up")
        self.run(router, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        self.run(
            router, "iptables", "-t", "nat", "-A", "POSTROUTING", "-o", "eth0", "-j", "MASQUERADE"
        )
        self.run(ns, "ip", "addr", "add", "192.168.77.2/24", "dev", "eth0")
        self.run(ns, "ip", "link", "set", "eth0", "up")
        self.run(ns, "ip", "route", "add", "default", "via", "192.168.77.1")
        return ns

    def exec_prefix(self, ns: str, env: dict[str, str] | None = None) -> list[str]:
        """What runs a command in `ns` (with env added: sudo would drop the caller's)."""
        return [*self.sudo, "ip", "netns", "exec", ns, "env", *_assignments(env)]

    def run(
        self, ns: str, *argv: str, check: bool = True, env: dict[str, str] | None = None, **kwargs
    ) -> subprocess.CompletedProcess:
        done = subprocess.run(
            [*self.exec_prefix(ns, env), *argv],
            capture_output=True,
            text=True,
            timeout=60,
            **kwargs,
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"{' '.join(argv)} in {ns} exited {done.returncode}:\n{done.stdout}{done.stderr}"
            )
        return done

    def popen(self, ns: str, *argv: str, **kwargs) -> subprocess.Popen:
        return subprocess.Popen([*self.sudo, "ip", "netns", "exec", ns, *argv], **kwargs)

    def wg_quick(self, ns: str, action: str, config: Path) -> subprocess.CompletedProcess:
        """wg-quick up/down with a config file; the interface is the file's name."""
        return self.run(ns, "wg-quick", action, str(config), env=USERSPACE)

    def reaches(self, ns: str, address: str, attempts: int = 3) -> bool:
        """Whether `address` answers ping from `ns` (a try a second, for handshakes to finish)."""
        done = self.run(ns, "ping", "-c", "1", "-W", "1", "-w", str(attempts), address, check=False)
        return done.returncode == 0

    def close(self) -> None:
        """Stop every process in the namespaces (wireguard-go, servers), then remove them."""
        for ns in reversed(self.names):
            pids = self._pids(ns)
            for pid in pids:
                self._root("kill", "-TERM", pid)
            deadline = time.monotonic() + 5
            while pids and time.monotonic() < deadline:
                time.sleep(0.05)
                # Not `kill -0`: a process that exited but is not reaped yet (a daemon such as
                # wireguard-go, whose parent is PID 1) still answers it; it is out of the netns.
                pids = self._pids(ns)
            for pid in pids:
                self._root("kill", "-KILL", pid)
            self._root("ip", "netns", "del", ns)

    def _pids(self, ns: str) -> list[str]:
        return self._root("ip", "netns", "pids", ns).stdout.split()


def _assignments(env: dict[str, str] | None) -> list[str]:
    return [f"{key}={value}" for key, value in (env or {}).items()]


def stop(process: subprocess.Popen) -> None:
    """Stop a process started with Namespaces.popen (its sudo, if any, passes the signal on)."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
