"""The NCCL fabric check of a GPU pool: nccl-tests' all_reduce_perf as an MPIJob, judged.

    python -m workloads.nccl_check --stack dev --pool gpu-large --queue research \\
        --image <trainer image by digest> [--nodes 2] [--dry-run] [--keep] [--context NAME]

Renders the check from the pool's stack config through the MPIJob renderer jobs use (one rank per
GPU on `nodes` nodes, the pool's image target, NCCL_DEBUG=INFO), submits it with the kubeconfig's
credentials into the team's namespace behind its Kueue LocalQueue, waits, reads the launcher's
log and reports busbw per message size against the pool's floors, the network NCCL used, and
wrong results. Exit 0: passed; 1: failed (or did not finish); 2: usage or stack config error.
The MPIJob (and its NetworkPolicy) is deleted afterwards unless --keep.
"""

import argparse
import json
import re
import sys
import time
from dataclasses import dataclass, field
from typing import TextIO

import yaml
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from urllib3.exceptions import HTTPError

from infra.core.pools import image_target
from infra.jobs.config import JobConfig
from infra.karpenter.config import NodePoolConfig
from infra.karpenter.fabric_check import FabricCheckPlan
from infra.kueue.config import queue_shortfall
from infra.stack.config import StackConfig
from infra.stack.loading import load_stack_for_command
from workloads.manifests import API_VERSIONS, LAUNCHER, JobTarget, mpi_job, network_policy

CHECK_LABEL = "training-platform/fabric-check"
# all_reduce_perf from nccl-tests, built into the trainer image (trainer/Dockerfile, stage
# nccl-tests): on every image PATH and on sshd's default PATH (/usr/local/bin).
ALL_REDUCE_PERF = "all_reduce_perf"
# INFO for the lines that name the network (NCCL_INIT: "Using network ...") and the libfabric
# provider (aws-ofi-nccl, NCCL_INIT|NCCL_NET: "NET/OFI Selected provider is ..."), and no more.
CHECK_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
# The names NCCL logs for aws-ofi-nccl: "Libfabric" since plugin 1.12, "AWS Libfabric" before
# (and today when NCCL_NET="AWS Libfabric"), "OFI" when NCCL_NET="OFI"
# (aws/aws-ofi-nccl src/nccl_ofi_interface_nvidia.cpp, nvidia_plugin_name_fixup).
LIBFABRIC_NETWORKS = {"Libfabric", "AWS Libfabric", "OFI"}
SOCKET_NETWORK = "Socket"  # NVIDIA/nccl src/transport/net_socket.cc, the ncclNet's name
POLL_SECONDS = 10
MPIJOB_GROUP, MPIJOB_VERSION = API_VERSIONS["MPIJob"].split("/")

# A log line may carry a launcher's prefix: mpirun --tag-output's "[1,0]<stdout>:" or srun -l's
# "0: ", which Slurm pads to the width of the largest task id (" 0: " with 10 or more tasks:
# SchedMD/slurm src/api/step_io.c, _wid). NCCL prints "Using network %s" (NVIDIA/nccl
# src/init.cc); aws-ofi-nccl prints "NET/OFI Selected provider is %s, fabric is %s (found %d
# nics)" since v1.14.0 and "Selected Provider is %s" before (aws/aws-ofi-nccl
# src/nccl_ofi_net.cpp, nccl_net_ofi_query_provider_capabilities).
PREFIX = re.compile(r"^(\[\d+,\d+\]<std(out|err)>:| *\d+: )")
NETWORK = re.compile(r"NCCL INFO Using network (\S.*?)\s*$")
PROVIDER = re.compile(r"NET/OFI Selected [Pp]rovider is ([^,\s]+)")
# all_reduce_perf's result table (NVIDIA/nccl-tests src/util.cu writeResultHeader,
# writeBenchmarkLinePreamble, writeBenchmarkLineBody, writeResultFooter).
COLUMNS = ["size", "count", "type", "redop", "root"] + ["time", "algbw", "busbw", "#wrong"] * 2
AVERAGE = re.compile(r"^# Avg bus bandwidth\s*:\s*(\S+)")
OUT_OF_BOUNDS = re.compile(r"^# Out of bounds values\s*:\s*(\d+)")


class PlainDumper(yaml.SafeDumper):
    """YAML without anchors: the manifests share dicts (POD_SECURITY), kubectl users read it."""

    def ignore_aliases(self, data) -> bool:
        return True


