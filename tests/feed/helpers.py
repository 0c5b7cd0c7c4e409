"""Playing the controller (publishing incident events) and an HTTP receiver, for the feed tests."""

from __future__ import annotations

import dataclasses
import http.server
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

import orjson

from healer.bus import base, subjects
from healer.bus import nats as natsbus
from healer.schemas import codec, incidents

SUBJ = subjects.Subjects()


def event(
    n: int,
    *,
    node: str = "gpu-node-1",
    change: incidents.Change = incidents.Change.OPENED,
    severity: incidents.Severity = "major",
    gpu_index: int | None = 3,
    mode: incidents.Mode = incidents.Mode.ENFORCE,
    actions: list[incidents.ActionRecord] | None = None,
) -> incidents.IncidentEvent:
    data = incidents.IncidentData(
        incident_id=f"inc-{n}",
        rule_id="ecc-uncorrectable",
        severity=severity,
        node=node,
        gpu_index=gpu_index,
        gpu_uuid=None if gpu_index is None else f"GPU-{n:04d}",
        state="open",
        summary=f"event number {n}",
        evidence={"ecc_dbe_volatile": n},
        actions=actions or [],
        mode=mode,
    )
    return incidents.build(event_id=f"ev-{n}", cluster="test", change=change, data=data, ts=time.time())


async def publish(bus: base.Bus, ev: incidents.IncidentEvent) -> None:
    stored = await bus.publish_durable(SUBJ.incident(ev.change, ev.data.node), codec.encode(ev), msg_id=ev.id)
    assert stored


async def publish_raw(bus: natsbus.NatsBus, subject: str, data: bytes) -> None:
    await bus.js.publish(subject, data)


@dataclasses.dataclass
class Request:
    ce_id: str | None
    """The event id: the ``ce-id`` header in binary mode, the body's ``id`` in structured mode."""
    content_type: str | None
    body: bytes
    status: int
    headers: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def body_id(self) -> str:
        return str(orjson.loads(self.body)["id"])


def _event_id(headers: dict[str, str], body: bytes) -> str | None:
    lower = {k.lower(): v for k, v in headers.items()}
    if "ce-id" in lower:
        return lower["ce-id"]
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return str(doc["id"]) if isinstance(doc, dict) and "id" in doc else None


class Receiver:
    """An HTTP receiver on a loopback port that can be down (not listening), failing, or up.

    ``answer(ce_id)`` picks the status of each request; everything received is kept in ``requests``.
    """

    def __init__(self, port: int, answer: Callable[[str | None], int] = lambda _id: 200) -> None:
        self.port = port
        self.answer = answer
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def start(self) -> None:
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                headers = dict(self.headers.items())
                ce_id = _event_id(headers, body)
                status = receiver.answer(ce_id)
                with receiver._lock:
                    receiver.requests.append(
                        Request(ce_id, self.headers.get("Content-Type"), body, status, headers)
                    )
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"no" if status >= 300 else b"ok")

            def log_message(self, format: str, *args: object) -> None:
                return

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def snapshot(self) -> list[Request]:
        with self._lock:
            return list(self.requests)

    def accepted_ids(self) -> list[str]:
        """Ids answered 2xx, in the order first accepted (a redelivery does not add a second entry)."""
        out: list[str] = []
        for r in self.snapshot():
            if 200 <= r.status < 300 and r.body_id not in out:
                out.append(r.body_id)
        return out

    def attempts(self, ce_id: str) -> int:
        return sum(1 for r in self.snapshot() if r.ce_id == ce_id)


def tail_line(ev: incidents.IncidentEvent) -> str:
    """What ``healer incidents tail`` prints for ``ev`` (one place to change if the format changes)."""
    d = ev.data
    where = d.node if d.gpu_index is None else f"{d.node}/gpu{d.gpu_index}"
    stamp = ev.time.strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"{stamp} {ev.change:<9} {d.severity:<8} {where} {d.rule_id} {d.summary}"


def rules_rejected(event_id: str) -> incidents.RulesRejectedEvent:
    return incidents.RulesRejectedEvent(
        id=event_id,
        source="healer://test/controller",
        time=datetime.now(tz=UTC),
        data=incidents.RulesRejectedData(
            rules_dir="rules",
            errors=[
                incidents.RuleProblem(path="rules/gpu.yaml", line=12, col=11, message="unknown field 'temp'"),
                incidents.RuleProblem(path="rules/gpu.yaml", line=19, col=5, message="bad duration"),
            ],
            kept_rules=14,
        ),
    )
