"""Every shell example in the docs says where it runs, and every one that runs offline prints what
the docs show: run as written, in a fresh shell, in a copy of this checkout (docs/_ext/commands.py
has the block format)."""

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from infra.eks.support import PLAN_DAY_VARIABLE
from tests.plugin import ROOT

sys.path.insert(0, str(ROOT / "docs/_ext"))
from commands import (  # noqa: E402
    KINDS,
    Command,
    excerpt_pattern,
    fences,
    matches,
    output_after_command,
    parse_blocks,
    shell_fences,
)

PAGES = sorted(p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts)
BLOCKS = [b for page in PAGES for b in parse_blocks(page.relative_to(ROOT), page.read_text())]
OFFLINE = [b for b in BLOCKS if b.kind == "offline"]
IN_THE_SUITE = [b for b in BLOCKS if b.kind == "in-the-suite"]
# The README is plain Markdown on the forge: a shell block there follows a marker comment.
README_MARKER = re.compile(r"^<!-- command: ([a-z-]+)(?: .*)? -->$")


def test_every_shell_block_in_the_docs_says_where_it_runs():
    plain = [
        f"{page.relative_to(ROOT)}:{line}: a {language} block; use ```{{command}} <where>```"
        for page in PAGES
        for line, language in shell_fences(page.read_text())
    ]
    assert plain == []
    assert [f"{b}: {b.kind}" for b in BLOCKS if b.kind not in KINDS] == []
    assert [str(b) for b in BLOCKS if not b.commands] == []


def test_no_command_output_sits_outside_its_block():
    """A plain text block right after a {command} block shows what it prints, out of the docs
    test's sight: it goes inside the block, as its output."""
    outside = [
        f"{page.relative_to(ROOT)}:{line}: a plain block after a command block; put what the "
        "command prints inside that block"
        for page in PAGES
        for line in output_after_command(page.read_text())
    ]
    assert outside == []


def test_output_after_a_command_is_found():
    """The rule's own check: output after a command block, indented or not and whatever comes
    between, is found; a plain block after another kind of block is not."""
    text = "\n".join(
        [
            "```{command} offline-long",
            "$ make plan",
            "```",
            "## Reading it",
            "```text",
            "Cost ...",
            "```",
            "- a step:",
            "  ```{command} needs-cluster",
            "  $ kubectl get nodes",
            "  ```",
            "  ```",
            "  NAME STATUS",
            "  ```",
            "```yaml",
            "a: 1",
            "```",
            "```text",
            "a diagram",
            "```",
        ]
    )
    assert output_after_command(text) == [5, 12]


# Programs a fresh shell finds only by the path of the environment they are installed in.
INSTALLED = {"python", "python3", "pip", "pip3", "devctl", "torchrun", "tp-mesh", "tensorboard"}
# What the platform runs in its own pods (the jobs' launcher, the watcher's CronJob, what tp-mesh
# starts on each node), named as the image runs it: not for a user's shell.
IN_PODS = re.compile(r"^python3? -m (trainer\.launch|gpuwatch\.watcher|torch\.distributed\.run)\b")


def bare_programs(line: str) -> list[str]:
    """The programs of a command line named without a path; `python3 -m venv`, the system's
    Python making an environment, is fine."""
    found = []
    for piece in re.split(r"&&|\|\||;|\||\$\(", line):
        words = piece.split()
        while words and (words[0] == "sudo" or re.match(r"^[A-Za-z_]+=", words[0])):
            words = words[1:]
        if words and words[0] in INSTALLED and words[1:3] != ["-m", "venv"]:
            found.append(piece.strip())
    return found


def code_spans(text: str) -> list[tuple[int, str]]:
    """(line, text) of each inline code span outside the fenced blocks."""
    lines = text.splitlines()
    for fence in fences(text):
        for i in range(fence.lineno - 1, fence.lineno + len(fence.body) + 1):
            lines[i] = ""
    prose = "\n".join(lines)
    return [
        (prose.count("\n", 0, m.start()) + 1, " ".join(m.group(1).split()))
        for m in re.finditer(r"(?<!`)`([^`]+)`(?!`)", prose)
    ]


