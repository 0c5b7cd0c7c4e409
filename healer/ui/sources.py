"""Where the status page's data comes from, all read-only and all pushed by NATS (nothing polls KV):

- telemetry: a core subscription to ``healer.telemetry.*`` (the node is the subject's, as in the
  controller), decoded with the controller's strict fast path;
- the incident feed: ``healer.feed.tail``'s ephemeral ordered consumer, from ``feed_window_s`` ago, then
  following (incidents, their timelines, the recent feed);
- the controller's KV bucket: ``healer.bus.kvwatch`` (current values, then changes) for the breaker,
  the exclusions and the power budgets' states (GPUs capped, a demand-response shed), and, once at
  start, the open incidents the feed window does not reach;
- the events stream: an ordered consumer from ``feed_window_s`` ago, then following, for each node's XID
  history (the per-node view). A page without read access to it (a feed identity) logs that once and
  shows no XIDs; the rest works.

Nothing here publishes or writes. Each source is a task this object owns; one that fails with a
temporary error is restarted after ``retry_s`` and logged; ``stop`` cancels and awaits them all.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

import orjson
import structlog

from healer import errors, tasks
from healer.bus import base, kvwatch, subjects
from healer.bus import nats as natsbus
from healer.feed import envelope, tail
from healer.schemas import codec
from healer.ui import live

log = structlog.get_logger(__name__)

BREAKER_KEY = "breaker"
EXCLUDE_PREFIX = "exclude."
INCIDENT_PREFIX = "incident."
POWER_PREFIX = "power."
"""The controller's KV keys (healer.controller.remediation.policy / incidents); read here, never written."""


class Sources:
    def __init__(
        self,
        bus: natsbus.NatsBus,
        subj: subjects.Subjects,
        live: live.Live,
        *,
        feed_window_s: float = 3600.0,
        push_s: float = 1.0,
        retry_s: float = 2.0,
    ) -> None:
        self.bus = bus
        self.subj = subj
        self.live = live
        self.feed_window_s = feed_window_s
        self.push_s = push_s
        self.retry_s = retry_s
        self.stats = codec.DecodeStats()
        failures = tasks.failures_counter("healer_ui", None)
        self.jobs = tasks.Scheduler("ui", failures, log=log, initial_delay_s=retry_s, max_delay_s=retry_s)
        """Owns the feed and KV followers (restarted ``retry_s`` after a failure) and the push loop."""
        self._sub: base.Subscription | None = None
        self.kv_ready = asyncio.Event()
        self.feed_started = asyncio.Event()

    async def start(self) -> None:
        self._sub = await self.bus.subscribe(self.subj.all_telemetry, self._on_frame)
        self.jobs.supervise("feed", self._feed)
        self.jobs.supervise("kv", self._kv)
        self.jobs.supervise("events", self._events)
        self.jobs.spawn("pump", self._pump())

    async def stop(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None
        await self.jobs.close()

    async def _pump(self) -> None:
        while True:
            await asyncio.sleep(self.push_s)
            try:
                self.live.tick()
            except Exception:
                log.exception("ui.push_failed")

    async def _on_frame(self, msg: base.Msg) -> None:
        try:
            frame = codec.decode_frame_view(msg.data)
        except errors.DecodeError as e:
            self.stats.bad(e)
            return
        self.stats.ok("frame")
        fleet = self.live.fleet
        node = self.subj.node_of(msg.subject)
        if not fleet.ingest(node, frame, time.time()) and fleet.refused % 1000 == 1:
            log.warning("ui.node_refused", node=node, max_nodes=fleet.max_nodes, refused=fleet.refused)

    async def _feed(self) -> None:
        since = datetime.fromtimestamp(time.time() - self.feed_window_s, tz=UTC)
        query = tail.Query(since=since, follow=True)
        self.feed_started.set()
        await tail.read(self.bus, self.subj, query, self._on_item, self._on_bad, self.stats)

    def _on_item(self, item: envelope.Item) -> None:
        if item.incident is not None:
            ev = item.incident
            line = self.live.board.apply(ev)
            if line is None:
                return
            shown = self.live.board.open.get(ev.data.incident_id)
            self.live.broadcast("feed", line)
            self.live.broadcast(
                "incident",
                shown.as_json() if shown is not None else {"id": ev.data.incident_id, "state": ev.data.state},
            )
        elif item.verdict is not None:
            line = self.live.board.verdict(item.verdict)
            if line is not None:
                self.live.broadcast("feed", line)
                self.live.broadcast("verdict", self.live.board.verdicts[item.verdict.data.incident_id])
        elif item.rules_rejected is not None:
            self.live.broadcast("feed", self.live.board.rules_rejected(item.rules_rejected))
            self.live.broadcast("safety", self.live.board.safety())
        else:  # a CloudEvent type this page does not know yet: shown on the feed, not dropped
            env = item.envelope
            at = env.time.astimezone(UTC).timestamp() if env.time is not None else time.time()
            self.live.broadcast("feed", self.live.board.other(env.type, env.id, at, env.subject))
            if "rules.rejected" in env.type:
                self.live.broadcast("safety", self.live.board.safety())

    async def _events(self) -> None:
        since = datetime.fromtimestamp(time.time() - self.feed_window_s, tz=UTC)
        try:
            replay = await self.bus.replay(self.subj.stream_events, self.subj.all_events, since)
        except base.NotFound:
            log.info("ui.no_events_stream", stream=self.subj.stream_events, effect="no XID history")
            return
        except errors.PermanentError as e:  # e.g. an identity that may not read the events stream
            log.warning("ui.events_unavailable", error=str(e), effect="no XID history")
            return
        try:
            while True:
                msg = await replay.next(timeout=5.0)
                if msg is None:
                    continue
                try:
                    ev = codec.decode_event(msg.data)
                except errors.DecodeError as e:
                    self.stats.bad(e)
                    continue
                self.stats.ok("event")
                self.live.board.xid(ev, self.subj.node_of(msg.subject))
        finally:
            await replay.close()

    def _on_bad(self, subject: str, seq: int, err: errors.DecodeError) -> None:
        log.warning("ui.feed_rejected", subject=subject, seq=seq, reason=err.reason)

    async def _kv(self) -> None:
        ready = False

        def on_ready() -> None:
            nonlocal ready
            ready = True
            self.kv_ready.set()
            self.live.broadcast("safety", self.live.board.safety())

        def on_change(change: kvwatch.Change) -> None:
            doc = _json(change.value)
            board = self.live.board
            if change.key == BREAKER_KEY:
                board.set_breaker(doc)
            elif change.key.startswith(EXCLUDE_PREFIX):
                board.set_exclusion(change.key.removeprefix(EXCLUDE_PREFIX), doc)
            elif change.key.startswith(POWER_PREFIX):
                board.set_power(change.key.removeprefix(POWER_PREFIX), doc)
            elif change.key.startswith(INCIDENT_PREFIX):
                if not ready and doc is not None and board.seed(doc):
                    shown = board.open.get(str(doc.get("id")))
                    if shown is not None:
                        self.live.broadcast("incident", shown.as_json())
                return
            else:
                return
            if ready:
                self.live.broadcast("safety", board.safety())

        await kvwatch.follow(self.bus, self.subj.kv_state, on_change, on_ready)


def _json(value: bytes | None) -> dict[str, Any] | None:
    if value is None:
        return None
    try:
        doc = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) else None
