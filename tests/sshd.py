"""A real SSH server for tests: paramiko's server side on a loopback address, running each exec
request with /bin/sh on this machine (stdin, stdout, stderr and the exit status carried over the
channel as sshd carries them). Two of them on 127.0.0.2 and 127.0.0.3 stand in for two hosts of
a mesh, without root or an sshd package; given a command prefix (`ip netns exec NS`), a host's
commands run in a network namespace of its own."""

import signal
import socket
import subprocess
import threading
from pathlib import Path

import paramiko

from trainer.launch import children, signal_each


class _ExecServer(paramiko.ServerInterface):
    def __init__(self, host: "LoopbackSshd"):
        self.host = host

    def get_allowed_auths(self, username):
        return "publickey"

    def check_auth_publickey(self, username, key):
        if key == self.host.client_key:
            return paramiko.AUTH_SUCCESSFUL
        return paramiko.AUTH_FAILED

    def check_channel_request(self, kind, chanid):
        if kind == "session":
            return paramiko.OPEN_SUCCEEDED
        return paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_exec_request(self, channel, command):
        threading.Thread(
            target=self.host.execute, args=(channel, command.decode()), daemon=True
        ).start()
        return True


class LoopbackSshd:
    def __init__(
        self,
        address: str,
        client_key: paramiko.PKey,
        env: dict[str, str],
        prefix: tuple[str, ...] = (),
    ):
        self.address, self.client_key, self.env, self.prefix = address, client_key, env, prefix
        self.host_key = paramiko.ECDSAKey.generate()
        self._socket = socket.create_server((address, 0))
        self.port = self._socket.getsockname()[1]
        self._processes: list[subprocess.Popen] = []
        self._transports: list[paramiko.Transport] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._socket.accept()
            except OSError:
                return  # closed
            transport = paramiko.Transport(connection)
            transport.add_server_key(self.host_key)
            transport.start_server(server=_ExecServer(self))
            self._transports.append(transport)

    def execute(self, channel: paramiko.Channel, command: str) -> None:
        process = subprocess.Popen(
            [*self.prefix, "/bin/sh", "-c", command],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self.env,
            start_new_session=True,
        )
        self._processes.append(process)
        threading.Thread(target=self._feed, args=(channel, process.stdin), daemon=True).start()
        pumps = [
            threading.Thread(target=self._pump, args=(process.stdout, channel.sendall)),
            threading.Thread(target=self._pump, args=(process.stderr, channel.sendall_stderr)),
        ]
        for pump in pumps:
            pump.start()
        for pump in pumps:
            pump.join()
        code = process.wait()
        if code < 0:  # killed by a signal: SSH's status is unsigned, so say it as a shell does
            code = 128 - code
        try:
            channel.send_exit_status(code)
            channel.close()
        except (EOFError, OSError):
            pass  # the client hung up first (it had read the exit status or gave up)

    @staticmethod
    def _feed(channel: paramiko.Channel, stdin) -> None:
        """The channel's data to the command's stdin, closed at the client's EOF as sshd does."""
        try:
            for chunk in iter(lambda: channel.recv(65536), b""):
                stdin.write(chunk)
                stdin.flush()
        except OSError:
            pass  # the command exited without reading all of it
        finally:
            try:
                stdin.close()
            except OSError:
                pass

    @staticmethod
    def _pump(stream, send) -> None:
        for chunk in iter(lambda: stream.read1(65536), b""):
            try:
                send(chunk)
            except OSError:
                return

    def known_hosts_line(self) -> str:
        return (
            f"[{self.address}]:{self.port} {self.host_key.get_name()} {self.host_key.get_base64()}"
        )

    def power_off(self) -> None:
        """SIGKILL everything this host runs, as a machine that loses power: every process the
        commands started, with their children in other sessions (torchrun's workers)."""
        signal_each(self._process_tree(), signal.SIGKILL)
        for process in self._processes:
            process.wait()

    def freeze(self) -> None:
        """SIGSTOP everything this host runs, as a machine that drops off the network: its
        processes stop answering, yet none of their connections closes."""
        signal_each(self._process_tree(), signal.SIGSTOP)

    def _process_tree(self) -> list[int]:
        """The running commands and every process below them."""
        found, pending = [], [p.pid for p in self._processes if p.poll() is None]
        while pending:
            pid = pending.pop()
            found.append(pid)
            pending.extend(children(pid))
        return found

    def close(self) -> None:
        self._socket.close()
        self.power_off()
        for transport in self._transports:
            transport.close()


def write_known_hosts(path: Path, servers: list[LoopbackSshd]) -> Path:
    path.write_text("".join(s.known_hosts_line() + "\n" for s in servers))
    return path
