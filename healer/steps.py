"""Report a training job's step (iteration) times to healer, from inside the job: stdlib only (#28).

healer finds a GPU or node that makes a whole job slow from telemetry alone; a job that also reports
its step times lets the controller confirm the slowdown and say by how much and since when
("job 4711 runs 18 % slower since 09:12; rank 5 on gpu-07/GPU 5 is the outlier"). Nothing here
imports anything outside the standard library, so any training script can copy or import it.

    reporter = healer.steps.StepReporter(job=os.environ["SLURM_JOB_ID"], rank=rank)
    for step in range(steps):
        t0 = time.monotonic()
        train_one_step()
        reporter.report(time.monotonic() - t0, step=step)

Messages (schema ``healer.steps.v1``, docs/schemas/step-report.v1.json) go to ``<prefix>.steps.<job>``
with the NATS text protocol over a plain TCP socket (``nats://[user:password@]host:port``; no TLS here:
give ``publish`` a callable of your own client to use one). Reporting never raises into the training
loop: a failure is counted (``failed``), the connection is tried again at the next report, at most every
``retry_s``. A PING from the server is answered at the next report (the server allows two unanswered,
two minutes apart), so report at least once a minute or so.
"""

from __future__ import annotations

import json
import os
import select
import socket
import time
import urllib.parse
from collections.abc import Callable
from typing import Final

SCHEMA: Final = "healer.steps.v1"
DEFAULT_URL = "nats://127.0.0.1:4222"
_ESCAPES = {"%": "%25", ".": "%2E", "*": "%2A", ">": "%3E", " ": "%20"}


def subject(job: str, prefix: str = "healer") -> str:
    """``<prefix>.steps.<job>``, the job id escaped into one token as healer.bus.subjects escapes it."""
    return f"{prefix}.steps." + "".join(_ESCAPES.get(ch, ch) for ch in job)


def message(
    job: str,
    rank: int,
    step_time_s: float,
    *,
    step: int | None = None,
    compute_s: float | None = None,
    node: str | None = None,
    gpu: int | None = None,
    ts: float | None = None,
) -> bytes:
    doc: dict[str, object] = {"schema": SCHEMA, "job": job, "rank": rank, "step_time_s": float(step_time_s)}
    for key, value in (("step", step), ("compute_s", compute_s), ("node", node), ("gpu", gpu)):
        if value is not None:
            doc[key] = value
    doc["ts"] = time.time() if ts is None else ts
    return json.dumps(doc, separators=(",", ":")).encode()


class StepReporter:
    """One rank's reporter. ``publish(subject, payload)``: your own transport instead of the socket."""

    def __init__(
        self,
        job: str,
        rank: int,
        *,
        url: str | None = None,
        prefix: str = "healer",
        node: str | None = None,
        gpu: int | None = None,
        publish: Callable[[str, bytes], None] | None = None,
        timeout_s: float = 2.0,
        retry_s: float = 30.0,
    ) -> None:
        self.job, self.rank = job, rank
        self.url = url or os.environ.get("HEALER_NATS_URL", DEFAULT_URL)
        self.subject = subject(job, prefix)
        self.node = node or socket.gethostname().split(".")[0]
        local = os.environ.get("LOCAL_RANK")
        self.gpu = gpu if gpu is not None else (int(local) if local and local.isdigit() else None)
        self._publish = publish
        self.timeout_s, self.retry_s = timeout_s, retry_s
        self._sock: socket.socket | None = None
        self._tried_at = -float("inf")
        self.sent = 0
        self.failed = 0

    def report(self, step_time_s: float, *, step: int | None = None, compute_s: float | None = None) -> bool:
        """Publish one step's time; False (counted in ``failed``) when it could not be sent."""
        payload = message(
            self.job, self.rank, step_time_s, step=step, compute_s=compute_s, node=self.node, gpu=self.gpu
        )
        try:
            if self._publish is not None:
                self._publish(self.subject, payload)
            else:
                self._send(payload)
        except (OSError, ValueError):
            self.failed += 1
            self.close()
            return False
        self.sent += 1
        return True

    def _send(self, payload: bytes) -> None:
        sock = self._sock or self._connect()
        self._answer_pings(sock)
        sock.sendall(b"PUB %s %d\r\n%s\r\n" % (self.subject.encode(), len(payload), payload))

    def _connect(self) -> socket.socket:
        now = time.monotonic()
        if now - self._tried_at < self.retry_s:
            raise OSError("not connected (next try later)")
        self._tried_at = now
        u = urllib.parse.urlsplit(self.url)
        sock = socket.create_connection((u.hostname or "127.0.0.1", u.port or 4222), timeout=self.timeout_s)
        try:
            info = sock.makefile("rb").readline()
            if not info.startswith(b"INFO "):
                raise ValueError(f"not a NATS server: {info[:40]!r}")
            opts: dict[str, object] = {"verbose": False, "pedantic": False}
            opts["name"] = f"healer-steps-{self.rank}"
            if u.username:
                opts["user"] = urllib.parse.unquote(u.username)
                opts["pass"] = urllib.parse.unquote(u.password or "")
            sock.sendall(b"CONNECT " + json.dumps(opts).encode() + b"\r\n")
        except (OSError, ValueError):
            sock.close()
            raise
        self._sock = sock
        return sock

    def _answer_pings(self, sock: socket.socket) -> None:
        while select.select([sock], [], [], 0)[0]:
            data = sock.recv(4096)
            if not data:
                raise OSError("connection closed by the server")
            if b"-ERR" in data:
                raise OSError(data.decode(errors="replace").strip())
            for _ in range(data.count(b"PING")):
                sock.sendall(b"PONG\r\n")

    def flush(self) -> None:
        """Make sure what was sent reached the server (a PING answered by a PONG)."""
        if self._sock is None:
            return
        self._sock.sendall(b"PING\r\n")
        self._sock.settimeout(self.timeout_s)
        buf = b""
        while b"PONG" not in buf:
            chunk = self._sock.recv(4096)
            if not chunk:
                raise OSError("connection closed by the server")
            if b"-ERR" in chunk:
                raise OSError(chunk.decode(errors="replace").strip())
            buf += chunk

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None
