"""Where the program's files are, and how to name them to the providers Pulumi runs.

Pulumi runs the program with Pulumi.yaml's `main:` folder as the working directory, and provider
plugins resolve relative paths against it (pulumi/pulumi pkg/engine/project.go). Paths handed to a
provider are therefore written relative to the working directory: absolute paths would differ
from one checkout to the next and show up as a diff (and, for an image, a rebuild).
"""

import os
from pathlib import Path

import yaml

# The folder of Pulumi.yaml: the project, wherever this module sits in it.
PROJECT_DIR = next(p for p in Path(__file__).resolve().parents if (p / "Pulumi.yaml").is_file())
# The folder `pulumi up` runs the program in.
PROGRAM_DIR = (
    PROJECT_DIR / yaml.safe_load((PROJECT_DIR / "Pulumi.yaml").read_text())["main"]
).resolve()


def provider_path(path: Path) -> str:
    """`path` as a provider resolves it: relative to the program's working directory."""
    return os.path.relpath(path, Path.cwd())
