"""FeedPublisher: every incident change becomes a CloudEvent on HEALER_INCIDENTS, never silently lost.

Events are published with ``Nats-Msg-Id`` = event id = ``<incident id>.<seq>``, by one background task
(``run``), so a leaderless incidents stream (a publish waits up to its 5 s timeout) never delays acting on
an incident. A publish that fails stays in an outbox, retried in order; the incident itself is already in
KV with the change it last announced, and the next leader puts that change out again (``resend``) under
its original event id: a leader that dies with a full outbox loses no incident and, within the stream's
duplicate window, announces none twice. (Only the last change of each incident is kept that way: older
changes still in a dead leader's outbox are lost, the next one carries the incident's whole state.)
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time

import structlog

from healer import errors
from healer.bus import base, subjects
from healer.controller.incidents import book
from healer.schemas import codec, incidents, shadow

log = structlog.get_logger(__name__)


Entry = tuple[str, bytes, str]
"""One outbox entry: subject, encoded CloudEvent, event id (``<incident id>.<seq>``, the Nats-Msg-Id)."""

OUTBOX_MAX = 100_000
"""Events held while the incidents stream is away; past it the oldest is dropped, counted and logged."""
FLUSH_AT_ONCE = 64
"""Events (of distinct incidents) published together by one ``flush`` step."""
UNPUBLISHED_KEPT = 16
"""At most this many earlier, still unpublished events of one incident ride along in its KV document."""


class FeedPublisher:
    def __init__(self, bus: base.Bus, subjects: subjects.Subjects, cluster: str) -> None:
        self.bus = bus
        self.subjects = subjects
        self.cluster = cluster
        self.outbox: collections.deque[Entry] = collections.deque()
        self.waiting: dict[str, dict[str, bytes]] = {}
        """The outbox by incident: incident id → {event id: encoded event}, in order."""
        self.published = 0
        self.dropped = 0
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()

    def build(
        self, inc: book.Incident, change: incidents.Change, ts: float | None = None
    ) -> incidents.IncidentEvent:
        return incidents.build(
            event_id=f"{inc.id}.{inc.seq}",
            cluster=self.cluster,
            change=change,
            data=inc.data(),
            ts=time.time() if ts is None else ts,
        )

    def enqueue(self, event: incidents.IncidentEvent) -> None:
        """Queue an event built while the incident was at this ``seq`` (call before any await)."""
        self._append((self.subjects.incident(event.change, event.data.node), codec.encode(event), event.id))

    def enqueue_shadow(self, event: shadow.ShadowEvent) -> None:
        """Queue a shadow pool's would-be anomaly incident (its own type: never an incident)."""
        self._append((self.subjects.anomaly_shadow(event.data.node), codec.encode(event), event.id))

    def unpublished(self, inc: book.Incident) -> list[str]:
        """``inc``'s events still in the outbox other than its current one (``<id>.<seq>``), oldest
        first, at most ``UNPUBLISHED_KEPT``: saved with the incident, so a new leader can send them."""
        current = f"{inc.id}.{inc.seq}"
        waiting = self.waiting.get(inc.id, {})
        return [d.decode() for i, d in waiting.items() if i != current][-UNPUBLISHED_KEPT:]

    def resend(self, incs: list[book.Incident], *, window_s: float, now: float) -> int:
        """Queue again, under their original event ids, each incident's events that its KV document
        says may not have been published: those saved as unpublished, then its last change rebuilt from
        the saved state (the same data and id as when it was first built). A new leader's first act: a
        leader that died between saving a change and publishing it loses nothing, and one that had
        published it sends a duplicate the stream drops. Events older than the stream's duplicate
        window (``window_s``) are not sent again: a duplicate would be stored, and the leader that built
        them lived long enough to publish them. Returns how many were queued."""
        queued = 0
        for inc in incs:
            entries: list[Entry] = []
            for text in inc.unpublished:
                event = codec.decode_incident(text.encode())
                if now - event.time.timestamp() < window_s:
                    entries.append(
                        (self.subjects.incident(event.change, event.data.node), text.encode(), event.id)
                    )
            if inc.last_change is not None and now - inc.updated_at < window_s:
                event = self.build(inc, inc.last_change, ts=inc.updated_at)
                entries.append(
                    (self.subjects.incident(event.change, event.data.node), codec.encode(event), event.id)
                )
            for entry in entries:
                if entry[2] not in self.waiting.get(inc.id, {}):
                    self._append(entry)
                    queued += 1
        if queued:
            self.kick()
        return queued

    def _append(self, entry: Entry) -> None:
        if len(self.outbox) >= OUTBOX_MAX:
            _, _, lost = self._pop()
            self.dropped += 1
            log.error("feed.outbox_full", dropped_event_id=lost, dropped=self.dropped, held=OUTBOX_MAX)
        self.outbox.append(entry)
        self.waiting.setdefault(entry[2].rsplit(".", 1)[0], {})[entry[2]] = entry[1]

    def _pop(self) -> Entry:
        entry = self.outbox.popleft()
        inc_id = entry[2].rsplit(".", 1)[0]
        waiting = self.waiting.get(inc_id)
        if waiting is not None:
            waiting.pop(entry[2], None)
            if not waiting:
                del self.waiting[inc_id]
        return entry

    def kick(self) -> None:
        """Have ``run`` publish the outbox now (returns at once)."""
        self._wake.set()

    async def run(self, stop: asyncio.Event, retry_s: float = 1.0) -> None:
        """Publish the outbox whenever kicked, and retry what was deferred every ``retry_s``, until
        ``stop``."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=retry_s)
            self._wake.clear()
            await self.flush()

    async def flush(self) -> None:
        """Publish the outbox in order; one flusher at a time (ticks and action tasks both call it). The
        head's events of distinct incidents, up to ``FLUSH_AT_ONCE``, go out together (sent in order, their
        acknowledgements awaited together, #43); one that fails stays at the head, and so does every later
        event of its incident: each incident's events reach the stream in order."""
        async with self._lock:
            while self.outbox:
                window = self._window()
                results = await asyncio.gather(
                    *(self.bus.publish_durable(s, d, msg_id=m) for s, d, m in window), return_exceptions=True
                )
                deferred: BaseException | None = None
                for (_, _, msg_id), result in zip(window, results, strict=True):
                    if isinstance(result, errors.TemporaryError):
                        deferred = deferred or result
                        continue  # stays, at its place
                    if isinstance(result, errors.PermanentError):
                        log.error("feed.publish_refused", event_id=msg_id, error=str(result))
                    elif isinstance(result, BaseException):
                        deferred = result
                        continue
                    self._discard(msg_id)
                    self.published += 1
                if isinstance(deferred, errors.TemporaryError):
                    log.warning("feed.publish_deferred", pending=len(self.outbox), error=str(deferred))
                    return
                if deferred is not None:
                    raise deferred

    def _window(self) -> list[Entry]:
        """The outbox's head up to its first second event of one incident, at most ``FLUSH_AT_ONCE``."""
        window: list[Entry] = []
        seen: set[str] = set()
        for entry in self.outbox:
            inc_id = entry[2].rsplit(".", 1)[0]
            if inc_id in seen or len(window) >= FLUSH_AT_ONCE:
                break
            seen.add(inc_id)
            window.append(entry)
        return window

    def _discard(self, msg_id: str) -> None:
        """The published event out of the outbox (near its head; gone already if dropped meanwhile)."""
        for i, entry in enumerate(self.outbox):
            if entry[2] == msg_id:
                del self.outbox[i]
                break
        else:
            return
        inc_id = msg_id.rsplit(".", 1)[0]
        waiting = self.waiting.get(inc_id)
        if waiting is not None:
            waiting.pop(msg_id, None)
            if not waiting:
                del self.waiting[inc_id]
