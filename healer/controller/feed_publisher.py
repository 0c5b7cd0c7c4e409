"""FeedPublisher: every incident change becomes a CloudEvent on HEALER_INCIDENTS, never silently lost.

Events are published with ``Nats-Msg-Id`` = event id = ``<incident id>.<seq>``, by one background task
(``run``), so a leaderless incidents stream (a publish waits up to its 5 s timeout) never delays acting on
an incident. A publish that fails stays in an outbox, retried in order; the incident itself is already in
KV, so even a crash with a full outbox loses no incident (the next change republishes the current state).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time

import structlog

from healer import errors
from healer.bus import base, subjects
from healer.controller import book
from healer.schemas import codec, incidents

log = structlog.get_logger(__name__)


class FeedPublisher:
    def __init__(self, bus: base.Bus, subjects: subjects.Subjects, cluster: str) -> None:
        self.bus = bus
        self.subjects = subjects
        self.cluster = cluster
        self.outbox: collections.deque[tuple[str, bytes, str]] = collections.deque(maxlen=100_000)
        self.published = 0
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()

    def build(self, inc: book.Incident, change: incidents.Change) -> incidents.IncidentEvent:
        return incidents.build(
            event_id=f"{inc.id}.{inc.seq}",
            cluster=self.cluster,
            change=change,
            data=inc.data(),
            ts=time.time(),
        )

    def enqueue(self, event: incidents.IncidentEvent) -> None:
        """Queue an event built while the incident was at this ``seq`` (call before any await)."""
        self.outbox.append(
            (self.subjects.incident(event.change, event.data.node), codec.encode(event), event.id)
        )

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
        """Publish the outbox in order; one flusher at a time (ticks and action tasks both call it)."""
        async with self._lock:
            while self.outbox:
                subject, data, msg_id = self.outbox[0]
                try:
                    await self.bus.publish_durable(subject, data, msg_id=msg_id)
                except errors.TemporaryError as e:
                    log.warning("feed.publish_deferred", pending=len(self.outbox), error=str(e))
                    return
                except errors.PermanentError as e:
                    log.error("feed.publish_refused", event_id=msg_id, error=str(e))
                self.outbox.popleft()
                self.published += 1
