"""Clean starts: a fresh ``healer controller --model models/default`` and a fresh ``healer demo`` (what
``make demo`` runs) print no traceback. Both logged ``controller.tick_crashed`` with a numpy broadcast
error on every start, the model's thermal state stepped against a fleet of no nodes yet."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from healer.bus import embedded

ROOT = pathlib.Path(__file__).resolve().parents[2]
BAD = ("Traceback", "tick_crashed", "Error:")


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("HEALER_")}


def _assert_clean(output: str) -> None:
    found = [line for line in output.splitlines() if any(b in line for b in BAD)]
    assert not found, "\n".join(found[:20])


@pytest.mark.nats
@pytest.mark.slow
def test_a_fresh_controller_with_the_model_prints_no_traceback(
    nats_server: embedded.EmbeddedServer, tmp_path: pathlib.Path
) -> None:
    log = tmp_path / "controller.log"
    env = {**_env(), "HEALER_LOG_FORMAT": "json", "HEALER_CONTROLLER_TICK_S": "0.2",
           "HEALER_CONTROLLER_ADMISSION": "first-seen"}  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "healer", "controller", "--model", "models/default", "--nats",
             nats_server.url, "--metrics-port", "0"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while "controller.took_over" not in log.read_text() and proc.poll() is None:
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        time.sleep(3.0)  # 15 ticks, each of which scored the (empty) fleet
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert "anomaly_model_loaded" in text, text[-3000:]
    _assert_clean(text)


@pytest.mark.slow
def test_a_fresh_demo_prints_no_traceback() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "healer", "demo", "--duration", "20", "--json"],
        cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    _assert_clean(out + err)
