"""A real Alertmanager (Debian's ``prometheus-alertmanager``) for tests, and the webhook it notifies.

``real_alertmanager`` starts the binary on a free loopback port with a temp config and storage directory,
clustering off, every alert routed (grouped by ``cluster``, no group wait) to a webhook receiver served by
the test. It is stopped by its PID. Without the binary the tests skip, unless ``CI`` is set: there a
missing Alertmanager is a failure (``.ci/run`` installs it).
"""

from __future__ import annotations

import dataclasses
import http.server
import json
import os
import pathlib
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from healer.bus import embedded

BINARY = "prometheus-alertmanager"
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/bin", "/usr/sbin"])


class Webhook:
    """Collects Alertmanager's webhook notifications (JSON payloads with ``status`` and ``alerts``)."""

    def __init__(self) -> None:
        self.port = embedded.free_port()
        self.payloads: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        hook = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with hook._lock:
                    hook.payloads.append(json.loads(body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                return

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/alerts"

    def notified(self) -> list[tuple[str, dict[str, str]]]:
        """(status of the alert, its labels) for every alert in every notification, in arrival order."""
        with self._lock:
            return [(a["status"], a["labels"]) for p in self.payloads for a in p["alerts"]]

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


@dataclasses.dataclass
class Alertmanager:
    url: str
    process: subprocess.Popen[bytes]
    webhook: Webhook
    version: str

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=5) as resp:
            return json.loads(resp.read())

    def post(self, path: str, doc: object) -> Any:
        req = urllib.request.Request(
            self.url + path,
            data=json.dumps(doc).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=5) as resp:
            body = resp.read()
        return json.loads(body) if body else None

    def alerts(self) -> list[dict[str, Any]]:
        return list(self.get("/api/v2/alerts"))


CONFIG = """\
route:
  receiver: hook
  group_by: [cluster]
  group_wait: 0s
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: hook
    webhook_configs:
      - url: {url}
        send_resolved: true
"""


def _binary() -> str | None:
    return shutil.which(BINARY, path=SEARCH_PATH)


@pytest.fixture
def real_alertmanager(tmp_path: pathlib.Path) -> Iterator[Alertmanager]:
    binary = _binary()
    if binary is None:
        message = f"{BINARY} is not installed (apt-get install prometheus-alertmanager; .ci/run does)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30, check=True)
    webhook = Webhook()
    conf = tmp_path / "alertmanager.yml"
    conf.write_text(CONFIG.format(url=webhook.url))
    storage = tmp_path / "am-data"
    storage.mkdir()
    port = embedded.free_port()
    log = (tmp_path / "alertmanager.log").open("wb")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={conf}",
            f"--storage.path={storage}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    am = Alertmanager(
        f"http://127.0.0.1:{port}", proc, webhook, (version.stdout or version.stderr).split("\n")[0]
    )
    try:
        _wait_ready(am, tmp_path / "alertmanager.log")
        yield am
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()
        webhook.stop()


def _wait_ready(am: Alertmanager, log_path: pathlib.Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if am.process.poll() is not None:
            raise RuntimeError(f"alertmanager exited {am.process.returncode}: {log_path.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(am.url + "/-/ready", timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"alertmanager not ready after 30 s: {log_path.read_text()[-2000:]}")
