"""Real TensorBoard over event files, read through its HTTP data API, and its scalars page as a
headless Chromium renders it (no internet: TensorBoard serves its whole frontend itself).

Endpoints of TensorBoard 2.20 (tensorboard/plugins/scalar/scalars_plugin.py, core_plugin.py):
/data/runs lists the runs, /data/plugin/scalars/tags their tags, and
/data/plugin/scalars/scalars?run=R&tag=T the points of one series as [wall_time, step, value].

Its scalars dashboard reads some settings from the page's URL fragment (`_smoothingWeight`,
`tagFilter`) and others only from the origin's localStorage, "Ignore outliers in chart scaling"
(`_ignoreYOutliers`, on by default) among them (webfiles.zip index.js: tf_storage's initializers
with useLocalStorage). A page can set those only from TensorBoard's own origin: `with_settings`
puts TensorBoard behind a local proxy that also serves a page storing them.
"""

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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


SETTINGS_PAGE = "/settings.html"


@contextlib.contextmanager
def with_settings(url: str, settings: dict[str, str]):
    """TensorBoard at `url` behind a loopback proxy, an origin whose localStorage a fresh browser
    profile has empty, which also serves SETTINGS_PAGE: that page stores `settings` there and
    opens TensorBoard at its own fragment (`<proxy>/settings.html#scalars&...`). Yields the
    proxy's URL."""
    script = (
        f"for (const [key, value] of Object.entries({json.dumps(settings)})) "
        "localStorage.setItem(key, value); location.replace('/' + location.hash);"
    )
    page = f"<!doctype html><script>{script}</script>".encode()

    class Proxy(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == SETTINGS_PAGE:
                self.answer(200, "text/html", page)
                return
            length = int(self.headers.get("Content-Length") or 0)
            # Everything but what names this hop or asks for compression: bodies pass as they are.
            skip = {"host", "connection", "accept-encoding"}
            headers = {k: v for k, v in self.headers.items() if k.lower() not in skip}
            body = self.rfile.read(length) if length else None
            request = urllib.request.Request(url + self.path, body, headers, method=self.command)
            try:
                with urllib.request.urlopen(request, timeout=30) as answer:
                    self.answer(answer.status, answer.headers["Content-Type"], answer.read())
            except urllib.error.HTTPError as refused:
                self.answer(refused.code, refused.headers["Content-Type"], refused.read())

        do_POST = do_GET

        def answer(self, status: int, content_type: str | None, body: bytes) -> None:
            self.send_response(status)
            if content_type:
                self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:  # the test's output is TensorBoard's log
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


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


def line_heights(chart: Image.Image, steps: list[int], colour=FIRST_RUN_COLOUR) -> list[float]:
    """How high (y, down from the top) a chart draws a run's line (`colour`) at each of `steps`,
    its logged steps in order: the line's ends are the first and last, the steps between fall
    where a linear step axis puts them. An empty list if nothing is drawn in that colour."""
    pixels = chart.load()
    columns: dict[int, list[int]] = {}
    for x in range(chart.width):
        for y in range(chart.height):
            if sum(abs(a - b) for a, b in zip(pixels[x, y], colour, strict=True)) < 30:
                columns.setdefault(x, []).append(y)
    if not columns:
        return []
    first, last = min(columns), max(columns)
    heights = []
    for step in steps:
        x = round(first + (step - steps[0]) / (steps[-1] - steps[0]) * (last - first))
        near = [y for column in range(x - 1, x + 2) for y in columns.get(column, [])]
        heights.append(sum(near) / len(near) if near else float("nan"))
    return heights