class CheckError(Exception):
    """A usage or stack config problem: the CLI prints it and exits 2."""


@dataclass(frozen=True)
class Measure:
    """One half of a row: out-of-place or in-place."""

    time_us: float
    algbw: float
    busbw: float
    wrong: float | None  # None: "N/A" (run with -c 0)


@dataclass(frozen=True)
class Row:
    size: int
    count: int
    type: str
    redop: str
    out_of_place: Measure
    in_place: Measure

    @property
    def wrong(self) -> float:
        return (self.out_of_place.wrong or 0) + (self.in_place.wrong or 0)


@dataclass
class RunOutput:
    """What a launcher log says: the table, its footer, and the networks NCCL logged."""

    rows: list[Row] = field(default_factory=list)
    average_busbw: float | None = None
    out_of_bounds: int | None = None
    networks: set[str] = field(default_factory=set)
    providers: set[str] = field(default_factory=set)


def _measure(tokens: list[str]) -> Measure:
    time_us, algbw, busbw, wrong = tokens
    return Measure(
        float(time_us), float(algbw), float(busbw), None if wrong == "N/A" else float(wrong)
    )


def parse_output(text: str) -> RunOutput:
    """The launcher log of an all_reduce_perf run (any rank's NCCL lines; rank 0's table)."""
    out = RunOutput()
    table = False
    for raw in text.splitlines():
        line = PREFIX.sub("", raw).strip()
        if found := NETWORK.search(line):
            out.networks.add(found.group(1))
        if found := PROVIDER.search(line):
            out.providers.add(found.group(1))
        if line.startswith("#"):
            names = line.lstrip("#").split()
            if names[:4] == COLUMNS[:4]:
                if names != COLUMNS:
                    raise ValueError(
                        f"all_reduce_perf table with columns {names}; this parser reads "
                        f"{COLUMNS} (nccl-tests 2.11 and later, without -S, -I or -C)"
                    )
                table = True
            if found := AVERAGE.match(line):
                out.average_busbw = float(found.group(1))
            if found := OUT_OF_BOUNDS.match(line):
                out.out_of_bounds = int(found.group(1))
            continue
        tokens = line.split()
        if table and len(tokens) == len(COLUMNS) and tokens[0].isdigit():
            out.rows.append(
                Row(
                    int(tokens[0]),
                    int(tokens[1]),
                    tokens[2],
                    tokens[3],
                    _measure(tokens[5:9]),
                    _measure(tokens[9:13]),
                )
            )
    return out


@dataclass(frozen=True)
class Verdict:
    passed: bool
    network: str  # efa, socket, or what was found instead
    findings: list[str]  # why it failed; empty when it passed


def _network(out: RunOutput, efa: bool) -> tuple[str, list[str]]:
    """(what NCCL used, failures) from the NCCL_DEBUG=INFO lines."""
    if not out.networks:
        return "unknown", [
            "cannot tell which network NCCL used: no 'NCCL INFO Using network' line in the "
            "log (was NCCL_DEBUG=INFO reaching the ranks?)"
        ]
    if out.networks == {SOCKET_NETWORK}:
        if efa:
            return "socket", [
                "NCCL fell back to TCP sockets ('Using network Socket'): EFA is not in use on "
                "this EFA pool (check the EFA device plugin, vpc.amazonaws.com/efa requests, "
                "the efa image target's aws-ofi-nccl and FI_PROVIDER=efa)"
            ]
        return "socket", []
    if out.networks <= LIBFABRIC_NETWORKS:
        if out.providers == {"efa"}:
            return "efa", []
        found = ", ".join(sorted(out.providers)) or "none logged"
        return f"libfabric ({found})", [
            f"aws-ofi-nccl's libfabric provider is {found}, not efa ('NET/OFI Selected provider "
            "is efa' missing)"
        ]
    names = ", ".join(sorted(out.networks))
    return names, [f"NCCL used {names}; expected {'EFA (Libfabric)' if efa else 'Socket'}"]


