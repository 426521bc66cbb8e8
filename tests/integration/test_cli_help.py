"""Every command-line tool's --help describes each option: a help text, its choices, and what it
defaults to. The docs render the same parsers (docs/_ext/reference.py, `cli-options`)."""

import argparse
import importlib
import re

import pytest

from tests.plugin import ROOT

# Each tool's parser, by the command users type.
CLIS = {
    "python -m trainer": "trainer.options",
    "python -m trainer.launch": "trainer.launch",
    "python -m trainer.user_code": "trainer.user_code",
    "python -m trainer.data": "trainer.data",
    "python -m trainer.fetch": "trainer.fetch",
    "python -m trainer.sample": "trainer.sample",
    "python -m trainer.bench": "trainer.bench",
    "python -m deploy.plan": "deploy.plan",
    "python -m deploy.preflight": "deploy.preflight",
    "python -m deploy.hybrid_bootstrap": "deploy.hybrid_bootstrap",
    "python -m deploy.preview_gate": "deploy.preview_gate",
    "python -m deploy.roll": "deploy.roll",
    "python -m deploy.released_homes": "deploy.released_homes",
    "python -m deploy.versions": "deploy.versions",
    "python -m workloads.local": "workloads.local",
    "python -m workloads.nccl_check": "workloads.nccl_check",
    "python -m infra.core.catalog.refresh": "infra.core.catalog.refresh",
    "python -m policies.pack_config": "policies.pack_config",
    "python -m devservers.demo": "devservers.demo",
    "python -m gpuwatch.watcher": "gpuwatch.watcher",
    "python -m usagerecorder.recorder": "usagerecorder.recorder",
    "devctl": "devservers.cli",
    "tp-mesh": "mesh.cli",
}


def test_every_tool_that_parses_arguments_is_listed():
    """A module that builds an ArgumentParser (or a parser of its own kind) is a tool; it needs a
    parser() here. Build folders (`pip install ./devservers` leaves devservers/build), the tests
    (and the stand-ins they run) and the examples' users' scripts are no tools."""
    building = {
        ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for path in ROOT.glob("*/**/*.py")
        if path.parts[len(ROOT.parts)] not in {"tests", "docs", ".venv", "examples"}
        and not {"build", "tests"} & set(path.relative_to(ROOT).parts)
        and re.search(r"ArgumentParser\(|\(argparse\.ArgumentParser\)", path.read_text())
    }
    assert building == set(CLIS.values())


def test_every_tool_has_its_options_in_the_docs():
    """Each tool's options are on some page, generated from its parser (`{cli-options}`)."""
    shown = {
        m.group(1).partition(":")[0]
        for page in (ROOT / "docs").rglob("*.md")
        for m in re.finditer(r"^\s*```\{cli-options\} (\S+)", page.read_text(), re.MULTILINE)
    }
    assert sorted(set(CLIS.values()) - shown) == []


def test_the_launcher_has_its_own_help_and_passes_the_rest_to_torchrun(capsys):
    """`python -m trainer.launch --help` says what the launcher adds (torchrun's own help starts
    `usage: run.py`); a --help after `-m trainer` is the trainer's, for torchrun to pass on."""
    from trainer import launch

    assert launch.main(["--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: python -m trainer.launch [torchrun's")
    assert launch.asks_for_help(["--nproc-per-node", "2", "-h", "-m", "trainer"])
    assert not launch.asks_for_help(["--nproc-per-node", "2", "-m", "trainer", "--help"])


def parsers(parser: argparse.ArgumentParser, prog: str):
    """(prog, parser) of the tool and of each of its subcommands."""
    yield prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                assert helps.get(name), f"{prog} {name}: no help"
                yield from parsers(sub, f"{prog} {name}")


def problems(prog: str, parser: argparse.ArgumentParser) -> list[str]:
    found = []
    formatter = parser._get_formatter()
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        name = f"{prog} {'/'.join(action.option_strings) or action.dest}"
        text = formatter._expand_help(action) if action.help else ""
        if not text or action.help == argparse.SUPPRESS:
            found.append(f"{name}: no help")
            continue
        if action.choices and action.metavar is not None:
            missing = [c for c in action.choices if str(c) not in text]
            if missing:
                found.append(f"{name}: its help does not name the choices {missing}")
        if not action.option_strings or action.required:
            continue
        if "default" not in text:
            found.append(f"{name}: its help does not say what it defaults to")
        default = action.default
        # A default with nothing printable ("", a newline) is named in words.
        if default not in (None, False, [], argparse.SUPPRESS) and str(default).strip():
            shown = {str(default), format(default, "g") if isinstance(default, float) else ""}
            if not any(s and s in text for s in shown):
                found.append(f"{name}: its help does not name its default {default!r}")
    return found


@pytest.mark.parametrize("command", sorted(CLIS))
def test_each_option_has_help_choices_and_its_default(command, monkeypatch):
    monkeypatch.delenv("DEVCTL_IMAGE", raising=False)
    tool = importlib.import_module(CLIS[command]).parser()
    found = [p for prog, sub in parsers(tool, command) for p in problems(prog, sub)]
    assert found == []


def test_a_missing_default_fails_the_check():
    """The check itself: an option without its default, or without help, is named."""
    bad = argparse.ArgumentParser(prog="bad")
    bad.add_argument("--steps", type=int, default=20, help="how many steps")
    bad.add_argument("--quiet", action="store_true")
    bad.add_argument("--mode", choices=["a", "b"], metavar="MODE", help="the mode (default: a)")
    assert problems("bad", bad) == [
        "bad --steps: its help does not say what it defaults to",
        "bad --steps: its help does not name its default 20",
        "bad --quiet: no help",
        "bad --mode: its help does not name the choices ['b']",
    ]


@pytest.mark.parametrize("command", sorted(CLIS))
def test_help_names_no_path_of_the_machine_it_runs_on(command):
    """Defaults resolved at run time (this checkout, $HOME, an environment variable) would show
    the docs builder's machine in the rendered docs."""
    text = importlib.import_module(CLIS[command]).parser().format_help()
    assert str(ROOT) not in text and not re.search(r"/home/|/root/|/tmp/", text)
