"""Your own training code in a job's pod, or on your machine: the contract every script gets.

    python -m trainer.user_code --code-store /efs/user-code --code <sha256> \\
        --checkpoint-dir /efs/checkpoints/my-job [--requirements requirements.txt] \\
        [--setup 'pip install -e .'] -- [torchrun's options] train.py --lr 3e-4

    python -m trainer.user_code --code-dir /opt/code --checkpoint-dir /efs/checkpoints/my-job \
        -- train.py --lr 3e-4

`devctl submit` writes the first command into the job it renders, and runs it itself for
`--local`: the pod and the rehearsal are one code path. A stack job's `code` runs the second,
in the image `pulumi up` built from its folder with its requirements and setup installed
(workloads/code_image.py): steps 1 and 2 happened in the build.

1. Code: the folder `devctl submit` packed (mesh.workdir.pack, the same bytes for the same
   files) is `<code-store>/code/<sha256>.tar`; its hash is checked, and it is unpacked into a
   fresh working directory (--workdir, default a temporary folder), which the script runs from.
2. Dependencies: `--requirements` (a file of the folder) and `--setup` (a shell command run in
   the working directory) install into an environment kept at `<code-store>/envs/<key>`, keyed
   by the requirements' content, the setup command and the interpreter: the next job with the
   same key starts without installing. The environment is a venv layered over this interpreter's
   packages (torch and the image's own), built under a lock and marked ready last, so pods
   starting together build it once and never use a half-built one.
3. Variables: CHECKPOINT_DIR (the job's folder, plain files on a mounted store),
   TENSORBOARD_DIR (its tensorboard/ folder, which the team's TensorBoard shows) and OUTPUT_DIR
   (its outputs/ folder, which `devctl fetch` brings back), besides torchrun's own (RANK,
   WORLD_SIZE, LOCAL_RANK, MASTER_ADDR...).
4. Launch: trainer.launch, so SIGTERM (a drain, a Spot interruption, `devctl delete`) reaches the
   script's processes, not torchrun, and a clean stop exits 0.

Input that no restart can fix (no snapshot, a snapshot that is not what was sent, requirements
that do not install, a script that does not compile) ends with one line and exit 2 before
torchrun starts: a job's pods are told not to restart on it (workloads.user_job).
"""

import argparse
import fcntl
import hashlib
import io
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import traceback
from pathlib import Path

from trainer.launch import entry_point

CODE = "code"  # <code-store>/code/<sha256>.tar
ENVS = "envs"  # <code-store>/envs/<key>/
TENSORBOARD = "tensorboard"  # as trainer/scalars.py, so the team's TensorBoard finds it
OUTPUTS = "outputs"
READY = ".ready"  # written last into a built environment
INPUT_ERROR = 2
# A run on your machine: CPU processes (gloo) in place of a node's ranks, one thread each
# (torchrun warns when it is unset, and the ranks share the cores).
LOCAL_NPROC = 2
LOCAL_ENV = {"OMP_NUM_THREADS": "1"}
# Where this package lives: the layered environment and the launcher import it from here.
TRAINER_ROOT = Path(__file__).resolve().parents[1]


class InputError(Exception):
    """Input no restart can fix: one line, exit 2."""


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def snapshot_path(code_store: Path, sha: str) -> Path:
    return code_store / CODE / f"{sha}.tar"


def store_snapshot(code_store: Path, data: bytes) -> tuple[str, bool]:
    """Put a packed folder in the store: (its hash, whether it was written; an unchanged folder
    is there already). Written under a temporary name, then renamed: a reader sees it whole."""
    sha = digest(data)
    path = snapshot_path(code_store, sha)
    if path.is_file():
        return sha, False
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".incoming-", delete=False) as f:
        f.write(data)
    os.replace(f.name, path)
    return sha, True


def unpack(code_store: Path, sha: str, workdir: Path) -> None:
    path = snapshot_path(code_store, sha)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InputError(f"no code snapshot {path}: submit the job again") from None
    if digest(data) != sha:
        raise InputError(f"code snapshot {path} is not the one submitted (its sha256 differs)")
    workdir.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(workdir, filter="data")


