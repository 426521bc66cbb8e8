"""Is anyone using a DevServer? Parsers for what the operator reads from its pods and DCGM.

Activity is: an SSH session, a process the server did not start itself (a training run left
behind `nohup`, a tmux with a shell, a notebook), or GPU utilization above a floor.
"""

import re
from collections import Counter
from dataclasses import dataclass

# Run in the container by the operator: the command name of every process.
PROBE = ["sh", "-c", "cat /proc/[0-9]*/comm 2>/dev/null; true"]
# What an unused server runs: its entrypoint and sshd's listener, plus the probe itself.
BASELINE = frozenset({"start.sh", "sshd", "sleep", "sh", "cat", "tini", "dumb-init", "pause"})
# OpenSSH 9.8+ serves each session in two `sshd-session` processes; older ones fork two `sshd`
# per session beside the listener.
SESSION = "sshd-session"
GPU_IDLE_PERCENT = 5.0
GPU_UTIL_METRIC = "DCGM_FI_DEV_GPU_UTIL"


@dataclass(frozen=True)
class PodActivity:
    ssh_sessions: int
    user_processes: tuple[str, ...]

    @property
    def active(self) -> bool:
        return bool(self.ssh_sessions or self.user_processes)


def pod_activity(process_names: str) -> PodActivity:
    """Activity from the PROBE's output (one process name per line)."""
    names = Counter(line.strip() for line in process_names.splitlines() if line.strip())
    session_processes = names[SESSION] + max(names["sshd"] - 1, 0)
    sessions = (session_processes + 1) // 2
    user = tuple(sorted(n for n in names if n not in BASELINE and n != SESSION))
    return PodActivity(ssh_sessions=sessions, user_processes=user)


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
    """Seconds in a duration such as 2h, 90m or 1h30m (the CRD's idleTimeout pattern)."""
    return sum(
        int(n) * {"h": 3600, "m": 60, "s": 1}[unit] for n, unit in re.findall(r"(\d+)([hms])", text)
    )
