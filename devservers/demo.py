"""Show a DevServer as the operator would render it for a stack (what `make demo` prints).

    python -m devservers.demo --stack dev [--out build/devservers/dev.yaml]

Takes the stack's first user and largest GPU flavor, builds a two-pod distributed server the way
`devctl create --distributed --dry-run` does (with the stack's trainer image), renders its
children with the operator's own functions, and says when the operator would stop it.
"""

import argparse
import sys
from pathlib import Path

import yaml

from devservers.api import QUEUE_LABEL, user_namespace
from devservers.cli import parse_args, server_manifest
from devservers.component import flavor_manifest
from devservers.controller import WARN_BEFORE, idle_rule
from devservers.render import Settings, children
from devservers.stack_defaults import StackDefaults, StackDefaultsError
from infra.stack.loading import load_stack_for_command

DEMO_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDemoKeyOnlyForTheOfflineDemo demo@example"


def summary(objects: list[dict]) -> list[str]:
    lines = []
    for o in objects:
        what = f"{o['kind']}/{o['metadata']['name']}"
        if o["kind"] == "StatefulSet":
            pod = o["spec"]["template"]["spec"]
            limits = pod["containers"][0]["resources"]["limits"]
            mounts = [m["mountPath"] for m in pod["containers"][0]["volumeMounts"]]
            what += (
                f": {o['spec']['replicas']} pods on {pod['nodeSelector']}, each {limits}; "
                f"mounts {', '.join(mounts)}; Kueue queue {o['metadata']['labels'][QUEUE_LABEL]}"
            )
        elif o["kind"] == "Service":
            kind = "headless" if o["spec"].get("clusterIP") == "None" else o["spec"]["type"]
            what += f": {kind}, ports {', '.join(str(p['port']) for p in o['spec']['ports'])}"
        lines.append(f"  {what}")
    return lines


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m devservers.demo", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--stack",
        default="dev",
        help="stack name: reads Pulumi.<stack>.yaml (default: %(default)s)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="write every rendered object here as YAML (default: build/devservers/<stack>.yaml)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    config = load_stack_for_command(args.stack)
    if config is None:
        return 2
    section = config.dev_servers
    if not (section.enabled and section.users):
        print(
            f"Stack {args.stack} has no DevServers users (devServers in Pulumi.{args.stack}.yaml)"
        )
        return 0
    flavor = max(section.flavors, key=lambda f: (f.gpus, f.cpu))
    user = section.users[0]
    cli_args = parse_args(
        ["create", "demo", "--flavor", flavor.name, "--distributed", "--replicas", "2"]
    )
    try:
        cli_args.image, _ = StackDefaults(args.stack, config).image()
    except StackDefaultsError:
        cli_args.image = "<an image with a shell and sshd: devctl create --image>"
    server = server_manifest(cli_args, user_namespace(user.name), [DEMO_KEY])
    server["metadata"]["uid"] = "<uid>"
    settings = Settings(
        idle_gpu_percent=section.idle.gpu_percent,
        idle_cpu_percent=section.idle.cpu_percent,
    )
    objects = children(
        server,
        flavor_manifest(flavor, config.flavor_pool(flavor), config.storage.efs.enabled),
        settings,
    )
    print(
        f"DevServer {user_namespace(user.name)}/demo (devctl create demo --flavor {flavor.name} "
        "--distributed --replicas 2):"
    )
    print(yaml.safe_dump(server["spec"], sort_keys=False).rstrip())
    print("rendered by the operator into:")
    print("\n".join(summary(objects)))
    rule = idle_rule(server, settings).describe(gpu_measured=flavor.gpus > 0)
    print(
        f"stopped (homes kept) when idle for {server['spec']['lifecycle']['idleTimeout']}: "
        f"{rule}; its users warned {int(WARN_BEFORE.total_seconds() // 60)}m before"
    )
    out = args.out or Path("build/devservers") / f"{args.stack}.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump_all([server, *objects], sort_keys=False))
    print(f"Wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
