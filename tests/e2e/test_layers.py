"""The folders are layers: each imports only the layers below it, and each image's build context
imports only itself, so a reader sees the structure from the folder names and an image never
ships code that needs what it does not contain."""

import ast
import os
import re
from pathlib import Path

import pytest

from infra.images.container_image import context_files
from tests.plugin import ROOT

# Bottom to top. A folder may import the folders of lower layers, never one of its own layer or
# above: trainer, mesh, gpuwatch and usagerecorder are tools of their own; infra is the platform's
# building blocks; workloads (training jobs and the trainer image) build on it, and devservers
# (whose default image is the trainer's) on both; policies judge plans of the program; deploy
# composes everything (the Pulumi program, plan, preflight), and nothing imports it.
LAYERS = [
    {"trainer", "mesh", "gpuwatch", "usagerecorder"},
    {"infra"},
    {"workloads"},
    {"devservers"},
    {"policies"},
    {"deploy"},
]
PACKAGES = set().union(*LAYERS)
# Images built from one folder each: what their code imports must be in that folder.
IMAGES = ["trainer", "devservers", "gpuwatch", "usagerecorder"]


def imported_modules(path: Path) -> set[str]:
    """Dotted names `path` imports, at any level (functions and TYPE_CHECKING blocks included):
    a `from a.b import c` counts as a.b and, where c is a module, a.b.c."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def imported_packages(path: Path) -> set[str]:
    """The project's top-level packages `path` imports, at module level or inside functions."""
    return {name.split(".")[0] for name in imported_modules(path)} & PACKAGES


def source_files(folder: Path) -> list[Path]:
    """The modules of a folder but its tests' (which may use anything to test it)."""
    return [p for p in folder.rglob("*.py") if "tests" not in p.relative_to(folder).parts]


def layer_of(package: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if package in layer)


