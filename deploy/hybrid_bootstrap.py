"""Print a hybrid machine's one-page bootstrap (or its WireGuard config) from the deployed stack.

  .venv/bin/python -m deploy.hybrid_bootstrap --stack dev alice-4090 > bootstrap.sh
  sudo bash bootstrap.sh      # on the machine

The pages are secret stack outputs (`hybridBootstrap`, `hybridPeerConfigs`) written by
infra/hybrid/nodes.py; this reads them with the Pulumi CLI.
"""

import argparse
import json
import subprocess
import sys

from infra.core.paths import PROJECT_DIR

OUTPUTS = {"bootstrap": "hybridBootstrap", "wireguard": "hybridPeerConfigs"}


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m deploy.hybrid_bootstrap",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("machine", help="a name from hybrid.machines in the stack config")
    parser.add_argument(
        "--stack", required=True, help="the deployed stack (pulumi stack output --stack)"
    )
    parser.add_argument(
        "--what",
        choices=sorted(OUTPUTS),
        default="bootstrap",
        help="the whole bootstrap page, or only the machine's WireGuard config "
        "(default: %(default)s)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    command = ["pulumi", "stack", "output", OUTPUTS[args.what], "--show-secrets", "--json"]
    try:
        result = subprocess.run(
            [*command, "--stack", args.stack],
            cwd=PROJECT_DIR,
            capture_output=True,
            text=True,
            check=False,
        )
    except FileNotFoundError:
        print("needs the Pulumi CLI (pulumi) on PATH and a deployed stack", file=sys.stderr)
        return 2
    if result.returncode != 0:
        print(result.stderr.strip(), file=sys.stderr)
        return 2
    pages = json.loads(result.stdout or "null") or {}
    if args.machine not in pages:
        print(
            f"stack {args.stack} has no hybrid machine {args.machine!r}; allowed: "
            + (", ".join(sorted(pages)) or "none (no `hybrid` section deployed)"),
            file=sys.stderr,
        )
        return 2
    print(pages[args.machine], end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
