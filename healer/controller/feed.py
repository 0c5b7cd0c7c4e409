"""FeedPublisher: every incident change becomes a CloudEvent on HEALER_INCIDENTS, never silently lost.

Events are published with ``Nats-Msg-Id`` = event id = ``<incident id>.<seq>``. A publish that fails stays
in an outbox, retried in order on the next ticks; the incident itself is already in KV, so even a crash
with a full outbox loses no incident (the next change republishes the current state).
"""

from __future__ import annotations

import collections
import time

import structlog

from healer import errors
from healer.bus import base
from healer.bus import subjects as subjects_mod
from healer.controller import incidents as incidents_mod
from healer.schemas import codec, incidents

log = structlog.get_logger(__name__)


class FeedPublisher:
    def __init__(self, bus: base.Bus, subjects: subjects_mod.Subjects, cluster: str) -> None:
        self.bus = bus
        self.subjects = subjects
        self.cluster = cluster
        self.outbox: collections.deque[tuple[str, bytes, str]] = collections.deque(maxlen=100_000)
        self.published = 0

    def build(self, inc: incidents_mod.Incident, change: incidents.Change) -> incidents.IncidentEvent:
        return incidents.build(
            event_id=f"{inc.id}.{inc.seq}",
            cluster=self.cluster,
            change=change,
            data=inc.data(),
            ts=time.time(),
        )

    async def publish(self, inc: incidents_mod.Incident, change: incidents.Change) -> incidents.IncidentEvent:
        event = self.build(inc, change)
        self.outbox.append((self.subjects.incident(change, inc.node), codec.encode(event), event.id))
        await self.flush()
        return event

    async def flush(self) -> None:
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
