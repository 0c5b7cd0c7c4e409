"""Truthful health (issue #13): /healthz follows the event loop's heartbeat, /readyz the latest verdict,
/metrics only on its path; systemd hears READY=1, STATUS= and WATCHDOG=1 on the socket it names."""

from __future__ import annotations

import asyncio
import contextlib
import json
import pathlib
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator

import prometheus_client
import pytest

from healer import errors, health, sdnotify


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def served() -> Iterator[tuple[health.Health, Clock, str]]:
    registry = prometheus_client.CollectorRegistry()
    prometheus_client.Counter("healer_test_total", "a counter", registry=registry)
    clock = Clock()
    h = health.Health(registry, stale_after_s=5.0, clock=clock)
    port = h.serve("127.0.0.1", 0, setting="test.metrics_port")
    try:
        yield h, clock, f"http://127.0.0.1:{port}"
    finally:
        h.close()


def test_ready_and_alive_while_the_loop_beats(served: tuple[health.Health, Clock, str]) -> None:
    h, _, base = served
    h.beat(health.Verdict.of(nats=health.Check(True, "connected")))
    status, body = get(f"{base}/healthz")
    assert status == 200
    assert json.loads(body)["alive"] is True
    status, body = get(f"{base}/readyz")
    assert status == 200
    assert json.loads(body)["checks"]["nats"] == {"ok": True, "detail": "connected"}


def test_a_failing_check_is_not_ready_but_alive(served: tuple[health.Health, Clock, str]) -> None:
    h, _, base = served
    h.beat(health.Verdict.of(nats=health.Check(False, "disconnected"), rules=health.Check(True, "3 rules")))
    assert get(f"{base}/healthz")[0] == 200
    status, body = get(f"{base}/readyz")
    assert status == 503
    doc = json.loads(body)
    assert doc["ready"] is False
    assert doc["checks"]["nats"]["detail"] == "disconnected"


def test_a_stuck_loop_is_neither_alive_nor_ready(served: tuple[health.Health, Clock, str]) -> None:
    h, clock, base = served
    h.beat(health.Verdict.of(nats=health.Check(True, "connected")))
    clock.now += 6.0  # no heartbeat for longer than stale_after_s
    status, body = get(f"{base}/healthz")
    assert status == 503
    assert json.loads(body)["loop"]["ok"] is False
    status, body = get(f"{base}/readyz")
    assert status == 503
    assert json.loads(body)["ready"] is False


def test_metrics_only_on_its_path(served: tuple[health.Health, Clock, str]) -> None:
    _, _, base = served
    status, body = get(f"{base}/metrics")
    assert status == 200
    assert "healer_test_total" in body
    for path in ("/", "/health", "/metrics/x"):
        assert get(f"{base}{path}")[0] == 404


def test_a_busy_port_names_the_setting() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        h = health.Health(prometheus_client.CollectorRegistry())
        with pytest.raises(errors.PermanentError, match=f"127.0.0.1:{port}.*in use.*agent.metrics_port"):
            h.serve("127.0.0.1", port, setting="agent.metrics_port")


@contextlib.contextmanager
def notify_socket(tmp_path: pathlib.Path) -> Iterator[tuple[socket.socket, str]]:
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(5)
    try:
        yield sock, path
    finally:
        sock.close()


def test_sdnotify_sends_one_datagram_to_the_named_socket(tmp_path: pathlib.Path) -> None:
    with notify_socket(tmp_path) as (sock, path):
        assert sdnotify.notify("READY=1", env={"NOTIFY_SOCKET": path}) is True
        assert sock.recv(4096) == b"READY=1"
    assert sdnotify.notify("READY=1", env={}) is False


async def test_the_heartbeat_tells_systemd_started_status_and_watchdog(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with notify_socket(tmp_path) as (sock, path):
        monkeypatch.setenv("NOTIFY_SOCKET", path)
        h = health.Health(prometheus_client.CollectorRegistry())
        verdicts = iter(
            [
                health.Verdict.of(nats=health.Check(False, "connecting")),
                health.Verdict.of(nats=health.Check(True, "ok")),
            ]
        )
        last = health.Verdict.of(nats=health.Check(True, "ok"))
        task = asyncio.create_task(h.keep(lambda: next(verdicts, last), interval_s=0.05))
        try:
            got = [await asyncio.to_thread(sock.recv, 4096) for _ in range(5)]
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    assert got[0] == b"READY=1\nSTATUS=not ready: nats: connecting"
    assert got[1] == b"WATCHDOG=1"
    assert got[2] == b"STATUS=ready"
    assert got[3:] == [b"WATCHDOG=1", b"WATCHDOG=1"]
