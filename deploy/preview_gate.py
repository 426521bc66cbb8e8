"""The pull-request gate over a real preview: what it would do to what exists, and the data it
would lose without the stack file's acknowledgement, by the same rule as the offline plan.

    pulumi preview --stack prod --json > preview.json
    .venv/bin/python -m deploy.preview_gate --stack prod preview.json

Needs a preview made with cloud credentials and the Pulumi CLI. Exits 1 when data would be lost
unacknowledged (or the engine reported errors, such as a protected resource it refuses to
delete), 2 when the stack config is invalid or the file is not a preview.
"""

import argparse
import json
import sys
from pathlib import Path

from deploy.day_two import consequences
from infra.core.config import ConfigError
from infra.core.paths import PROJECT_DIR
from infra.integrations import preview_steps
from infra.stack.loading import load_stack_file

# What a preview's JSON holds (pulumi/pulumi sdk/pkg/display/json.go PreviewDigest). The engine
# leaves empty ones out, never all three: every preview counts the stack's resources in
# changeSummary ("same" for those it leaves alone), and a failed one has its diagnostics.
PREVIEW_KEYS = {"steps", "changeSummary", "diagnostics"}


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m deploy.preview_gate", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--stack", required=True, help="stack name: reads Pulumi.<stack>.yaml")
    parser.add_argument("preview", type=Path, help="the output of `pulumi preview --json`")
    parser.add_argument(
        "--project-dir",
        type=Path,
        help="folder of the stack files (default: this checkout)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        config = load_stack_file(args.stack, args.project_dir or PROJECT_DIR)
        preview = json.loads(args.preview.read_text())
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (OSError, json.JSONDecodeError) as e:
        print(
            f"error: {args.preview} is not a `pulumi preview --json` output: {e}", file=sys.stderr
        )
        return 2
    if not isinstance(preview, dict) or not PREVIEW_KEYS & preview.keys():
        print(
            f"error: {args.preview} is not a `pulumi preview --json` output: it has none of "
            f"{', '.join(sorted(PREVIEW_KEYS))}",
            file=sys.stderr,
        )
        return 2
    if not isinstance(preview.get("steps", []), list):
        print(f"error: {args.preview} has no steps list", file=sys.stderr)
        return 2
    effects = consequences(preview_steps(preview), config, args.stack)
    errors = [
        d["message"].strip()
        for d in preview.get("diagnostics") or []
        if d.get("severity") == "error"
    ]
    print(f"What this change does to what exists ({args.stack}, from the real preview):")
    print("\n".join(effects.lines()))
    for refusal in effects.refusals:
        print(f"[mandatory] {refusal}")
    for error in errors:
        print(f"[engine] {error}")
    return 1 if effects.refusals or errors else 0


if __name__ == "__main__":
    sys.exit(main())
