"""The trainer image definition: lints clean and stays on the pinned torch version."""

import re
from pathlib import Path

from tests.plugin import ROOT, hadolint

DOCKERFILE = ROOT / "trainer" / "Dockerfile"


def test_dockerfile_passes_hadolint():
    assert hadolint(DOCKERFILE) == ""


def test_base_image_torch_matches_the_trainer_pin():
    pin = re.search(r"^torch==(\S+)$", (ROOT / "trainer/requirements.txt").read_text(), re.M).group(
        1
    )
    base = re.search(
        r"^ARG BASE_IMAGE=pytorch/pytorch:([^-\s]+)-cuda", DOCKERFILE.read_text(), re.M
    ).group(1)
    assert base == pin


def test_nccl_tests_are_built_with_the_base_images_cuda_release():
    """all_reduce_perf is compiled by the CUDA devel image's nvcc and runs on the base image's
    CUDA: the two releases (major.minor) must be the same."""
    text = DOCKERFILE.read_text()
    base = re.search(r"^ARG BASE_IMAGE=pytorch/pytorch:[^-\s]+-cuda(\d+\.\d+)-", text, re.M)
    devel = re.search(r"^ARG CUDA_DEVEL_IMAGE=\S+/cuda:(\d+\.\d+)\.\d+-devel-ubuntu", text, re.M)
    assert base and devel and base.group(1) == devel.group(1)
    assert re.search(r"^ARG NCCL_TESTS_COMMIT=[0-9a-f]{40}$", text, re.M)


def test_image_runs_as_a_non_root_user():
    users = re.findall(r"^USER\s+(\S+)", DOCKERFILE.read_text(), re.M)
    assert users and users[-1] not in {"0", "root"}


def stages(dockerfile: Path = DOCKERFILE) -> dict[str, tuple[str, list[str]]]:
    """name -> (parent, instructions), continuation lines joined, comments dropped."""
    text = re.sub(
        r"\\\n",
        " ",
        "\n".join(
            line
            for line in dockerfile.read_text().splitlines()
            if not line.lstrip().startswith("#")
        ),
    )
    found: dict[str, tuple[str, list[str]]] = {}
    current: list[str] = []
    for line in filter(None, (raw.strip() for raw in text.splitlines())):
        start = re.fullmatch(r"FROM (\S+) AS (\S+)", line)
        if start:
            current = []
            found[start.group(2)] = (start.group(1), current)
        elif found:
            current.append(" ".join(line.split()))
    return found


def layers(target: str) -> list[str]:
    """The instructions that add a layer to `target`'s image, oldest first, through its parents."""
    chain = stages()
    own: list[str] = []
    while target in chain:
        parent, instructions = chain[target]
        own = [i for i in instructions if i.split()[0] in ("RUN", "COPY", "ADD")] + own
        target = parent
    return own


def test_code_is_the_last_layer_of_both_targets_and_efa_libraries_sit_below_it():
    """A code change must not invalidate, rebuild or re-pull the large layers: the build context
    is copied only in the `code` stage, which no target builds on, and both targets end with the
    same copies from it."""
    runtime, efa = layers("runtime"), layers("efa")
    tail = [layer for layer in runtime if "--from=code" in layer]
    assert len(tail) == 2 and runtime[-2:] == tail and efa[-2:] == tail
    for target in (runtime, efa):
        context_copies = [
            layer for layer in target if layer.startswith("COPY") and "--from" not in layer
        ]
        assert context_copies == ["COPY requirements.txt trainer/requirements.txt"]
    installer = [i for i, layer in enumerate(efa) if "efa_installer.sh" in layer]
    assert installer and installer[0] < len(efa) - 2
    assert runtime[:-2] == efa[: len(runtime) - 2]  # the shared base comes first in both