def environment_key(requirements: bytes, setup: str) -> str:
    """The requirements' content, the setup command and the interpreter (a cache built for one
    Python or platform is no use to another)."""
    interpreter = f"{sys.version_info[:2]} {sysconfig.get_platform()} {sys.base_prefix}"
    return digest(b"\0".join([requirements, setup.encode(), interpreter.encode()]))[:32]


def _site_packages(env: Path) -> Path:
    return env / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"


def _env_vars(env: Path | None, base: dict[str, str]) -> dict[str, str]:
    found = dict(base)
    if env is not None:
        found["VIRTUAL_ENV"] = str(env)
        found["PATH"] = f"{env / 'bin'}{os.pathsep}{found.get('PATH', os.defpath)}"
    return found


def _last_line(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")]
    return (errors or lines or ["(no output)"])[-1]


def _build(env: Path, requirements: Path | None, setup: str, workdir: Path) -> None:
    """A venv at `env` that sees this interpreter's packages (a .pth adding its site folders, so
    pip counts torch and the image's packages as installed), then the requirements and setup."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    layered = [p for p in sys.path if p.endswith("-packages") and Path(p).is_dir()]
    lines = [f"import site; site.addsitedir({p!r})" for p in layered]
    (_site_packages(env) / "_layered_over_image.pth").write_text("\n".join(lines) + "\n")
    python = env / "bin" / "python"
    if requirements is not None:
        pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
        done = subprocess.run(
            [*pip, "-r", str(requirements)], cwd=workdir, capture_output=True, text=True
        )
        if done.returncode:
            said = done.stderr + done.stdout
            raise InputError(f"pip install -r {requirements.name} failed: {_last_line(said)}")
    if setup:
        done = subprocess.run(
            ["sh", "-c", setup],
            cwd=workdir,
            env=_env_vars(env, os.environ),
            capture_output=True,
            text=True,
        )
        if done.returncode:
            said = done.stderr + done.stdout
            raise InputError(f"--setup {setup!r} exited {done.returncode}: {_last_line(said)}")


def environment(code_store: Path, requirements: Path | None, setup: str, workdir: Path) -> Path:
    """The cached environment for these requirements and setup, built once (under a lock) if
    missing. Prints whether it was reused."""
    content = requirements.read_bytes() if requirements else b""
    key = environment_key(content, setup)
    env = code_store / ENVS / key

    def reused() -> bool:
        if (env / READY).is_file():
            print(f"user_code: environment {key} reused", file=sys.stderr, flush=True)
        return (env / READY).is_file()

    if reused():
        return env
    env.parent.mkdir(parents=True, exist_ok=True)
    with open(env.parent / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a peer pod may be building it
        if reused():
            return env
        print(f"user_code: building environment {key}", file=sys.stderr, flush=True)
        try:
            # Built at its final path (a venv's scripts name it), over what a killed build left,
            # and marked ready last.
            shutil.rmtree(env, ignore_errors=True)
            _build(env, requirements, setup, workdir)
        except BaseException:
            shutil.rmtree(env, ignore_errors=True)
            raise
        (env / READY).write_text(key + "\n")
    return env


def check_entry(workdir: Path, launch: list[str]) -> None:
    """The script exists and compiles, or the module is in the folder or installed: what would
    otherwise fail once per rank and restart."""
    found = entry_point(launch)
    if found is None:
        raise InputError("no script to run: give `train.py [its arguments]` or `-m module`")
    kind, name = found
    if kind == "module":
        return  # found by the interpreter at start; torchrun reports it once
    script = workdir / name
    if not script.is_file():
        raise InputError(f"no script {name} in the submitted folder")
    try:
        compile(script.read_bytes(), name, "exec")
    except (SyntaxError, ValueError) as e:
        said = "".join(traceback.format_exception_only(e)).rstrip()
        raise InputError(f"{name} does not compile:\n{said}") from None


CONTRACT_VARIABLES = ("CHECKPOINT_DIR", "TENSORBOARD_DIR", "OUTPUT_DIR")


def contract_paths(checkpoint_dir: str) -> dict[str, str]:
    """The variables every script gets: the job's folder, its tensorboard/ and outputs/."""
    folders = (checkpoint_dir, f"{checkpoint_dir}/{TENSORBOARD}", f"{checkpoint_dir}/{OUTPUTS}")
    return dict(zip(CONTRACT_VARIABLES, folders, strict=True))


def contract(checkpoint_dir: Path, base: dict[str, str]) -> dict[str, str]:
    """The variables every script gets, its folders made."""
    folders = contract_paths(str(checkpoint_dir))
    for folder in folders.values():
        Path(folder).mkdir(parents=True, exist_ok=True)
    return {**base, **folders}


def command(
    checkpoint_dir: str,
    launch: list[str],
    code: tuple[str, str] | None = None,
    code_dir: str | None = None,
    requirements: str | None = None,
    setup: str = "",
    python: str = "python",
) -> list[str]:
    """This module's command line: what a job's pods and `devctl submit --local` run, over a
    snapshot `code` (code store, sha256), or a built folder `code_dir`."""
    found = [python, "-m", "trainer.user_code"]
    if code:
        found += ["--code-store", code[0], "--code", code[1]]
    if code_dir:
        found += ["--code-dir", code_dir]
    found += ["--checkpoint-dir", checkpoint_dir]
    if requirements:
        found += ["--requirements", requirements]
    if setup:
        found += ["--setup", setup]
    return [*found, "--", *launch]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m trainer.user_code",
        usage="%(prog)s (--code-store DIR --code SHA256 | --code-dir DIR) --checkpoint-dir DIR "
        "[options] -- [torchrun's options] SCRIPT|-m MODULE [its arguments]",
        description=__doc__.splitlines()[0],
    )
    p.add_argument(
        "--code-store", type=Path, help="where code/ and envs/ are (with --code; default: none)"
    )
    p.add_argument("--code", metavar="SHA256", help="the folder's snapshot (default: none)")
    p.add_argument(
        "--code-dir",
        type=Path,
        help="instead of a snapshot: a folder whose dependencies are installed already (an image "
        "built from it), run in place (default: none)",
    )
    p.add_argument(
        "--checkpoint-dir", type=Path, required=True, help="the job's folder (CHECKPOINT_DIR)"
    )
    p.add_argument("--requirements", help="a requirements file of the folder (default: none)")
    p.add_argument("--setup", default="", help="a shell command that installs more (default: none)")
    p.add_argument(
        "--workdir",
        type=Path,
        help="where the folder is unpacked and the script runs (default: a new temporary folder)",
    )
    return p


