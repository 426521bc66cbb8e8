"""Real TensorBoard over event files, read through its HTTP data API, and its scalars page as a
headless Chromium renders it (no internet: TensorBoard serves its whole frontend itself).

Endpoints of TensorBoard 2.20 (tensorboard/plugins/scalar/scalars_plugin.py, core_plugin.py):
/data/runs lists the runs, /data/plugin/scalars/tags their tags, and
/data/plugin/scalars/scalars?run=R&tag=T the points of one series as [wall_time, step, value].
"""

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

from PIL import Image

# The first run's line colour on TensorBoard's scalars charts (its run colour palette).
FIRST_RUN_COLOUR = (255, 112, 67)
# Chromium's flags for a headless, offline, reproducible page load as root (Debian's chromium).
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1000",
    # Run the page's timers and fetches for up to this much (virtual) time before the shot.
    "--virtual-time-budget=15000",
]


@contextlib.contextmanager
def tensorboard(logdir: str, log: Path, env: dict | None = None):
    """TensorBoard serving `logdir` on a free loopback port; yields its base URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with log.open("w") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "tensorboard.main", "--logdir", logdir, "--host", "127.0.0.1"]
            + ["--port", str(port), "--reload_interval", "1"],
            env={**os.environ, **(env or {})},
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait(lambda: get(url, "/data/runs") is not None, f"TensorBoard at {url}", process, log)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=20)


def get(url: str, path: str, **query: str):
    """The JSON answer of TensorBoard's `path`; None while it cannot answer."""
    address = f"{url}{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
    try:
        with urllib.request.urlopen(address, timeout=10) as response:
            return json.load(response)
    except OSError:
        return None


def wait(check, what: str, process: subprocess.Popen, log: Path, timeout: float = 90):
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert process.poll() is None, f"TensorBoard exited:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)
    return found


def series(url: str, run: str, tag: str, steps: int, timeout: float = 90) -> list[tuple]:
    """[(step, value)] of a series once TensorBoard has loaded at least `steps` points of it."""
    deadline = time.monotonic() + timeout
    while True:
        points = get(url, "/data/plugin/scalars/scalars", run=run, tag=tag) or []
        if len(points) >= steps or time.monotonic() > deadline:
            return [(step, value) for _, step, value in points]
        time.sleep(0.2)


def screenshot(page: str, path: Path) -> Image.Image:
    """`page` as headless Chromium renders it, saved at `path`."""
    chromium = shutil.which("chromium")
    assert chromium, "chromium is missing: run tools/system-packages.sh"
    profile = path.with_suffix(".profile")  # fresh: no cache, no state from another run
    result = subprocess.run(
        [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--screenshot={path}", page],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0 and path.exists(), result.stderr[-3000:]
    return Image.open(path).convert("RGB")


def line_pixels(image: Image.Image, left: int, colour=FIRST_RUN_COLOUR) -> list[tuple[int, int]]:
    """Where `image` is drawn in a run's colour right of x = `left` (the charts, not the runs
    list at the left, whose checkbox has that colour too)."""
    width, height = image.size
    pixels = image.load()
    return [
        (x, y)
        for x in range(left, width)
        for y in range(height)
        if sum(abs(a - b) for a, b in zip(pixels[x, y], colour, strict=True)) < 30
    ]