def test_commands_work_in_a_fresh_shell():
    """A fresh shell has no environment active: the docs name the checkout's programs by path
    (`.venv/bin/python -m ...`), in command blocks and in the prose's code spans alike. A block
    that puts a folder on PATH first may name them bare after it."""
    found = []
    for page in PAGES:
        for block in (b for b in BLOCKS if b.path == page.relative_to(ROOT)):
            on_path = False
            for command in block.commands:
                on_path = on_path or command.line.startswith("export PATH=")
                if not on_path:
                    found += [f"{block}: {bare}" for bare in bare_programs(command.line)]
        for line, span in code_spans(page.read_text()):
            if re.match(r"^(python3?|pip3?) ", span) and not IN_PODS.match(span):
                found.append(f"{page.relative_to(ROOT)}:{line}: `{span}`")
    assert found == []


def test_bare_programs_are_found():
    assert bare_programs("python -m deploy.plan --stack dev") == [
        "python -m deploy.plan --stack dev"
    ]
    assert bare_programs("OMP_NUM_THREADS=1 torchrun -m trainer | tee log") == [
        "OMP_NUM_THREADS=1 torchrun -m trainer"
    ]
    assert (
        bare_programs("python3 -m venv ~/.devctl && ~/.devctl/bin/pip install ./devservers") == []
    )
    assert bare_programs("IMAGE=$(devctl status) && .venv/bin/devctl list") == ["devctl status)"]
    assert code_spans("run `python -m x`\n```{command} offline\n$ `y`\n```\nand `z\nw`") == [
        (1, "python -m x"),
        (5, "z w"),
    ]


def test_what_make_test_runs_is_named_as_it_runs_it():
    """A block of the suite's own commands is not run twice: its pytest paths are files or
    folders of the suite's testpaths, and any other command is a line of the Makefile's recipes."""
    recipes = (ROOT / "Makefile").read_text().replace("$(PY)", ".venv/bin/python")
    testpaths = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"][
        "ini_options"
    ]["testpaths"]
    assert IN_THE_SUITE
    for block in IN_THE_SUITE:
        for command in block.commands:
            words = command.line.split()
            if words[:3] == [".venv/bin/python", "-m", "pytest"]:
                paths = [w for w in words[3:] if "/" in w or w.endswith(".py")]
                assert paths, command.line
                for path in paths:
                    assert (ROOT / path).exists() and path.split("/")[0] in testpaths, path
            else:
                assert command.line in recipes, command.line


def test_every_shell_block_in_the_readme_says_where_it_runs():
    lines = (ROOT / "README.md").read_text().splitlines()
    unmarked = [
        f"README.md:{line}"
        for line, _ in shell_fences("\n".join(lines))
        if not (m := README_MARKER.match(lines[line - 2] if line > 1 else ""))
        or m.group(1) not in KINDS
    ]
    assert unmarked == []


def test_the_docs_show_the_max_nodes_edit_and_what_it_changes():
    """The example of the one knob: its every line is checked, down to the cost total."""
    shown = [
        line
        for b in OFFLINE
        if any("maxNodes: 12" in c.line for c in b.commands)
        for c in b.commands
        for line in c.shown
    ]
    assert "  NodePool gpu-small limits.nvidia.com/gpu 16 -> 48" in shown
    assert any(line.startswith("  Cost ceiling $/hour ") for line in shown)


@pytest.mark.parametrize(
    "shown, printed, excerpt, ok",
    [
        (["a", "b"], "a\nb\n", False, True),
        (["a", "b"], "a\nc\n", False, False),
        (["a", "...", "d"], "a\nb\nc\nd\n", True, True),
        (["a", "...", "d"], "a\nb\nc\n", True, False),
        (["a", "x ..."], "a\nx and more\n", True, True),
        (["a", "x ..."], "a\ny\n", True, False),
        (["a  "], "a\n\n", False, True),
    ],
)
def test_the_comparison(shown, printed, excerpt, ok):
    assert matches(shown, printed, excerpt) is ok


