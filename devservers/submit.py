"""`devctl submit`: a folder with your training script, as a job in your team's queue, or run here.

    devctl submit --pool gpu-small --nodes 2 --requirements requirements.txt -- train.py --lr 3e-4
    devctl submit -f task.yaml                  (the same choices, kept with the code)
    devctl submit -f task.yaml --dry-run -o yaml   (the job, no cluster)
    devctl submit -f task.yaml --local          (the same command on this machine's CPU)

The folder (the task file's, else the current one; `workdir` moves it) is packed as `devctl run`
and tp-mesh pack it (mesh.workdir: the same bytes for the same files, excludes, a size cap) and
named by its sha256. What the job runs is trainer.user_code over that snapshot
(workloads.user_job renders the job): the pod and `--local` take the same path, so what runs
here runs there.
"""

import argparse
import os
import re
import secrets
import sys
from pathlib import Path

import yaml

from devservers.devctl import CliError, add_dry_run_options, print_manifest
from mesh.spec import MeshError
from mesh.workdir import DEFAULT_EXCLUDES, Archive, pack

TASK_OPTIONS = {  # option -> task key, for the options a task file can hold too
    "name": "name",
    "pool": "pool",
    "nodes": "nodes",
    "workdir": "workdir",
    "requirements": "requirements",
    "setup": "setup",
    "image": "image",
    "queue": "queue",
    "exclude": "exclude",
    "max_size": "maxSizeMb",
}
# Exit status of a submission refused before anything was created (as trainer.user_code's).
BAD_INPUT = 2
# How long the pod that stores the code may wait for its queue and a node.
START_SECONDS = 300


def add_parser(command) -> None:
    """`submit`'s options, on devctl's parser (`command` makes a subcommand)."""
    submit = command(
        "submit",
        help="run a folder's training script as a job in your team's queue (or --local here); "
        "the script and its arguments after --",
    )
    submit.add_argument(
        "-f",
        "--file",
        type=Path,
        help="a task file (YAML) with these choices; the options given win (default: none)",
    )
    submit.add_argument("--name", help="the job's name (default: the folder's, plus a suffix)")
    submit.add_argument(
        "--pool", help="the node pool, e.g. gpu-small (default: the task file's; one is required)"
    )
    submit.add_argument("--nodes", help="N, or MIN:MAX for an elastic job (default: 1)")
    submit.add_argument(
        "--workdir", help="the folder to send (default: the task file's folder, else .)"
    )
    submit.add_argument(
        "--requirements",
        help="a requirements file in the folder, installed once per content (default: none)",
    )
    submit.add_argument(
        "--setup", help="a shell command that installs more, once per content (default: none)"
    )
    submit.add_argument("--image", help="your image (default: the pool's runtime image)")
    submit.add_argument(
        "--env",
        action="append",
        metavar="NAME=VALUE",
        help="a variable of the script's processes and its install, e.g. PIP_INDEX_URL=... "
        "(repeatable; default: none)",
    )
    submit.add_argument("--queue", help="your team's LocalQueue (default: the namespace's)")
    submit.add_argument(
        "--exclude",
        action="append",
        metavar="GLOB",
        help="leave out paths matching GLOB (repeatable; default: none besides these, always left "
        "out: " + " ".join(DEFAULT_EXCLUDES),
    )
    submit.add_argument(
        "--max-size", type=int, metavar="MIB", help="refuse a bigger folder (default: 100)"
    )
    submit.add_argument(
        "--stack",
        help="the stack file with the pools (default: the first Pulumi.<stack>.yaml by name)",
    )
    add_dry_run_options(submit, "the job")
    submit.add_argument(
        "--local",
        action="store_true",
        help="run it here instead: torchrun with CPU processes (gloo) (default: off)",
    )
    submit.add_argument(
        "--store",
        type=Path,
        help="--local: where code, environments and job folders go (default: ~/.cache/devctl)",
    )


