"""The torchrun helper a distributed DevServer's pods run (what `devctl run` starts on each pod),
run here as two "pods" on localhost with gloo: node ranks, world size and master from the env."""

import os
import socket
import subprocess
import sys
from pathlib import Path

from devservers.render import ENTRYPOINT, TORCHRUN

# Each process reports in its own file: four processes sharing two pipes may interleave lines.
SCRIPT = """
import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
with open(os.path.join(sys.argv[1], f"rank-{dist.get_rank()}"), "w") as out:
    out.write(f"rank {dist.get_rank()} of {dist.get_world_size()}: sum {total.item():.0f}")
dist.destroy_process_group()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_scripts_are_valid_shell():
    for script in (ENTRYPOINT, TORCHRUN):
        assert subprocess.run(["sh", "-n"], input=script, text=True).returncode == 0


def test_two_pods_run_one_torchrun_group(tmp_path):
    helper = tmp_path / "torchrun.sh"
    helper.write_text(TORCHRUN)
    helper.chmod(0o755)
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {
        **os.environ,
        # torchrun from this environment, as the image has it on PATH
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "WORLD_SIZE": "2",
        "NPROC_PER_NODE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "OMP_NUM_THREADS": "1",
    }
    pods = [
        subprocess.Popen(
            [str(helper), str(script), str(tmp_path)],
            env={**env, "RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(2)
    ]
    outputs = [p.communicate(timeout=240)[0] for p in pods]
    assert [p.returncode for p in pods] == [0, 0], outputs
    lines = sorted(p.read_text() for p in tmp_path.glob("rank-*"))
    # 2 pods x 2 processes: global ranks 0-3, and every one sees 1+2+3+4.
    assert lines == [f"rank {r} of 4: sum 10" for r in range(4)]
