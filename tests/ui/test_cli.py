"""``healer ui`` as an SRE runs it: a process that prints its URL, serves the page and stops on SIGTERM."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import urllib.request

import pytest

from healer.bus import embedded

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.nats
def test_healer_ui_prints_its_url_serves_the_page_and_stops_on_sigterm(
    nats_server: embedded.EmbeddedServer,
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEALER_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "healer", "ui", "--nats", nats_server.url, "--port", "0"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("healer ui: http://127.0.0.1:"), line
        url = line.split()[-1]
        with urllib.request.urlopen(url, timeout=10) as r:
            page = r.read().decode()
            assert r.headers["Content-Security-Policy"].startswith("default-src 'none'")
        assert '<canvas id="map"' in page
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
        assert proc.returncode == 0, err[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_healer_ui_with_a_dead_nats_fails_with_one_line(tmp_path: pathlib.Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEALER_")}
    env["HEALER_RETRY_INITIAL_DELAY_S"] = "0.05"
    out = subprocess.run(
        [sys.executable, "-m", "healer", "ui", "--nats", "nats://127.0.0.1:1", "--port", "0"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 1
    assert "healer ui: cannot connect to NATS at nats://127.0.0.1:1" in out.stderr