def task_values(args: argparse.Namespace) -> tuple[dict, str, Path]:
    """(the task's keys: the file's, then the options given, the folder the workdir is
    relative to, where they come from)."""
    values, base, source = {}, Path.cwd(), "the command line"
    if args.file:
        try:
            values = yaml.safe_load(args.file.read_text()) or {}
        except OSError as e:
            raise CliError(f"cannot read {args.file}: {e.strerror}") from None
        except yaml.YAMLError as e:
            raise CliError(f"{args.file} is not YAML: {' '.join(str(e).split())}") from None
        if not isinstance(values, dict):
            raise CliError(f"{args.file}: allowed: a mapping of task keys")
        base, source = args.file.resolve().parent, f"{args.file} and the command line"
    for option, key in TASK_OPTIONS.items():
        given = getattr(args, option)
        if given is not None:
            values[key] = given
    if args.env:
        pairs = [item.partition("=") for item in args.env]
        bad = [item for item, (_, sep, _) in zip(args.env, pairs, strict=True) if not sep]
        if bad:
            raise CliError(f"--env {bad[0]!r}: allowed: NAME=VALUE")
        values["env"] = {**values.get("env", {}), **{k: v for k, _, v in pairs}}
    if args.passthrough:
        values["run"] = args.passthrough
    return values, source, base


def job_name(task, folder: Path) -> str:
    if task.name:
        return task.name
    # A TrainJob's name starts with a letter; short, so the pods' names stay within 63.
    stem = re.sub(r"[^a-z0-9-]+", "-", folder.name.lower()).strip("-")[:20].strip("-")
    stem = stem if stem[:1].isalpha() else f"job-{stem}".strip("-")
    return f"{stem}-{secrets.token_hex(3)}"


def packed(task, base: Path) -> tuple[Path, Archive]:
    folder = (base / task.workdir).resolve()
    try:
        excludes = (*DEFAULT_EXCLUDES, *task.exclude)
        return folder, pack(folder, excludes, task.max_size_mb, "--max-size")
    except MeshError as e:
        raise CliError(str(e).replace("--workdir", "folder", 1)) from None


def check_folder(task, folder: Path) -> None:
    """What a pod would only find out after the queue admitted it."""
    from trainer.launch import entry_point

    kind, name = entry_point(task.run) or ("script", "")
    if kind == "script" and not (folder / name).is_file():
        raise CliError(f"no script {name!r} in {folder}: the script is relative to the folder")
    if task.requirements and not (folder / task.requirements).is_file():
        raise CliError(f"no requirements file {task.requirements!r} in {folder}")


def local(task, name: str, folder: Path, archive: Archive, store: Path | None) -> int:
    """Run trainer.user_code here, in place of devctl: Ctrl-C reaches the launcher, which stops
    the ranks as a drained pod's are stopped."""
    from workloads.user_job import local_run

    store = store or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "devctl"
    command, variables, said = local_run(task, name, folder, archive, store, sys.executable)
    low, high = task.node_range
    print(
        f"devctl: {name}: {said}"
        + (f"; nodes {task.nodes} run as one node here" if high > 1 else ""),
        file=sys.stderr,
        flush=True,
    )
    os.execve(command[0], command, {**os.environ, **variables})


class Stack:
    """What a submission takes from the stack file: the pools and the shared file systems (the
    cluster has them only as rendered objects)."""

    def __init__(self, stack: str | None):
        from devservers.stack_defaults import StackDefaults, StackDefaultsError

        try:
            self.defaults = StackDefaults.load(stack)
        except StackDefaultsError as e:
            raise CliError(str(e)) from None
        self.config = self.defaults.config
        self.teams = {t.namespace_name: t.name for t in self.config.queues.teams}

    def namespace(self, given: str | None) -> str:
        from devservers.devctl import kube_namespace

        namespace = given or kube_namespace()
        if not namespace:
            raise CliError(
                f"which namespace? pass --namespace (teams in {self.defaults.file}: "
                f"{', '.join(self.teams) or 'none'}) or set it in your kubeconfig"
            )
        return namespace

    def pool(self, name: str):
        from workloads.user_job import pool_of

        return pool_of(self.config.node_pools, name)

    def render(self, task, name: str, namespace: str, queue: str, image: str, code: str) -> dict:
        from workloads.user_job import render

        pool, storage = self.pool(task.pool), self.config.storage.shared_file_systems
        return render(task, name, pool, namespace, queue, image, code, storage)

    def code_store(self) -> str:
        from workloads.user_job import CODE_STORES, code_store

        return CODE_STORES[code_store(self.config.storage.shared_file_systems)]


