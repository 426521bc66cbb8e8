"""The local working directory as one tar, unpacked into every node's workdir before a launch (as
SkyPilot's workdir): the same bytes for the same files, whatever order the disk lists them in.
`tp-mesh launch --workdir`, `devctl run` and `devctl submit` pack with it.

Names matching an exclude (a glob against each file or folder name, or its path from the top)
stay behind, with everything under them, and so does what git ignores there (.gitignore and
git's other excludes, where the folder is in a git work tree); a directory over the size limit
is refused, naming its largest parts, rather than copied to every machine over home links.
"""

import fnmatch
import io
import os
import stat
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from mesh.spec import MeshError

DEFAULT_EXCLUDES = (".git", "build", "__pycache__", ".venv")
DEFAULT_MAX_MB = 100
MIB = 1024 * 1024


@dataclass(frozen=True)
class Archive:
    data: bytes
    files: int
    size: int  # bytes of file content
    entries: tuple[str, ...]  # every file, folder and link in it, sorted
    # Sockets, named pipes and devices found (a notebook kernel's socket, say): tar has no use
    # for them, and their contents are not files to copy.
    left_out: tuple[str, ...] = ()

    def summary(self) -> str:
        text = f"{self.files} files, {self.size / MIB:.1f} MiB"
        if self.left_out:
            text += f" (left out, not files: {', '.join(self.left_out)})"
        return text


def _excluded(relative: str, excludes: tuple[str, ...]) -> bool:
    name = relative.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatch(name, p) or fnmatch.fnmatch(relative, p) for p in excludes)


def _kept_by_git(root: Path) -> set[str] | None:
    """The files and links under `root` git keeps (tracked, or untracked and not ignored by a
    .gitignore, .git/info/exclude or the user's excludes), relative to it; None where `root` is
    in no git work tree, or there is no git."""
    try:
        listed = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others",
             "--exclude-standard", "--", "."],
            capture_output=True,
            timeout=60,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    if listed.returncode:
        return None
    return {path for path in listed.stdout.decode(errors="surrogateescape").split("\0") if path}


def _entries(root: Path, excludes: tuple[str, ...]) -> list[str]:
    """Every file, folder and link under root to copy, as sorted paths relative to it, less
    what git ignores there. Links are copied as links, never followed."""
    kept = _kept_by_git(root)
    found = []
    for top, folders, files in os.walk(root):
        base = Path(top).relative_to(root).as_posix()

        def relative(name: str, base: str = base) -> str:
            return name if base == "." else f"{base}/{name}"

        folders[:] = [f for f in folders if not _excluded(relative(f), excludes)]
        found += [relative(f) for f in folders]
        found += [relative(f) for f in files if not _excluded(relative(f), excludes)]
    if kept is not None:
        # A folder stays where it holds a file git keeps; empty ones go, as git has no record.
        files = {f for f in found if f in kept}
        parents = {"/".join(f.split("/")[:i]) for f in files for i in range(1, f.count("/") + 1)}
        found = [f for f in found if f in files or f in parents]
    return sorted(found)


def _copied(mode: int) -> bool:
    return stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)


def pack(
    root: Path, excludes: tuple[str, ...], max_mb: int, limit_option: str = "--max-workdir-mb"
) -> Archive:
    """`root` less `excludes`, refused over `max_mb` (the error names `limit_option`, the
    command's own option for it)."""
    if not root.is_dir():
        raise MeshError(f"--workdir {root}: not a directory")
    found = _entries(root, excludes)
    stats = {e: (root / e).lstat() for e in found}
    entries = [e for e in found if _copied(stats[e].st_mode)]
    stats = {e: stats[e] for e in entries}
    sizes = {e: st.st_size for e, st in stats.items() if stat.S_ISREG(st.st_mode)}
    size = sum(sizes.values())
    if size > max_mb * MIB:
        tops: dict[str, int] = {}
        for entry, bytes_ in sizes.items():
            top = entry.split("/", 1)[0] + ("/" if "/" in entry else "")
            tops[top] = tops.get(top, 0) + bytes_
        largest = sorted(tops.items(), key=lambda item: -item[1])[:3]
        raise MeshError(
            f"--workdir {root}: {size / MIB:.1f} MiB in {len(sizes)} files, over the "
            f"{max_mb} MiB limit; largest: "
            + ", ".join(f"{name} {bytes_ / MIB:.1f} MiB" for name, bytes_ in largest)
            + f". Leave parts out with --exclude NAME, or raise {limit_option}"
        )
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in entries:
            info = tar.gettarinfo(root / entry, arcname=entry)
            # Nothing of this machine's accounts, and whole seconds: same files, same bytes.
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = int(info.mtime)
            if info.isfile():
                with (root / entry).open("rb") as content:
                    tar.addfile(info, content)
            else:
                tar.addfile(info)
    left_out = tuple(e for e in found if e not in stats)
    return Archive(buffer.getvalue(), len(sizes), size, tuple(entries), left_out)
