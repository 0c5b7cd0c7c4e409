"""Truthful health over HTTP, for the agent, the controller and the forwarder.

``/healthz`` answers whether the process's event loop is alive: the loop stamps a heartbeat every
second (``Health.keep``) and the HTTP thread only reads it, so a loop that is blocked or dead shows as
503 once the stamp is older than ``stale_after_s``. ``/readyz`` answers whether the process can do its
job (connected, rules loaded, ...): the loop computes a ``Verdict`` with each heartbeat and the HTTP
thread serves the latest one, so a stuck loop is also not ready. Both bodies are JSON. ``/metrics`` is
Prometheus's text format; every other path is 404. The same heartbeat tells systemd ``READY=1`` (first
beat: started), ``STATUS=`` (the verdict, when it changes) and ``WATCHDOG=1`` (every beat) through
``sdnotify``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import http.server
import json
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import prometheus_client
import structlog

from healer import errors, sdnotify

log = structlog.get_logger(__name__)

STALE_AFTER_S = 15.0
"""A heartbeat older than this means the event loop is stuck: /healthz and /readyz answer 503."""


@dataclasses.dataclass(frozen=True)
class Check:
    ok: bool
    detail: str


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Whether a process is ready, with every check that decided it (names are stable, for people)."""

    checks: Mapping[str, Check]

    @property
    def ready(self) -> bool:
        return all(c.ok for c in self.checks.values())

    @classmethod
    def of(cls, **checks: Check) -> Verdict:
        return cls(dict(checks))

    def summary(self) -> str:
        """One line: ``ready`` or what is not (``not ready: nats: connecting to ...``)."""
        failing = [f"{name}: {c.detail}" for name, c in self.checks.items() if not c.ok]
        return "ready" if not failing else "not ready: " + "; ".join(failing)

    def as_json(self) -> dict[str, Any]:
        return {
            "ready": self.ready,
            "checks": {name: {"ok": c.ok, "detail": c.detail} for name, c in self.checks.items()},
        }


STARTING = Verdict.of(started=Check(False, "starting"))


class Health:
    """The state the HTTP thread serves; written only by ``beat`` (on the event loop)."""

    def __init__(
        self,
        registry: prometheus_client.CollectorRegistry,
        *,
        stale_after_s: float = STALE_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = registry
        self.stale_after_s = stale_after_s
        self.clock = clock
        self._lock = threading.Lock()
        self._beat_at = clock()
        self._verdict = STARTING
        self._server: http.server.ThreadingHTTPServer | None = None
        self._notified_ready = False
        self._status = ""

    def beat(self, verdict: Verdict) -> None:
        with self._lock:
            self._beat_at = self.clock()
            self._verdict = verdict

    def snapshot(self) -> tuple[float, Verdict]:
        """(seconds since the last heartbeat, the verdict it carried)."""
        with self._lock:
            return self.clock() - self._beat_at, self._verdict

    async def keep(
        self,
        readiness: Callable[[], Verdict],
        interval_s: float = 1.0,
        served: Callable[[Verdict], None] | None = None,
    ) -> None:
        """Heartbeat until cancelled: stamp, compute readiness, tell systemd. Owned by the caller.
        ``served``: told each verdict once /readyz serves it (what must agree with it, follows it)."""
        while True:
            try:
                verdict = readiness()
            except Exception as e:  # a readiness bug must not look like a dead loop
                verdict = Verdict.of(readiness=Check(False, f"readiness check failed: {e!r}"))
            self.beat(verdict)
            if served is not None:
                served(verdict)
            status = verdict.summary()
            if not self._notified_ready:
                # systemd's READY=1 means "started" (the loop runs, signals are handled); whether the
                # process can do its work is /readyz's question and STATUS= says it in systemctl status
                self._notified_ready = True
                sdnotify.notify(f"READY=1\nSTATUS={status}")
            elif status != self._status:
                sdnotify.notify(f"STATUS={status}")
            self._status = status
            sdnotify.notify("WATCHDOG=1")
            await asyncio.sleep(interval_s)

    # -- HTTP --------------------------------------------------------------------------------------
    def serve(self, addr: str, port: int, *, setting: str) -> int:
        """Listen on ``addr:port`` in a daemon thread; returns the port (useful with 0). A busy or
        forbidden port is a ``PermanentError`` naming ``setting``."""
        health = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                health._answer(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        try:
            server = http.server.ThreadingHTTPServer((addr, port), Handler)
        except OSError as e:
            why = "already in use" if e.errno == errno.EADDRINUSE else (e.strerror or str(e))
            raise errors.PermanentError(
                f"cannot listen on {addr}:{port} for /metrics, /healthz and /readyz: {why}; "
                f"set {setting} to a free port (0 turns it off)"
            ) from e
        server.daemon_threads = True
        self._server = server
        threading.Thread(target=server.serve_forever, name="healer-http", daemon=True).start()
        return int(server.server_address[1])

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def _answer(self, req: http.server.BaseHTTPRequestHandler) -> None:
        path = req.path.split("?", 1)[0]
        if path == "/metrics":
            body = prometheus_client.generate_latest(self.registry)
            self._send(req, 200, body, prometheus_client.CONTENT_TYPE_LATEST)
            return
        if path not in ("/healthz", "/readyz"):
            self._send(req, 404, b"not found: try /metrics, /healthz or /readyz\n", "text/plain")
            return
        age, verdict = self.snapshot()
        alive = age <= self.stale_after_s
        loop = {"ok": alive, "heartbeat_age_s": round(age, 3)}
        if path == "/healthz":
            doc: dict[str, Any] = {"alive": alive, "loop": loop}
            status = 200 if alive else 503
        else:
            doc = verdict.as_json()
            if not alive:
                doc["ready"] = False
            doc["loop"] = loop
            status = 200 if doc["ready"] else 503
        self._send(req, status, json.dumps(doc).encode() + b"\n", "application/json")

    @staticmethod
    def _send(req: http.server.BaseHTTPRequestHandler, status: int, body: bytes, ctype: str) -> None:
        req.send_response(status)
        req.send_header("Content-Type", ctype)
        req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        req.wfile.write(body)
