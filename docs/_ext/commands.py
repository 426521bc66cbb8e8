"""Shell examples that say where they run, and whose output a test checks.

    ```{command} offline
    :excerpt:
    $ .venv/bin/python -m deploy.plan --stack dev
    Stack dev (us-west-2): 184 resources
    ...
    ```

The argument is where the commands can run (KINDS); the page shows it as the block's caption. Lines
starting with `$ ` are commands (a trailing backslash continues one on the next line), the lines
after each are its output. tests/e2e/test_docs_examples.py runs every `offline` block in a copy of
the checkout, in a fresh shell, and compares what each command prints (standard output and error
together) with the lines shown: all of them, or with `:excerpt:`, in order, where a line `...`
stands for any number of lines and a line ending in ` ...` for any line starting with what comes
before. `:exit: N` is the last command's exit status (default 0; every other command's is 0).
`:continue:` runs the block in the checkout the page's previous offline block left, after it.
`:why:` adds a sentence to the caption. No other shell block may appear in the docs, and no plain
text block right after a {command} block: what a command prints goes inside its block.
"""

import re
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.directives.code import container_wrapper
from sphinx.util.docutils import SphinxDirective

CHECKER = "tests/e2e/test_docs_examples.py"
KINDS = {
    "offline": f"Runs offline, on any machine with the checkout; {CHECKER} checks this output.",
    "offline-long": "Runs offline, but takes minutes: the docs test does not run it.",
    "in-the-suite": "Runs offline; `make test` runs it (or the tests it names), so the docs test "
    "checks what it names rather than running it twice.",
    "installs": "Installs pinned packages from PyPI: the docs test does not run it.",
    "needs-aws": "Needs AWS: credentials, and a deployed stack where it reads one; it may bill.",
    "needs-cluster": "Needs the deployed cluster: a kubeconfig (aws eks update-kubeconfig).",
    "needs-docker": "Needs Docker with buildx (the docs test has none).",
    "on-your-machines": "Runs on your own machines outside AWS (some steps as root).",
}
# Languages of fenced blocks that are shell sessions, which only {command} may show.
SHELL = {"sh", "bash", "shell", "console", "zsh", "shell-session"}


@dataclass
class Command:
    line: str
    shown: list[str] = field(default_factory=list)


@dataclass
class Block:
    path: Path
    lineno: int
    kind: str
    options: dict[str, str]
    commands: list[Command]

    @property
    def excerpt(self) -> bool:
        return "excerpt" in self.options

    @property
    def exit(self) -> int:
        return int(self.options.get("exit", "0"))

    @property
    def continues(self) -> bool:
        return "continue" in self.options

    def __str__(self) -> str:
        return f"{self.path}:{self.lineno}"


def parse_content(lines: list[str]) -> tuple[dict[str, str], list[Command]]:
    """(options, commands) of a block's body."""
    options: dict[str, str] = {}
    while lines and (m := re.match(r"^:([a-z-]+):\s*(.*)$", lines[0])):
        options[m.group(1)] = m.group(2).strip()
        lines = lines[1:]
    commands: list[Command] = []
    continuing = False
    for line in lines:
        if continuing:
            commands[-1].line += "\n" + line
        elif line.startswith("$ "):
            commands.append(Command(line[2:]))
        elif commands:
            commands[-1].shown.append(line)
        elif line.strip():
            raise ValueError(f"output before any command: {line!r}")
        continuing = line.startswith("$ ") or continuing
        continuing = continuing and line.endswith("\\")
    for command in commands:
        while command.shown and not command.shown[-1].strip():
            command.shown.pop()
    return options, commands


@dataclass
class Fence:
    lineno: int  # of the opening line, from 1
    info: str  # what follows the opening backticks: a language, or {directive} and its argument
    body: list[str]  # the lines inside, less the fence's indentation


FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")


def fences(text: str) -> list[Fence]:
    """Every fenced block of a Markdown (MyST) file, indented ones (in a list item) included."""
    found, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence = m.group("indent"), m.group("fence")
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == fence), len(lines))
        body = [line.removeprefix(indent) for line in lines[i + 1 : end]]
        found.append(Fence(i + 1, m.group("info").strip(), body))
        i = end + 1
    return found


def parse_blocks(path: Path, text: str) -> list[Block]:
    """Every {command} block of a Markdown (MyST) file."""
    blocks = []
    for fence in fences(text):
        directive, _, kind = fence.info.partition(" ")
        if directive == "{command}":
            options, commands = parse_content(fence.body)
            blocks.append(Block(path, fence.lineno, kind.strip(), options, commands))
    return blocks


def shell_fences(text: str) -> list[tuple[int, str]]:
    """(line, language) of each plain fenced block in a shell language."""
    return [(f.lineno, f.info) for f in fences(text) if f.info.lower() in SHELL]


# Languages of fenced blocks that show plain text, such as what a command printed.
PLAIN = {"", "text", "txt", "output", "plaintext", "none"}


def output_after_command(text: str) -> list[int]:
    """Lines of plain text blocks that come next after a {command} block: what a command prints
    belongs inside its block, where the docs test compares it (offline) or the caption says why
    it cannot (the other kinds)."""
    return [
        fence.lineno
        for before, fence in pairwise(fences(text))
        if before.info.startswith("{command}") and fence.info.lower() in PLAIN
    ]


def excerpt_pattern(shown: list[str]) -> re.Pattern:
    """A regular expression over output lines (each ending in a newline) for an excerpt."""
    parts = []
    for line in shown:
        if line.strip() == "...":
            parts.append(r"(?:[^\n]*\n)*?")
        elif line.endswith(" ..."):
            parts.append(re.escape(line[:-4]) + r"[^\n]*\n")
        else:
            parts.append(re.escape(line.rstrip()) + r"\n")
    return re.compile("".join(parts))


def matches(shown: list[str], printed: str, excerpt: bool) -> bool:
    lines = [line.rstrip() for line in printed.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    if not excerpt:
        return lines == [line.rstrip() for line in shown]
    return excerpt_pattern(shown).fullmatch("".join(f"{line}\n" for line in lines)) is not None


class CommandDirective(SphinxDirective):
    required_arguments = 1
    has_content = True
    option_spec = {
        "excerpt": directives.flag,
        "exit": directives.nonnegative_int,
        "continue": directives.flag,
        "why": directives.unchanged,
    }

    def run(self) -> list[nodes.Node]:
        kind = self.arguments[0]
        if kind not in KINDS:
            raise self.error(f"{{command}} {kind}: allowed: {', '.join(KINDS)}")
        text = "\n".join(self.content)
        literal = nodes.literal_block(text, text, language="console")
        # Output is not shell: highlight the prompts and let the rest be, without a warning.
        literal["force"] = True
        self.set_source_info(literal)
        caption = KINDS[kind] + (f" {self.options['why']}" if "why" in self.options else "")
        wrapper = container_wrapper(self, literal, caption)
        wrapper["classes"] += ["command", f"command-{kind}"]
        return [wrapper]


def setup(app):
    app.add_directive("command", CommandDirective)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
