"""Real OpenSSH for tests: `/usr/sbin/sshd -D -e` on loopback addresses (127.0.0.2, 127.0.0.3, ...
standing for hosts or pods), run as a non-root user as the images run it, and the real `ssh` client
with a generated config that checks host keys against the known_hosts this module writes.

Sessions get the environment sshd builds (its compiled-in default PATH, HOME from passwd, ...),
never the test's: that is what the MPI launcher's remote ranks and DevServer users get.

Run as root, sshd and its sessions run as TEST_USER, a system account created here once (and kept)
with a real shell and a home of its own, TEST_HOME, outside any temp dir: the account outlives the
test run that created it, so its home must too (an older version put it in the suite's temp dir,
which the run removes; such an account is moved to TEST_HOME). They keep one ambient capability,
CAP_DAC_READ_SEARCH: reading (never writing) what that user could not, such as this test's
interpreter under a 0700 /root; environments are unaffected. With it sshd can read /etc/shadow,
which the unprivileged sshd of an image cannot, so the account's password field is `*` (no
password, not "locked", which sshd would refuse).
Run as anyone else, everything runs as that user.
"""

import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trainer.launch import children, signal_each

SSHD = "/usr/sbin/sshd"
# What an image's PATH ends with, after its own directories.
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TEST_USER = "tp-test-ssh"
TEST_HOME = Path("/var/lib") / TEST_USER
READY_SECONDS = 60  # a loaded 2-core machine can take a while to start sshd
PORT_ATTEMPTS = 5  # a free port can be taken before sshd binds it: pick another


@dataclass(frozen=True)
class Account:
    """The non-root user sshd, its sessions and the MPI launcher run as."""

    name: str
    uid: int
    gid: int
    home: Path

    def command(self, argv: list[str]) -> list[str]:
        """`argv` run as this account."""
        if os.geteuid() == self.uid:
            return argv
        return [
            "setpriv",
            f"--reuid={self.uid}",
            f"--regid={self.gid}",
            "--init-groups",
            "--inh-caps=+dac_read_search",
            "--ambient-caps=+dac_read_search",
            *argv,
        ]

    def own(self, path: Path) -> Path:
        if os.geteuid() != self.uid:
            os.chown(path, self.uid, self.gid)
        return path


def account(name: str = TEST_USER, home: Path = TEST_HOME, uid: int | None = None) -> Account:
    """`name` when root (created if missing, with `uid` if given, its home `home` made if
    missing), else the caller."""
    if os.geteuid() != 0:
        entry = pwd.getpwuid(os.geteuid())
        return Account(entry.pw_name, entry.pw_uid, entry.pw_gid, Path(entry.pw_dir))
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        created = subprocess.run(
            # --system: no mail spool, no aging; --password '*': see the module docstring.
            ["useradd", "--system", "--user-group", "--shell", "/bin/bash", "--password", "*"]
            + ["--home-dir", str(home), "--no-create-home"]
            + (["--uid", str(uid)] if uid is not None else [])
            + [name],
            capture_output=True,
            text=True,
        )
        if created.returncode not in (0, 9):  # 9: created meanwhile by another test session
            raise RuntimeError(f"useradd {name}: {created.stderr}") from None
        entry = pwd.getpwnam(name)
    if Path(entry.pw_dir) != home:
        usermod = ["usermod", "--home", str(home), name]
        moved = subprocess.run(usermod, capture_output=True, text=True)
        if moved.returncode != 0:
            raise RuntimeError(f"usermod --home {home} {name}: {moved.stderr}")
        entry = pwd.getpwnam(name)
    found = Account(entry.pw_name, entry.pw_uid, entry.pw_gid, Path(entry.pw_dir))
    found.home.mkdir(mode=0o755, parents=True, exist_ok=True)
    found.own(found.home)
    return found


def free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


