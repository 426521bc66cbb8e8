"""Is anyone using a DevServer? What the operator reads from its pods and DCGM, and the rule.

A server is in use while it has an SSH session, or a process the owner named in
lifecycle.keepAliveProcesses, or (GPU servers) a GPU above the idle floor, or (servers without
a GPU figure: CPU flavors, or a GPU node whose DCGM exporter reports nothing) CPU use above the
idle floor between two checks. A shell left in tmux, an idle Jupyter kernel or an editor server
is none of these, so it does not keep a server alive.
"""

import re
from collections import Counter
from dataclasses import dataclass

# Run in the container by the operator: every process's /proc/<pid>/stat, one line each.
PROBE = ["sh", "-c", "cat /proc/[0-9]*/stat 2>/dev/null; true"]
# What an unused server runs: its entrypoint and sshd's listener, plus the probe itself.
BASELINE = frozenset({"start.sh", "sshd", "sleep", "sh", "cat", "tini", "dumb-init", "pause"})
# OpenSSH 9.8+ serves each session in two `sshd-session` processes; older ones fork two `sshd`
# per session beside the listener.
SESSION = "sshd-session"
# keepAliveProcesses entry meaning: any process the server did not start itself.
ANY_PROCESS = "*"
# /proc/<pid>/stat counts CPU time in clock ticks of USER_HZ, 100 on every architecture Linux
# builds (include/asm-generic/param.h; fs/proc/array.c do_task_stat, nsec_to_clock_t).
USER_HZ = 100
GPU_UTIL_METRIC = "DCGM_FI_DEV_GPU_UTIL"


class ProbeCut(OSError):
    """An exec into a pod that did not answer, finish or stay within its output bound (the
    operator's cluster boundary cuts it): what a pod whose shell hangs or floods gives."""


@dataclass(frozen=True)
class PodActivity:
    ssh_sessions: int
    user_processes: tuple[str, ...]  # names (comm, 15 characters at most) not in BASELINE
    cpu_seconds: float  # of every process alive, with the children each has waited for


def pod_activity(stat_lines: str) -> PodActivity:
    """Activity from the PROBE's output: `pid (comm) state ppid ...` per process (proc(5)).

    comm may hold spaces and parentheses, so the fields are counted after its last `)`: utime,
    stime, cutime and cstime are fields 14 to 17. A process that exits is counted in its parent's
    cutime/cstime once waited for, so the pod's sum grows with every process that ran in it."""
    names: Counter[str] = Counter()
    ticks = 0
    for line in stat_lines.splitlines():
        head, _, tail = line.rpartition(")")
        if "(" not in head:
            continue
        names[head.partition("(")[2]] += 1
        fields = tail.split()
        ticks += sum(int(f) for f in fields[11:15])  # fields 14-17, after pid, comm and state
    session_processes = names[SESSION] + max(names["sshd"] - 1, 0)
    return PodActivity(
        ssh_sessions=(session_processes + 1) // 2,
        user_processes=tuple(sorted(n for n in names if n not in BASELINE and n != SESSION)),
        cpu_seconds=ticks / USER_HZ,
    )


@dataclass(frozen=True)
class IdleRule:
    """What counts as use below which a server is idle (platform defaults, per server)."""

    gpu_percent: float  # the busiest GPU of the server's pods, as DCGM reports it
    cpu_percent: float  # the busiest pod's CPU use between two checks, in % of one core
    keep_alive: tuple[str, ...] = ()  # process names that count as use; ANY_PROCESS: any

    def describe(self, gpu_measured: bool) -> str:
        use = (
            f"GPUs at or below {self.gpu_percent:g}%"
            if gpu_measured
            else f"CPU at or below {self.cpu_percent:g}% of a core"
        )
        kept = f", no process of {', '.join(self.keep_alive)}" if self.keep_alive else ""
        return f"no SSH session{kept} and {use}"


def in_use(
    pods: list[PodActivity], gpu: float | None, cpu: float | None, rule: IdleRule
) -> str | None:
    """Why the server is in use (the same words while the reason holds), or None when `rule`
    finds it idle. `gpu` is DCGM's figure (None without one); `cpu` the CPU use since the last
    check, for servers without `gpu`."""
    if any(p.ssh_sessions for p in pods):
        return "an SSH session"
    kept = sorted(
        name
        for p in pods
        for name in p.user_processes
        if name in rule.keep_alive or ANY_PROCESS in rule.keep_alive
    )
    if kept:
        return f"process {kept[0]} (keepAliveProcesses)"
    if gpu is not None:
        return f"GPU above {rule.gpu_percent:g}%" if gpu > rule.gpu_percent else None
    if cpu is not None and cpu > rule.cpu_percent:
        return f"CPU above {rule.cpu_percent:g}% of a core"
    return None


_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][\w:]*)\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def gpu_utilization(metrics: str, namespace: str, pods: set[str]) -> float | None:
    """Highest GPU utilization (percent) of `pods` in a DCGM exporter's Prometheus text, or None
    when the exporter reports no GPU of theirs."""
    found = []
    for line in metrics.splitlines():
        match = _SAMPLE.match(line)
        if not match or match["name"] != GPU_UTIL_METRIC:
            continue
        labels = dict(_LABEL.findall(match["labels"]))
        if labels.get("namespace") == namespace and labels.get("pod") in pods:
            found.append(float(match["value"]))
    return max(found) if found else None


def parse_duration(text: str) -> int:
    """Seconds in a duration such as 2h, 90m or 1h30m (the CRD's idleTimeout pattern), or 7d."""
    units = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    return sum(int(n) * units[unit] for n, unit in re.findall(r"(\d+)([dhms])", text))
