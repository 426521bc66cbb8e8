"""DevServer homes whose claim is gone, kept on purpose: list them, or free one for good.

    .venv/bin/python -m deploy.released_homes                       # list
    .venv/bin/python -m deploy.released_homes --delete pvc-0a1b...  # delete that volume's disk

Needs the cluster (a kubeconfig) and a platform admin's rights. Homes live on the gp3-home
StorageClass, whose reclaimPolicy is Retain (infra/storage/block_storage.py): when a user is
removed from stack config (her namespace goes) or a claim is deleted, the volume stays Released
with its EBS disk and data. Deleting is the documented Kubernetes way: set the volume's
persistentVolumeReclaimPolicy to Delete, and the EBS CSI driver deletes the disk and the volume
(kubernetes pkg/controller/volume/persistentvolume/pv_controller.go reclaimVolume).
"""

import argparse
import sys
from dataclasses import dataclass

from deploy.cluster_access import add_arguments, with_cluster
from infra.storage.block_storage import HOME_STORAGE_CLASS


@dataclass(frozen=True)
class Home:
    volume: str
    namespace: str  # where its claim was: dev-<user>
    claim: str
    size: str

    def line(self) -> str:
        return f"{self.volume}  {self.size:>8}  was {self.namespace}/{self.claim}"


def released_homes(core) -> list[Home]:
    found = []
    for volume in core.list_persistent_volume().items:
        spec, status = volume.spec, volume.status
        if spec.storage_class_name != HOME_STORAGE_CLASS or status.phase != "Released":
            continue
        claim = spec.claim_ref
        found.append(
            Home(
                volume.metadata.name,
                claim.namespace if claim else "-",
                claim.name if claim else "-",
                (spec.capacity or {}).get("storage", "?"),
            )
        )
    return sorted(found, key=lambda h: (h.namespace, h.claim))


def delete(core, name: str) -> str | None:
    """Hand a released home to its driver for deletion; the reason it cannot, or None."""
    if name not in {h.volume for h in released_homes(core)}:
        return f"{name} is not a released home (see the list without --delete)"
    core.patch_persistent_volume(
        name,
        {"spec": {"persistentVolumeReclaimPolicy": "Delete"}},
        _content_type="application/merge-patch+json",
    )
    return None


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m deploy.released_homes", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--delete",
        metavar="VOLUME",
        help="delete this released home's disk (default: none, only list them)",
    )
    add_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)

    def command(api_client) -> int:
        from kubernetes import client

        core = client.CoreV1Api(api_client)
        if args.delete:
            problem = delete(core, args.delete)
            if problem:
                print(f"error: {problem}", file=sys.stderr)
                return 1
            print(f"{args.delete}: reclaim policy Delete; the EBS CSI driver deletes its disk")
            return 0
        homes = released_homes(core)
        for home in homes:
            print(home.line())
        print(f"{len(homes)} released homes" if homes else "no released home")
        return 0

    return with_cluster(args, command)


if __name__ == "__main__":
    sys.exit(main())