def dry_run(args, task, name: str, code: str) -> dict:
    """The job as it would be created, from the stack file's pools, storage and image."""
    from devservers.stack_defaults import StackDefaultsError

    stack = Stack(args.stack)
    namespace = stack.namespace(args.namespace)
    queue = task.queue or stack.teams.get(namespace)
    if queue is None:
        raise CliError(
            f"namespace {namespace} is no team's in {stack.defaults.file}: pass --queue, or a "
            f"team's namespace ({', '.join(stack.teams) or 'none'})"
        )
    try:
        image = task.image or stack.defaults.image()[0]
    except StackDefaultsError as e:
        raise CliError(str(e)) from None
    return stack.render(task, name, namespace, queue, image, code)


def to_cluster(args, task, name: str, archive: Archive, out) -> int:
    """Store the snapshot on the team's file system through a short-lived pod of the team's
    namespace (the member's own rights: create a pod, exec into it), then create the job."""
    from kubernetes import client

    from trainer.cluster_copy import PodFolder, answer, api_client
    from trainer.user_code import digest, snapshot_path
    from workloads.manifests import API_VERSIONS, TRAINER_GROUP, runtime_name
    from workloads.user_job import runtime_image

    custom = client.CustomObjectsApi(api_client())  # no kubeconfig: said before anything else
    stack = Stack(args.stack)
    namespace = stack.namespace(args.namespace)
    runtime = runtime_name(stack.pool(task.pool))
    found = answer(
        f"reading ClusterTrainingRuntime {runtime}",
        custom.get_cluster_custom_object,
        TRAINER_GROUP,
        "v1alpha1",
        "clustertrainingruntimes",
        runtime,
    )
    tools = runtime_image(found)  # the trainer image: a shell, and trainer.user_code
    code = digest(archive.data)
    with PodFolder(namespace, stack.code_store(), tools, task.queue or "", START_SECONDS,
                   writable=True) as folder:  # fmt: skip
        written = folder.put(snapshot_path(Path(), code).as_posix(), archive.data)
        queue = folder.queue
    manifest = stack.render(task, name, namespace, queue, task.image or tools, code)
    kind = manifest["kind"]
    group, version = API_VERSIONS[kind].split("/")
    answer(
        f"creating {kind} {name} in namespace {namespace}",
        custom.create_namespaced_custom_object,
        group,
        version,
        namespace,
        f"{kind.lower()}s",
        manifest,
    )
    print(
        f"devctl: code {archive.summary()} {'sent' if written else 'unchanged, not sent'} "
        f"({code[:12]})",
        file=sys.stderr,
    )
    print(f"{kind.lower()}/{name} created in {namespace}, queue {queue}", file=out)
    print(f"watch it: devctl status {name} -n {namespace}", file=out)
    return 0


def submit(args: argparse.Namespace, out) -> int:
    from workloads.user_job import TaskError

    try:
        return _submit(args, out)
    except TaskError as e:  # a task the stack cannot run, said once for every step
        raise CliError(str(e)) from None


def _submit(args: argparse.Namespace, out) -> int:
    from trainer.user_code import digest
    from workloads.user_job import task_from

    values, source, base = task_values(args)
    task = task_from(values, source)
    folder, archive = packed(task, base)
    check_folder(task, folder)
    name = job_name(task, folder)
    if args.local:
        return local(task, name, folder, archive, args.store)
    if task.elastic:
        from infra.operators.retirement import pytorchjob_warning

        print(f"devctl: warning: {pytorchjob_warning(name)}", file=sys.stderr)
    if args.dry_run:
        print_manifest(dry_run(args, task, name, digest(archive.data)), args.output, out)
        return 0
    return to_cluster(args, task, name, archive, out)
