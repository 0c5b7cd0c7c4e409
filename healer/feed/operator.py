"""Operators' word on the feed: a verdict on an incident, published the same way by ``healer incidents
verdict`` and by the status page's buttons (docs/archive.md, "Operators' verdicts")."""

from __future__ import annotations

import re
import time

from healer.bus import base, subjects
from healer.schemas import codec, telemetry, verdicts


def check_incident_id(incident_id: str) -> str:
    """The id as given, or ``ValueError``: an incident id is a subject token (the verdict's subject)."""
    if len(incident_id) > 128 or not re.fullmatch(telemetry.NODE_PATTERN, incident_id):
        raise ValueError(f"{incident_id!r} is not an incident id")
    return incident_id


async def publish_verdict(
    bus: base.Bus, subj: subjects.Subjects, cluster: str, data: verdicts.VerdictData, now: float | None = None
) -> verdicts.VerdictEvent:
    """Publish ``data`` as an ``io.healer.incident.verdict.v1`` event on ``<prefix>.incidents.verdict.<id>``
    (stored in ``HEALER_INCIDENTS``; its id is the stream's de-duplication id). ``HealerError`` (the bus's)
    when it could not be published."""
    check_incident_id(data.incident_id)
    event = verdicts.build(cluster=cluster, data=data, ts=time.time() if now is None else now)
    await bus.publish_durable(subj.verdict(data.incident_id), codec.encode(event), msg_id=event.id)
    return event