def judge(out: RunOutput, plan: FabricCheckPlan, efa: bool) -> Verdict:
    """Pass only with every size run, right results, each floor met and the pool's network."""
    network, findings = _network(out, efa)
    if not out.rows:
        return Verdict(False, network, [*findings, "no all_reduce_perf results in the log"])
    sizes = [row.size for row in out.rows]
    missing = [s for s in plan.sizes if s not in sizes]
    if missing:
        findings.append(f"no result for {len(missing)} size(s), from {missing[0]} B")
    wrong = [row for row in out.rows if row.wrong > 0]
    if wrong:
        findings.append(
            "wrong results (#wrong > 0) at "
            + ", ".join(f"{r.size} B ({r.wrong:g} elements)" for r in wrong)
        )
    if out.out_of_bounds:
        findings.append(f"all_reduce_perf counts {out.out_of_bounds} out of bounds value(s)")
    for floor in plan.floors:
        held = [row for row in out.rows if floor.covers(row.size)]
        if not held:
            findings.append(f"floor from {floor.from_bytes} B: no result at those sizes")
        low = [
            row for row in held if min(row.out_of_place.busbw, row.in_place.busbw) < floor.min_busbw
        ]
        if low:
            findings.append(
                f"busbw below the {floor.min_busbw:g} GB/s floor at "
                + ", ".join(
                    f"{r.size} B ({min(r.out_of_place.busbw, r.in_place.busbw):g})" for r in low
                )
            )
    return Verdict(not findings, network, findings)


def report(out: RunOutput, plan: FabricCheckPlan, verdict: Verdict) -> str:
    """busbw per size against its floor, then the network and the verdict."""
    lines = [
        f"{'size (B)':>12}  {'busbw oop':>9}  {'busbw ip':>9}  {'#wrong':>6}  {'floor':>7}",
    ]
    for row in out.rows:
        floors = [f.min_busbw for f in plan.floors if f.covers(row.size)]
        floor = max(floors) if floors else None
        low = floor is not None and min(row.out_of_place.busbw, row.in_place.busbw) < floor
        lines.append(
            f"{row.size:>12}  {row.out_of_place.busbw:>9.2f}  {row.in_place.busbw:>9.2f}  "
            f"{row.wrong:>6g}  {'-' if floor is None else f'{floor:g}':>7}"
            + ("  BELOW" if low else "")
        )
    lines.append(f"average busbw (all_reduce_perf): {out.average_busbw}")
    lines.append(f"floors: {plan.basis}")
    lines.append(f"network: {verdict.network}")
    lines += [f"FAIL: {finding}" for finding in verdict.findings]
    lines.append("PASSED" if verdict.passed else "FAILED")
    return "\n".join(lines)


def check_job(pool: NodePoolConfig, queue: str, nodes: int) -> JobConfig:
    """The check as a job of the team's queue: what Kueue admits and the MPIJob is named after."""
    return JobConfig.model_validate(
        {
            "name": f"nccl-{pool.name}"[:40].rstrip("-"),
            "kind": "MPIJob",
            "nodePool": pool.name,
            "minNodes": nodes,
            "maxNodes": nodes,
            "queue": queue,
            "maxRestarts": 0,  # a failed check is a result, not something to retry
        }
    )


def check_manifests(
    config: StackConfig, pool: NodePoolConfig, queue: str, nodes: int, image: str
) -> tuple[dict, dict]:
    """(NetworkPolicy, MPIJob) of the check: all_reduce_perf over every GPU of `nodes` nodes."""
    team = {t.name: t for t in config.queues.teams}[queue]
    plan = pool.fabric_check_plan(nodes)
    job = check_job(pool, queue, nodes)
    # No checkpoint and no AWS access: the namespace's default ServiceAccount, no Pod Identity.
    target = JobTarget(
        job, pool, team.namespace_name, image, "", frozenset(), service_account_name="default"
    )
    program = [ALL_REDUCE_PERF, "-b", "8", "-e", str(plan.max_bytes), "-f", "2", "-g", "1"]
    # Never, not the jobs' OnFailure: with backoffLimit 0 the launcher Job fails at the first
    # restart of its container and deletes the pod that restarted it, the failed run's log with
    # it; a failed pod that is not restarted is kept, log and all (README, Fabric check).
    manifest = mpi_job(target, program, CHECK_ENV, launcher_restart_policy="Never")
    manifest["metadata"]["labels"][CHECK_LABEL] = pool.name
    policy = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy"}
    return policy | network_policy(job, team.namespace_name), manifest


