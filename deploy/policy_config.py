"""The policy pack's configuration for a stack, from its stack file: what a real preview takes.

    .venv/bin/python -m deploy.policy_config --stack prod > policy-config.json
    pulumi preview --stack prod --policy-pack policies --policy-pack-config policy-config.json

The offline plan hands the rules the same configuration (deploy/plan.py).
"""

import argparse
import json
import sys
from pathlib import Path

from infra.config import ConfigError, StackConfig, load_stack_file
from infra.paths import PROJECT_DIR
from policies.rules import POLICIES


def policy_config(config: StackConfig) -> dict:
    """The rules' settings: the stack's `policy` section, its region (the cost rule's prices) and
    the data holders its acknowledgeDataLoss releases (data-holders-protected)."""
    return {
        **config.policy.model_dump(by_alias=True),
        "region": config.region,
        "acknowledgedDataLoss": sorted(config.released),
    }


def pack_config(config: StackConfig) -> dict:
    """policy_config() as `--policy-pack-config` takes it: every setting for every rule."""
    settings = policy_config(config)
    return {
        policy.name: {k: v for k, v in settings.items() if k in policy.config_schema.properties}
        for policy in POLICIES
        if policy.config_schema
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m deploy.policy_config", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--stack", required=True, help="stack name: reads Pulumi.<stack>.yaml")
    parser.add_argument(
        "--project-dir", type=Path, default=PROJECT_DIR, help="folder of the stack files"
    )
    args = parser.parse_args(argv)
    try:
        config = load_stack_file(args.stack, args.project_dir)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(pack_config(config), indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
