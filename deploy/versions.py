"""Every pinned platform version, how old it is and what is newer: `python -m deploy.versions`.

One row per pin (infra/core/releases.py): Kubernetes, the EKS add-on builds of the default version,
the charts, operators and images the program deploys, and the SDKs it talks through, each with its
upstream release date and the newest release known when the table was last checked. A row marked
`behind` has a newer release; `--behind` prints only those.
"""

import argparse
import sys

from infra.core.releases import CHECKED, releases


def table(behind_only: bool = False) -> list[str]:
    every = releases()
    rows = [r for r in every if r.behind or not behind_only]
    header = ("component", "pinned", "released", "newest known", "its release", "")
    cells = [
        (r.name, r.version, r.released, r.newest, r.newest_released, "behind" if r.behind else "")
        for r in rows
    ]
    widths = [max(len(row[i]) for row in [header, *cells]) for i in range(len(header))]
    lines = [f"Pinned versions, checked {CHECKED} (sources: infra/core/releases.py)"]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
              for row in [header, *cells]]  # fmt: skip
    lines.append(f"{sum(r.behind for r in every)} of {len(every)} pins have a newer release")
    return lines


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m deploy.versions",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--behind", action="store_true", help="only the pins with a newer release (default: off)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    print("\n".join(table(args.behind)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
