"""The folders are layers: each imports only the layers below it, and each image's build context
imports only itself, so a reader sees the structure from the folder names and an image never
ships code that needs what it does not contain."""

import ast
from pathlib import Path

import pytest

from infra.images.container_image import context_files
from tests.conftest import ROOT

# Bottom to top. A folder may import the folders of lower layers, never one of its own layer or
# above: trainer, mesh and gpuwatch are tools of their own; infra is the platform's building
# blocks; workloads (training jobs and the trainer image) build on it, and devservers (whose
# default image is the trainer's) on both; policies judge plans of the program; deploy composes
# everything (the Pulumi program, plan, preflight), and nothing imports it.
LAYERS = [
    {"trainer", "mesh", "gpuwatch"},
    {"infra"},
    {"workloads"},
    {"devservers"},
    {"policies"},
    {"deploy"},
]
PACKAGES = set().union(*LAYERS)
# Images built from one folder each: what their code imports must be in that folder.
IMAGES = ["trainer", "devservers", "gpuwatch"]


def imported_packages(path: Path) -> set[str]:
    """The project's top-level packages `path` imports, at module level or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found |= {name.split(".")[0] for name in names} & PACKAGES
    return found


def layer_of(package: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if package in layer)


def test_every_package_of_the_project_has_a_layer():
    top_level = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests"}
    assert top_level == PACKAGES


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_a_folder_imports_only_the_layers_below_it(package):
    wrong = {
        f"{path.relative_to(ROOT)} imports {imported}"
        for path in (ROOT / package).rglob("*.py")
        for imported in imported_packages(path)
        if imported != package and layer_of(imported) >= layer_of(package)
    }
    assert not wrong, sorted(wrong)


@pytest.mark.parametrize("folder", IMAGES)
def test_an_images_code_imports_only_its_own_folder(folder):
    code = [p for p in context_files(ROOT / folder) if p.suffix == ".py"]
    assert code
    wrong = {
        f"{path.relative_to(ROOT)} imports {imported}"
        for path in code
        for imported in imported_packages(path) - {folder}
    }
    assert not wrong, sorted(wrong)


def test_the_layer_check_sees_an_upward_import(tmp_path):
    module = tmp_path / "module.py"
    module.write_text("def f():\n    from deploy.program import build_platform\n")
    assert imported_packages(module) == {"deploy"}