def test_every_package_of_the_project_has_a_layer():
    top_level = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert top_level == PACKAGES


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_a_folder_imports_only_the_layers_below_it(package):
    wrong = {
        f"{path.relative_to(ROOT)} imports {imported}"
        for path in source_files(ROOT / package)
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


# Inside infra: one package per integration (docs/design/architecture.md). Each names in INPUTS
# the packages of infra it may import besides itself; infra/integrations.py, the one list of
# them, may import any.
INFRA = ROOT / "infra"
INFRA_PACKAGES = sorted(p.parent.name for p in INFRA.glob("*/__init__.py"))


def declared_inputs(package: str) -> tuple[str, ...]:
    """The INPUTS tuple of infra/<package>/__init__.py, read without importing it."""
    tree = ast.parse((INFRA / package / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "INPUTS":
            return tuple(ast.literal_eval(node.value))
    raise AssertionError(f"infra/{package}/__init__.py names no INPUTS")


def test_every_package_of_infra_names_its_inputs_and_the_core_none():
    assert "core" in INFRA_PACKAGES
    assert declared_inputs("core") == ()
    for package in INFRA_PACKAGES:
        inputs = declared_inputs(package)
        assert set(inputs) <= set(INFRA_PACKAGES) - {package}, (package, inputs)


@pytest.mark.parametrize("package", INFRA_PACKAGES)
def test_an_integration_imports_the_core_and_its_inputs_alone(package):
    allowed = {package, *declared_inputs(package)}
    wrong = {
        f"{path.relative_to(ROOT)} imports infra.{name.split('.')[1]}"
        for path in source_files(INFRA / package)
        for name in imported_modules(path)
        if name.startswith("infra.") and name.split(".")[1] not in allowed
    }
    assert not wrong, sorted(wrong)


def test_the_inputs_of_the_integrations_make_no_circle():
    inputs = {package: set(declared_inputs(package)) for package in INFRA_PACKAGES}
    done: set[str] = set()

    def visit(package: str, path: tuple[str, ...]) -> None:
        assert package not in path, " -> ".join((*path, package))
        if package not in done:
            for needed in inputs[package]:
                visit(needed, (*path, package))
            done.add(package)

    for package in INFRA_PACKAGES:
        visit(package, ())


def project_modules() -> dict[str, Path]:
    """Every module of the project's packages but their tests, by dotted name."""
    modules = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if "tests" not in parts:
                name = ".".join(parts).removesuffix(".__init__")
                modules[name] = path
    return modules


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def connect(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in graph[module]:
            if other not in index:
                connect(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while not component or component[-1] != module:
                component.append(stack.pop())
            if len(component) > 1:
                circles.append(sorted(component))

    for module in graph:
        if module not in index:
            connect(module)
    return circles


def test_no_modules_import_each_other_round_a_circle():
    modules = project_modules()
    graph = {
        name: {m for m in imported_modules(path) if m in modules and m != name}
        for name, path in modules.items()
    }
    assert import_circles(graph) == []


def test_the_circle_check_sees_a_circle():
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_a_component_takes_its_own_section_never_the_whole_stack_config():
    """Every ComponentResource's constructor: no parameter is the StackConfig."""
    wrong = []
    for path in project_modules().values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                "ComponentResource" in ast.unparse(base) for base in node.bases
            ):
                init = next(
                    (
                        f
                        for f in node.body
                        if isinstance(f, ast.FunctionDef) and f.name == "__init__"
                    ),
                    None,
                )
                params = init.args.args + init.args.kwonlyargs if init else []
                wrong += [
                    f"{path.relative_to(ROOT)} {node.name}({p.arg})"
                    for p in params
                    if p.annotation is not None and "StackConfig" in ast.unparse(p.annotation)
                ]
    assert not wrong, wrong


# What reads a whole stack file, and the one module besides the commands that may: devctl's
# defaults for `create --dry-run` and `submit` (devservers/stack_defaults.py).
STACK_FILE_READERS = {"load_stack_file", "load_stack_for_command", "read_stack_file"}
COMMAND_HELPERS = {"infra.stack.loading", "devservers.stack_defaults"}


def test_whole_stack_files_are_read_by_commands_alone():
    wrong = []
    for name, path in project_modules().items():
        tree = ast.parse(path.read_text())
        reads = {
            node.func.id
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in STACK_FILE_READERS
        }
        command = any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body)
        if reads and not command and name not in COMMAND_HELPERS:
            wrong.append(f"{name} calls {', '.join(sorted(reads))}")
    assert not wrong, wrong


def test_the_import_check_sees_imports_for_typing_and_inside_functions(tmp_path):
    module = tmp_path / "module.py"
    module.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from infra.eks import facts\n"
        "def f():\n    import infra.vpc.network\n"
    )
    assert {"infra.eks", "infra.eks.facts", "infra.vpc.network"} <= imported_modules(module)


# A Karpenter or Kueue release touches its package, the pins and their release entries, the test
# data (the CRDs of the new version, tests/crds), and the docs pages that describe the pinned
# behaviour; code elsewhere names the pin (KARPENTER_CHART, KUEUE_CHART), so that `grep` finds what
# to re-read. Files in an image say which release they were written against: an edit there rebuilds
# the image.
BUMPS = {
    "karpenter": ("KARPENTER_CHART", {"gpuwatch/watcher.py"}),
    "kueue": (
        "KUEUE_CHART",
        {"trainer/cluster_copy.py", "devservers/job_status.py", "usagerecorder/recorder.py"},
    ),
}


# What a checkout holds besides the project: tools' caches and what builds leave.
NOT_THE_PROJECT = {"build", "node_modules", "__pycache__"}


def project_files() -> list[str]:
    """The project's files, relative to it (a checkout or a copy of one: no git needed); the
    folders of tools' caches and builds are not walked."""
    found = []
    for folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = [
            s
            for s in subfolders
            if s not in NOT_THE_PROJECT
            and not s.endswith(".egg-info")
            and (not s.startswith(".") or s in (".github", ".ci"))
        ]
        found += [str((Path(folder) / name).relative_to(ROOT)) for name in files]
    return found


@pytest.mark.parametrize("integration", sorted(BUMPS))
def test_a_version_bump_touches_its_package_the_pins_the_test_data_and_the_docs(integration):
    from infra.core import versions

    pin, in_images = BUMPS[integration]
    version = getattr(versions, pin).version
    naming = {
        name
        for name in project_files()
        if re.search(
            rf"(?<![\d.]){re.escape(version)}(?![\d])", (ROOT / name).read_text("utf-8", "replace")
        )
    }
    allowed_prefixes = (
        f"infra/{integration}/",
        "infra/core/versions.py",
        "infra/core/releases.py",  # the pins' release dates and what moving to each does
        "tests/crds/",
        "docs/",
    )
    assert {n for n in naming if not n.startswith(allowed_prefixes)} == in_images