def checkout_copy(into: Path) -> Path:
    """The files of this checkout (tracked or new, not ignored), with .venv the same venv."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file() and not source.is_symlink():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)
    (into / ".venv").symlink_to((ROOT / ".venv").resolve())
    return into


def as_run(command: Command) -> str:
    """The command as the test runs it: `make` never reinstalls .venv (-o: taken as up to date;
    the shared venv is not this copy's to rebuild)."""
    return re.sub(r"^make ", "make -o .venv/.installed ", command.line)


def scenarios(blocks) -> list[list]:
    """Offline blocks in the order they run: a `:continue:` block after the previous one of its
    page, in the same checkout."""
    found: list[list] = []
    for block in blocks:
        if block.continues:
            assert found and found[-1][-1].path == block.path, f"{block}: nothing to continue"
            found[-1].append(block)
        else:
            found.append([block])
    return found


def run_scenario(blocks, tmp_path: Path) -> list[tuple[int, str]]:
    """(exit status, what it printed) of every command of the blocks, in a fresh copy."""
    checkout = checkout_copy(tmp_path / "checkout")
    (tmp_path / "home").mkdir()
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(tmp_path / "home"),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        # This copy's code, for console scripts too (the editable install names another).
        "PYTHONPATH": str(checkout),
        # What a terminal shows: output and errors in the order they were written.
        "PYTHONUNBUFFERED": "1",
        # The suite's plan day (tests/plugin.py): the figures shown are that day's.
        PLAN_DAY_VARIABLE: os.environ[PLAN_DAY_VARIABLE],
    }
    results = []
    for command in (c for b in blocks for c in b.commands):
        done = subprocess.run(
            ["bash", "-c", as_run(command)], cwd=checkout, env=env, timeout=600,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        results.append((done.returncode, done.stdout))
    assert os.path.realpath(checkout / ".venv") == os.path.realpath(ROOT / ".venv")
    return results


SCENARIOS = scenarios(OFFLINE)


def command_lines(blocks) -> tuple[str, ...]:
    return tuple(c.line for b in blocks for c in b.commands)


def longest_run_with(key: tuple[str, ...]) -> list:
    """The longest scenario whose commands start with `key`'s: a page that shows the start of
    another's sequence (jobs shows quickstart's first command) is checked on the same run, since
    what a command prints does not depend on the commands after it."""
    return max(
        (s for s in SCENARIOS if command_lines(s)[: len(key)] == key),
        key=lambda s: len(command_lines(s)),
    )


# What a command sequence printed, for pages that show the same one or its start.
RUNS: dict[tuple[str, ...], list[tuple[int, str]]] = {}


@pytest.mark.parametrize("blocks", SCENARIOS, ids=lambda bs: "+".join(map(str, bs)))
def test_each_offline_example_prints_what_the_docs_show(blocks, tmp_path):
    run = longest_run_with(command_lines(blocks))
    if command_lines(run) not in RUNS:
        RUNS[command_lines(run)] = run_scenario(run, tmp_path)
    results = iter(RUNS[command_lines(run)])
    for block in blocks:
        for i, command in enumerate(block.commands):
            status, printed = next(results)
            expected = block.exit if i == len(block.commands) - 1 else 0
            assert status == expected, f"{block}: $ {command.line}\n{printed}"
            assert matches(command.shown, printed, block.excerpt), (
                f"{block}: $ {command.line} printed:\n{printed}\n"
                f"which does not match what the docs show"
                + (f" (excerpt: {excerpt_pattern(command.shown).pattern})" if block.excerpt else "")
                + ":\n" + "\n".join(command.shown)
            )  # fmt: skip