def prepare(args: argparse.Namespace, launch: list[str]) -> tuple[list[str], dict, Path]:
    """(the launcher's command, its environment, its working directory)."""
    if args.code_dir:
        workdir = args.code_dir
    else:
        workdir = args.workdir or Path(tempfile.mkdtemp(prefix="user-code-"))
        unpack(args.code_store, args.code, workdir)
    check_entry(workdir, launch)
    requirements = None
    if args.requirements:
        requirements = workdir / args.requirements
        if not requirements.is_file():
            raise InputError(f"no requirements file {args.requirements} in the submitted folder")
    env_dir = None
    if requirements or args.setup:
        env_dir = environment(args.code_store, requirements, args.setup, workdir)
    variables = contract(args.checkpoint_dir, _env_vars(env_dir, os.environ))
    # The launcher (this package) importable from the working directory, below the script's own.
    paths = [p for p in (variables.get("PYTHONPATH", ""), str(TRAINER_ROOT)) if p]
    variables["PYTHONPATH"] = os.pathsep.join(paths)
    python = str(env_dir / "bin" / "python") if env_dir else sys.executable
    return [python, "-m", "trainer.launch", *launch], variables, workdir


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    p = parser()
    args = p.parse_args(argv[:cut])
    if bool(args.code_dir) == bool(args.code_store and args.code):
        p.error("give --code-store and --code (a snapshot), or --code-dir (a built folder)")
    if args.code_dir and (args.requirements or args.setup or args.workdir):
        p.error("--code-dir runs a folder as built: --requirements, --setup and --workdir belong "
                "to its build")  # fmt: skip
    try:
        command, variables, workdir = prepare(args, argv[cut + 1 :])
    except InputError as e:
        print(f"user_code: {e}", file=sys.stderr, flush=True)
        return INPUT_ERROR
    sys.stdout.flush()
    sys.stderr.flush()
    os.chdir(workdir)
    os.execve(command[0], command, variables)


if __name__ == "__main__":
    sys.exit(main())
