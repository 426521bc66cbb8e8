"""The trainer image definition: lints clean and stays on the pinned torch version."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "trainer" / "Dockerfile"


def test_dockerfile_passes_hadolint():
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    result = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_base_image_torch_matches_the_trainer_pin():
    pin = re.search(r"^torch==(\S+)$", (ROOT / "trainer/requirements.txt").read_text(), re.M).group(
        1
    )
    base = re.search(
        r"^ARG BASE_IMAGE=pytorch/pytorch:([^-\s]+)-cuda", DOCKERFILE.read_text(), re.M
    ).group(1)
    assert base == pin


def test_image_runs_as_a_non_root_user():
    users = re.findall(r"^USER\s+(\S+)", DOCKERFILE.read_text(), re.M)
    assert users and users[-1] not in {"0", "root"}