@dataclass
class Host:
    """A running sshd: its process, address and port, and the log of its stderr."""

    name: str
    address: str
    port: int
    process: subprocess.Popen
    log: Path

    def processes(self) -> list[int]:
        """sshd and every process below it: its sessions (each its own session, from sshd's
        setsid), what they run, and what that started in sessions of its own."""
        found, pending = [], [self.process.pid]
        while pending:
            pid = pending.pop()
            found.append(pid)
            pending.extend(children(pid))
        return found

    def power_off(self) -> None:
        """SIGKILL every process of this host, as a machine that loses power: its connections
        close (the kernel closes the sockets of a killed process) and nothing answers again."""
        signal_each(self.processes(), signal.SIGKILL)
        self.process.wait()

    def freeze(self) -> None:
        """SIGSTOP every process of this host, as a machine that drops off the network: nothing
        answers, yet none of its connections closes. power_off() ends it."""
        signal_each(self.processes(), signal.SIGSTOP)


class OpenSsh:
    """A temp dir with a client key, sshd hosts started in it, and the client's config for them.

    Use as a context manager: leaving it stops every sshd (with its sessions) and removes the dir.
    """

    def __init__(self):
        self.account = account()
        self.dir = self.account.own(Path(tempfile.mkdtemp(prefix="openssh-")))
        self.dir.chmod(0o755)
        self.client_key = self.dir / "id_ed25519"
        self.known_hosts = self.dir / "known_hosts"
        self.config = self.dir / "ssh_config"
        self.hosts: dict[str, Host] = {}
        self._host_keys: dict[str, str] = {}
        try:
            self._keygen(self.client_key)
            self._write_client_files()
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> "OpenSsh":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for host in self.hosts.values():
            host.power_off()
        shutil.rmtree(self.dir, ignore_errors=True)

    def mkdir(self, name: str) -> Path:
        """A directory in the temp dir that the account owns."""
        path = self.dir / name
        path.mkdir(parents=True)
        return self.account.own(path)

    def write(self, path: Path, text: str) -> Path:
        """A file the account owns."""
        path.write_text(text)
        return self.account.own(path)

    def image_bin(self) -> Path:
        """A directory that only an image's PATH has, never sshd's (as /opt/conda/bin of the
        PyTorch images), holding this test's python and torchrun."""
        path = self.mkdir("opt/conda/bin")
        self.write(path / "python", f'#!/bin/sh\nexec {sys.executable} "$@"\n').chmod(0o755)
        (path / "torchrun").symlink_to(Path(sys.executable).parent / "torchrun")
        return path

    def _keygen(self, path: Path) -> None:
        subprocess.run(
            self.account.command(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)]),
            check=True,
        )

    def serve(
        self,
        name: str,
        address: str,
        inside: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        port: int | None = None,
    ) -> Host:
        """An sshd of this module's own: key-only login to the account with the client key.
        `inside`: a command prefix that runs it elsewhere, e.g. in a pod's namespaces.
        `env`: what this machine's sessions have besides sshd's defaults (a PATH with its own
        programs), set by sshd's SetEnv as an admin would. `port`: see launch()."""
        home = self.mkdir(f"sshd-{name}")
        # Each host stands for a machine of its own, and machines have their own /tmp: OpenMPI's
        # orted keeps its session directory in $TMPDIR/ompi.<hostname>.<uid>
        # (orte/util/session_dir.c), and hosts on one machine share the hostname, so with one
        # /tmp two hosts' daemons would race on one directory (mkdir-failed, PMIx errors).
        sessions_env = {"TMPDIR": self.mkdir(f"sshd-{name}/tmp"), **(env or {})}
        host_key = home / "ssh_host_ed25519_key"
        self._keygen(host_key)
        authorized = self.write(
            home / "authorized_keys", Path(f"{self.client_key}.pub").read_text()
        )

        def command(port: int) -> list[str]:
            config = self.write(
                home / "sshd_config",
                f"ListenAddress {address}\n"
                f"Port {port}\n"
                f"HostKey {host_key}\n"
                "PidFile none\n"
                f"AuthorizedKeysFile {authorized}\n"
                "PasswordAuthentication no\n"
                "KbdInteractiveAuthentication no\n"
                "UsePAM no\n"
                # The temp dir's parents (/tmp) are world-writable; the images say no as well.
                "StrictModes no\n"
                # sshd honours only the first SetEnv line (servconf.c sSetEnv).
                f"SetEnv {' '.join(f'{key}={value}' for key, value in sessions_env.items())}\n",
            )
            return [SSHD, "-D", "-e", "-f", str(config)]

        # sshd's own environment is the test's; a session's is sshd's default all the same.
        return self.launch(
            name, address, command, dict(os.environ), Path(f"{host_key}.pub"), inside, port
        )

    def launch(
        self,
        name: str,
        address: str,
        command: Callable[[int], list[str]],
        env: dict[str, str],
        host_public_key: Path,
        inside: tuple[str, ...] = (),
        port: int | None = None,
    ) -> Host:
        """Run `command(port)` as the account (sshd, or a script that ends in `exec sshd`),
        after the prefix `inside` if any, until sshd says it listens on `address`, on a free
        port; then add it to the client's files (its host key read from `host_public_key` once
        it listens). `port`: that port instead, for an sshd `inside` a network namespace of
        its own (where nothing else listens, and which a free port here says nothing of)."""
        log = self.dir / f"{name}.log"
        for _ in range(PORT_ATTEMPTS if port is None else 1):
            chosen = port or free_port(address)
            with log.open("w") as out:
                process = subprocess.Popen(
                    [*inside, *self.account.command(command(chosen))],
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            host = Host(name, address, chosen, process, log)
            if self._wait_listening(host):
                self.hosts[name] = host
                self._host_keys[name] = " ".join(host_public_key.read_text().split()[:2])
                self._write_client_files()
                return host
        raise RuntimeError(f"sshd {name}: no free port on {address} in {PORT_ATTEMPTS} attempts")

    @staticmethod
    def _wait_listening(host: Host) -> bool:
        """True once sshd listens; False if its port was taken first."""
        ready = f"Server listening on {host.address} port {host.port}."
        deadline = time.monotonic() + READY_SECONDS
        while time.monotonic() < deadline:
            text = host.log.read_text()
            if ready in text:
                return True
            if host.process.poll() is not None:
                if "Address already in use" in text:
                    return False
                raise RuntimeError(f"sshd {host.name} exited {host.process.returncode}:\n{text}")
            time.sleep(0.05)
        host.power_off()
        raise RuntimeError(f"sshd {host.name} not listening after {READY_SECONDS} s:\n{text}")

    def _write_client_files(self) -> None:
        self.write(
            self.known_hosts,
            "".join(
                f"[{host.address}]:{host.port} {self._host_keys[name]}\n"
                for name, host in self.hosts.items()
            ),
        )
        per_host = "".join(
            f"Host {name}\n  HostName {host.address}\n  Port {host.port}\n"
            for name, host in self.hosts.items()
        )
        # ssh takes each option's first value: the hosts' blocks come before the defaults.
        self.write(
            self.config,
            per_host + "Host *\n"
            f"  User {self.account.name}\n"
            f"  IdentityFile {self.client_key}\n"
            "  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {self.known_hosts}\n"
            "  GlobalKnownHostsFile /dev/null\n"
            "  StrictHostKeyChecking yes\n"
            "  BatchMode yes\n"
            "  ConnectTimeout 30\n"
            "  LogLevel ERROR\n",
        )

    def client(self) -> list[str]:
        """The real ssh client with this site's config: append a host name and a command."""
        return ["ssh", "-F", str(self.config)]

    def ssh(self, name: str, *command: str, **run) -> subprocess.CompletedProcess:
        """`ssh <name> <command>` from the test process."""
        return subprocess.run(
            [*self.client(), name, *command],
            capture_output=True,
            text=True,
            timeout=run.pop("timeout", 60),
            **run,
        )
