"""The real-OpenSSH fixture itself (tests/openssh.py): what the MPI and DevServer tests rely on."""

import os
import sys
from pathlib import Path

from tests.openssh import TEST_USER, OpenSsh


def test_sessions_get_sshds_default_environment_and_close_leaves_nothing():
    with OpenSsh() as site:
        site.serve("a", "127.0.0.2")
        result = site.ssh("a", "env -0")
        assert result.returncode == 0, result.stderr
        env = dict(item.split("=", 1) for item in result.stdout.split("\0") if item)
        # sshd was started with this test's environment; its sessions do not get it.
        assert "PYTEST_CURRENT_TEST" in os.environ and "PYTEST_CURRENT_TEST" not in env
        assert str(Path(sys.executable).parent) not in env["PATH"].split(":")
        assert env["USER"] == site.account.name and env["HOME"] == str(site.account.home)
        assert env["SSH_CONNECTION"].split()[2:] == ["127.0.0.2", str(site.hosts["a"].port)]
        assert env["TMPDIR"] == str(site.dir / "sshd-a" / "tmp")  # a machine's own /tmp
        assert site.account.uid != 0 and (os.geteuid() != 0 or site.account.name == TEST_USER)
        sshd, directory = site.hosts["a"].process, site.dir
    assert sshd.poll() is not None and not directory.exists()


def test_a_host_key_other_than_the_known_one_is_refused():
    with OpenSsh() as site:
        a, b = site.serve("a", "127.0.0.2"), site.serve("b", "127.0.0.3")
        known = dict(line.split(" ", 1) for line in site.known_hosts.read_text().splitlines())
        # b's key where a's should be: a's own key is now the one ssh has not seen.
        site.known_hosts.write_text(
            f"[{a.address}]:{a.port} {known[f'[{b.address}]:{b.port}']}\n"
            f"[{b.address}]:{b.port} {known[f'[{b.address}]:{b.port}']}\n"
        )
        refused = site.ssh("a", "true")
        assert refused.returncode == 255 and "Host key verification failed" in refused.stderr
        assert site.ssh("b", "true").returncode == 0