def resolve(
    config: StackConfig, pool_name: str, queue: str, nodes: int | None
) -> tuple[NodePoolConfig, int]:
    """The pool and node count, refused with CheckError where the check could not run."""
    pools = {p.name: p for p in config.node_pools}
    gpu_pools = sorted(n for n, p in pools.items() if p.gpu)
    pool = pools.get(pool_name)
    if pool is None or not pool.gpu:
        raise CheckError(f"{pool_name!r} is not a GPU pool; allowed: {', '.join(gpu_pools)}")
    teams = {t.name: t for t in config.queues.teams}
    if queue not in teams:
        raise CheckError(
            f"{queue!r} is not a team queue; allowed: {', '.join(teams) or 'none declared'}"
        )
    if pool.max_nodes < 2:
        raise CheckError(
            f"pool {pool.name} has maxNodes {pool.max_nodes}; a fabric check needs 2 nodes "
            "(one node's GPUs talk over NVLink, not the fabric)"
        )
    nodes = nodes or pool.fabric_check.nodes
    if not 2 <= nodes <= pool.max_nodes:
        raise CheckError(f"--nodes {nodes}; allowed: 2 to pool {pool.name}'s {pool.max_nodes}")
    shortfall = queue_shortfall(check_job(pool, queue, nodes), pool, teams[queue])
    if shortfall:
        raise CheckError(f"the check {shortfall}; allowed: fewer --nodes or another queue")
    return pool, nodes


def newest_pod(pods: list[dict]) -> str | None:
    """The name of the newest of the launcher's pods as the API lists them: the check's launcher
    is one pod (restartPolicy Never, backoffLimit 0) whose one run is its log, and a pod left by
    an earlier check of the same name is older."""
    if not pods:
        return None
    return max(pods, key=lambda pod: pod["metadata"]["creationTimestamp"])["metadata"]["name"]


class KubeCluster:
    """The cluster calls the check makes, through the kubernetes client and the kubeconfig."""

    def __init__(self, context: str | None = None):
        from kubernetes import client, config

        try:
            config.load_kube_config(context=context)
        except ConfigException as e:
            raise CheckError(
                f"no cluster credentials: {e} (set KUBECONFIG, or run aws eks update-kubeconfig)"
            ) from None
        self.custom = client.CustomObjectsApi()
        self.core = client.CoreV1Api()
        self.networking = client.NetworkingV1Api()

    def submit(self, policy: dict, mpijob: dict) -> None:
        namespace = mpijob["metadata"]["namespace"]
        self.networking.create_namespaced_network_policy(namespace, policy)
        self.custom.create_namespaced_custom_object(
            MPIJOB_GROUP, MPIJOB_VERSION, namespace, "mpijobs", mpijob
        )

    def conditions(self, namespace: str, name: str) -> dict[str, str]:
        """type -> status of the MPIJob's conditions (mpi-operator v2beta1 JobConditionType)."""
        job = self.custom.get_namespaced_custom_object(
            MPIJOB_GROUP, MPIJOB_VERSION, namespace, "mpijobs", name
        )
        return {c["type"]: c["status"] for c in job.get("status", {}).get("conditions", [])}

    def launcher_log(self, namespace: str, name: str) -> str:
        # mpi-operator v0.8.0 labels the launcher's pods (pkg/controller, defaultLabels).
        selector = f"training.kubeflow.org/job-name={name},training.kubeflow.org/job-role=launcher"
        listed = self.core.list_namespaced_pod(
            namespace, label_selector=selector, _preload_content=False
        )
        pod = newest_pod(json.loads(listed.data)["items"])
        if pod is None:
            return ""
        try:
            # The raw body: client 36 returns a text response as the repr of its bytes
            # ("b'...'", kubernetes-client/python#2596), which the parser would not recognise.
            log = self.core.read_namespaced_pod_log(
                pod, namespace, container=LAUNCHER, _preload_content=False
            )
        except ApiException as e:  # e.g. 400: the launcher is still waiting to start
            reason = (json.loads(e.body or "{}") if e.body else {}).get("message") or e.reason
            raise CheckError(f"the launcher's log (pod {pod}) cannot be read: {reason}") from None
        return log.data.decode("utf-8", errors="replace")

    def delete(self, policy: dict, mpijob: dict) -> None:
        namespace = mpijob["metadata"]["namespace"]
        self.custom.delete_namespaced_custom_object(
            MPIJOB_GROUP,
            MPIJOB_VERSION,
            namespace,
            "mpijobs",
            mpijob["metadata"]["name"],
            propagation_policy="Foreground",
        )
        self.networking.delete_namespaced_network_policy(policy["metadata"]["name"], namespace)


# What talking to the cluster raises: a refusal (with the API server's Status), or no answer.
CLUSTER_ERRORS = (ApiException, HTTPError, OSError)


