"""A stack's policy pack config for a real preview, from its stack file.

    .venv/bin/python -m policies.pack_config --stack dev --out policies/policy-config.dev.json
    pulumi preview --stack dev --policy-pack policies \
        --policy-pack-config policies/policy-config.dev.json

Offline, `make plan` hands every rule the stack file's `policy` section and its `aws:region`. In a
real preview the engine hands each rule only the keys of its own config schema, from the file
given to --policy-pack-config (Pulumi's format: the rule's name, then its keys). This writes that
file from the same settings, so the two runs judge alike. `policies/policy-config.<stack>.json`
is this command's output for each stack file in the repository (a test keeps them equal).
"""

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from infra.stack.config import StackConfig
from infra.stack.loading import load_stack_for_command
from policies.rules import POLICIES


def policy_settings(config: StackConfig) -> dict[str, Any]:
    """What the rules read (policies.rules.base.config_of): the `policy` section, the region
    (the cost rule's prices) and the data holders acknowledgeDataLoss releases."""
    return {
        **config.policy.model_dump(by_alias=True),
        "region": config.region,
        "acknowledgedDataLoss": sorted(config.released),
    }


def pack_config(config: StackConfig) -> dict[str, dict[str, Any]]:
    """{rule: {key: value}} for every rule with a config schema: the keys it declares."""
    settings = policy_settings(config)
    return {
        policy.name: {key: settings[key] for key in policy.config_schema.properties}
        for policy in POLICIES
        if policy.config_schema
    }


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m policies.pack_config", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--stack", required=True, help="stack name: reads Pulumi.<stack>.yaml")
    parser.add_argument(
        "--out", type=Path, help="write the JSON here (default: print it on standard output)"
    )
    return parser


def render(config: StackConfig) -> str:
    return json.dumps(pack_config(config), indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    config = load_stack_for_command(args.stack)
    if config is None:
        return 2
    if args.out:
        args.out.write_text(render(config))
    else:
        sys.stdout.write(render(config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
