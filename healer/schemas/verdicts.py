"""An operator's verdict on an incident, on the incident feed: ``io.healer.incident.verdict.v1``.

A person says whether an incident was a real fault (``confirmed``) or a false alarm (``false-alarm``);
``healer incidents verdict`` publishes it on ``<prefix>.incidents.verdict.<incident id>`` (stored in
``HEALER_INCIDENTS`` with the incidents, so every feed consumer sees it), and the archive keeps it:
precision per rule is computed from verdicts (docs/archive.md). An incident may get several verdicts
(a person changes their mind); the latest by ``time`` counts.

The type is its own (not one of the incident's changes), so the five incident types and their ``data``
stay exactly as they were; consumers that do not know it pass it on as any other CloudEvent.
"""

from __future__ import annotations

import enum
import uuid
from datetime import UTC, datetime
from typing import Final, Literal

import pydantic

from healer.schemas import base, cloudevent

TYPE: Final = "io.healer.incident.verdict.v1"
SCHEMA: Final = "healer.verdict.v1"


class Verdict(enum.StrEnum):
    """What a person found the incident to be."""

    CONFIRMED = "confirmed"
    """A real fault: the rule was right."""
    FALSE_ALARM = "false-alarm"
    """Nothing was wrong: the rule (or the model behind it) fired for nothing."""


class VerdictData(pydantic.BaseModel):
    model_config = base.CONFIG

    schema_: Literal["healer.verdict.v1"] = pydantic.Field(default=SCHEMA, alias="schema")
    incident_id: str = pydantic.Field(min_length=1, max_length=128)
    verdict: Verdict
    by: str = pydantic.Field(min_length=1, max_length=256, description="who gave the verdict")
    note: str = pydantic.Field(default="", max_length=4096)


class VerdictEvent(cloudevent.CloudEvent):
    """A CloudEvents 1.0 envelope around VerdictData."""

    type: Literal["io.healer.incident.verdict.v1"] = TYPE
    subject: str = pydantic.Field(description="incident/<incident id>")
    time: datetime
    data: VerdictData


def build(*, cluster: str, data: VerdictData, ts: float, event_id: str | None = None) -> VerdictEvent:
    """A verdict event; each verdict is its own event (``verdict-<random hex>`` unless given)."""
    return VerdictEvent(
        id=event_id or f"verdict-{uuid.uuid4().hex}",
        source=f"healer://{cluster}/operator",
        subject=f"incident/{data.incident_id}",
        time=datetime.fromtimestamp(ts, tz=UTC),
        data=data,
    )