def cluster_failure(error: Exception) -> str:
    """One line for a CLUSTER_ERRORS exception: the API server's message, or why it is out of
    reach (a kubeconfig whose `aws eks get-token` found no credentials gets a 401 here)."""
    if isinstance(error, ApiException):
        try:
            message = json.loads(error.body)["message"]
        except (TypeError, ValueError, KeyError):
            message = error.reason
        return f"the API server answered {error.status}: {message}"
    return f"cannot reach the Kubernetes API server: {getattr(error, 'reason', None) or error}"


def wait(
    cluster: KubeCluster, namespace: str, name: str, timeout: float, out: TextIO
) -> str | None:
    """'Succeeded' or 'Failed' once the MPIJob ends; None after `timeout` seconds."""
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        conditions = cluster.conditions(namespace, name)
        for end in ("Succeeded", "Failed"):
            if conditions.get(end) == "True":
                return end
        state = ", ".join(t for t, s in conditions.items() if s == "True") or "pending"
        if state != last:
            # Suspended: Kueue has not admitted it yet (quota, or nodes still launching).
            print(f"{name}: {state}", file=out, flush=True)
            last = state
        time.sleep(POLL_SECONDS)
    return None


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m workloads.nccl_check",
        description=__doc__.split("\n\n")[0]
        + " Needs a deployed stack: the cluster (kubeconfig) and the trainer image's digest.",
    )
    parser.add_argument(
        "--stack",
        default="dev",
        help="stack name: reads Pulumi.<stack>.yaml (default: %(default)s)",
    )
    parser.add_argument("--pool", required=True, help="a GPU pool from nodePools")
    parser.add_argument("--queue", required=True, help="the team whose queue admits the check")
    parser.add_argument(
        "--nodes", type=int, help="nodes to run on (default: the pool's fabricCheck.nodes)"
    )
    parser.add_argument(
        "--image",
        help="the trainer image's target for this pool by digest, as pushed by pulumi up "
        "(pulumi stack output trainerImages); default: the stack's image.uri",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the NetworkPolicy and MPIJob, touch no cluster; still needs the image by "
        "digest (default: off)",
    )
    parser.add_argument(
        "--keep", action="store_true", help="leave the MPIJob in the cluster (default: delete it)"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=3600,
        help="seconds to wait for the check to finish (default: %(default)g)",
    )
    parser.add_argument("--context", help="kubeconfig context (default: the current one)")
    return parser


def main(argv: list[str] | None = None, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    args = parser().parse_args(argv)
    config = load_stack_for_command(args.stack)
    if config is None:
        return 2
    try:
        pool, nodes = resolve(config, args.pool, args.queue, args.nodes)
        image = args.image or config.image.uri
        if not image:
            raise CheckError(
                f"which image? pass --image with the trainer image's {image_target(pool)} "
                "target by digest: pulumi stack output trainerImages"
            )
    except CheckError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    plan = pool.fabric_check_plan(nodes)
    policy, mpijob = check_manifests(config, pool, args.queue, nodes, image)
    if args.dry_run:
        yaml.dump_all([policy, mpijob], out, Dumper=PlainDumper, sort_keys=False)
        print(f"# floors: {plan.basis}", file=out)
        return 0
    namespace, name = mpijob["metadata"]["namespace"], mpijob["metadata"]["name"]
    try:
        cluster = KubeCluster(args.context)
        cluster.submit(policy, mpijob)
    except CheckError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except CLUSTER_ERRORS as e:
        print(f"error: the check was not submitted: {cluster_failure(e)}", file=sys.stderr)
        return 2
    print(f"submitted MPIJob {namespace}/{name} to queue {args.queue}", file=out, flush=True)
    try:
        if wait(cluster, namespace, name, args.timeout, out) is None:
            print(f"FAILED: {name} did not finish within {args.timeout:g} s", file=out)
            return 1
        log = cluster.launcher_log(namespace, name)
    except CheckError as e:
        print(f"FAILED: {e}", file=out)
        return 1
    except CLUSTER_ERRORS as e:
        print(f"FAILED: {cluster_failure(e)}", file=out)
        return 1
    finally:
        if not args.keep:
            try:
                cluster.delete(policy, mpijob)
            except CLUSTER_ERRORS as e:
                print(f"could not delete {namespace}/{name}: {cluster_failure(e)}", file=out)
    run = parse_output(log)
    verdict = judge(run, plan, pool.efa)
    print(report(run, plan, verdict), file=out)
    return 0 if verdict.passed else 1


if __name__ == "__main__":
    sys.exit(main())
