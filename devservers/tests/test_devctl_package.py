"""devctl installs alone (devservers/pyproject.toml): a wheel of the devservers package and
tp-mesh's packer whose dependency closure has no torch, Pulumi or AWS SDK, and whose commands
import nothing beyond it."""

import importlib.metadata
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement

from tests.plugin import ROOT

DEVCTL_REQUIREMENTS = ROOT / "devservers/devctl-requirements.txt"
# What installing the whole project brings and devctl must not: most of its 2.1 GB.
HEAVY = re.compile(r"^(torch|triton|nvidia-.*|pulumi.*|boto3|botocore|s3transfer|kopf|paramiko)$")


def pins(path: Path) -> dict[str, str]:
    """{normalized name: version} of a requirements file's `name==version` lines."""
    found = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            requirement = Requirement(line)
            found[canonical(requirement.name)] = str(requirement.specifier).removeprefix("==")
    return found


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_package_pinned_twice_has_one_version():
    files = [
        *ROOT.glob("requirements/*.txt"),
        *ROOT.glob("*/requirements.txt"),
        DEVCTL_REQUIREMENTS,
    ]
    versions: dict[str, set[str]] = {}
    for path in files:
        for name, version in pins(path).items():
            versions.setdefault(name, set()).add(version)
    assert {n: v for n, v in versions.items() if len(v) > 1} == {}


def closure(names: set[str]) -> set[str]:
    """Every distribution `names` need, from the installed metadata (markers evaluated)."""
    environment = default_environment()
    seen, todo = set(), [canonical(n) for n in names]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for line in importlib.metadata.requires(name) or []:
            requirement = Requirement(line)
            if requirement.marker and not requirement.marker.evaluate({**environment, "extra": ""}):
                continue
            todo.append(canonical(requirement.name))
    return seen


def test_devctls_dependency_closure_has_no_torch_pulumi_or_aws_sdk():
    needed = closure(set(pins(DEVCTL_REQUIREMENTS)))
    assert {"kubernetes", "cryptography", "pydantic", "pyyaml"} <= needed
    assert sorted(n for n in needed if HEAVY.match(n)) == []
    # The check itself: the whole project's closure has them.
    assert {"torch", "pulumi", "boto3"} <= closure({"training-platform"})


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel pip builds from a copy of devservers/ beside mesh/, as from a checkout."""
    tmp = tmp_path_factory.mktemp("devctl")
    for folder in ("devservers", "mesh"):
        shutil.copytree(
            ROOT / folder, tmp / "src" / folder, ignore=shutil.ignore_patterns("__pycache__")
        )
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "--disable-pip-version-check", "-q", "-w", str(tmp / "dist"), str(tmp / "src/devservers")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (built,) = (tmp / "dist").glob("devctl-*.whl")
    return built


def test_the_wheel_holds_devctl_its_crds_and_the_packer_and_pins_its_requirements(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(info).decode()
        entry_points = archive.read(info.replace("METADATA", "entry_points.txt")).decode()
    for module in ("cli", "kube", "run", "ssh", "controller", "render", "activity", "api"):
        assert f"devservers/{module}.py" in names
    assert {"mesh/workdir.py", "mesh/spec.py"} <= names
    assert sum(n.startswith("devservers/crds/") and n.endswith(".yaml") for n in names) == 2
    assert not any(n.endswith(("pyproject.toml", "Dockerfile")) for n in names)
    assert "devctl = devservers.cli:main" in entry_points
    required = re.findall(r"^Requires-Dist: (\S+)$", metadata, re.M)
    assert sorted(required) == sorted(f"{n}=={v}" for n, v in pins(DEVCTL_REQUIREMENTS).items())


# Run with only the standard library, the closure's distributions and the wheel's two packages
# importable: any other import (infra, pulumi, torch, ...) raises ModuleNotFoundError.
ISOLATED = """
import importlib.abc, importlib.metadata, sys
allowed = set(sys.stdlib_module_names) | {"devservers", "mesh", "_distutils_hack"}
wanted = set(sys.argv[1].split(","))
for module, dists in importlib.metadata.packages_distributions().items():
    if any(d.lower().replace("_", "-") in wanted for d in dists):
        allowed.add(module)
class Only(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top not in allowed and not top.startswith("_sysconfigdata"):
            raise ModuleNotFoundError(f"No module named {name!r} (not in devctl's closure)")
sys.meta_path.insert(0, Only())
sys.path.insert(0, sys.argv[2])
import devservers.cli, devservers.kube, devservers.run, devservers.ssh
sys.exit(devservers.cli.main(sys.argv[3:]))
"""


def devctl_alone(wheel: Path, tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    unpacked = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(unpacked)
    wanted = ",".join(closure(set(pins(DEVCTL_REQUIREMENTS))))
    return subprocess.run(
        [sys.executable, "-I", "-c", ISOLATED, wanted, str(unpacked), *argv],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "KUBECONFIG": str(tmp_path / "no")},
    )  # fmt: skip


def test_devctl_alone_imports_only_its_closure_and_answers(wheel, tmp_path):
    done = devctl_alone(wheel, tmp_path, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: devctl")
    done = devctl_alone(wheel, tmp_path, "list", "-n", "dev-alice")
    assert done.returncode == 1 and done.stderr == (
        f"devctl: no kubeconfig at {tmp_path / 'no'}: set KUBECONFIG, or run "
        "`aws eks update-kubeconfig`\n"
    )


def test_a_dry_run_of_devctl_alone_points_at_the_checkout(wheel, tmp_path):
    """--dry-run reads stack files with the platform's config code, which devctl alone lacks."""
    argv = [
        "create",
        "box",
        "--flavor",
        "gpu-1",
        "-n",
        "dev-alice",
        "--image",
        "r/i:1",
        "--dry-run",
    ]
    done = devctl_alone(wheel, tmp_path, *argv)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "run the checkout's .venv/bin/devctl (make venv)" in done.stderr
