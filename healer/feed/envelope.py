"""What a message on the incident feed is: a healer incident, another CloudEvent, or garbage.

The feed carries CloudEvents 1.0 in the JSON event format (the structured-mode body). Incident events
(``io.healer.incident.*``), rule-file rejections (``io.healer.rules.rejected.v1``) and operators'
verdicts (``io.healer.incident.verdict.v1``, ``schemas.verdicts``) are validated in full against their
models; other CloudEvents a later controller may add only
need a valid envelope, so consumers pass them on instead of calling them malformed. Anything else raises
``errors.DecodeError`` and is counted by callers.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pydantic

from healer import errors
from healer.schemas import cloudevent, codec, incidents, verdicts

KIND = "cloudevent"


class Envelope(cloudevent.CloudEvent):
    """Any CloudEvent on the feed: the context attributes checked, ``data`` whatever the producer sent."""

    datacontenttype: str | None = None  # type: ignore[assignment]
    data: Any = None
    data_base64: str | None = None


@dataclasses.dataclass(frozen=True)
class Item:
    """One feed message, decoded: the typed model for the types healer knows, only the envelope otherwise."""

    raw: bytes
    envelope: Envelope
    incident: incidents.IncidentEvent | None = None
    rules_rejected: incidents.RulesRejectedEvent | None = None
    verdict: verdicts.VerdictEvent | None = None
    """An operator's verdict on an incident (its type shares the incidents' prefix, so it is told apart
    first)."""
    stream_seq: int = 0
    """The message's JetStream stream sequence (0 when it did not come from the stream)."""


def classify(data: bytes, stream_seq: int = 0) -> Item:
    """Decode one feed message or raise ``errors.DecodeError`` (reasons as in ``schemas.codec``)."""
    if len(data) > codec.MAX_MESSAGE_BYTES:
        raise errors.DecodeError(KIND, "too_large", f"{len(data)} bytes > {codec.MAX_MESSAGE_BYTES}")
    try:
        env = Envelope.model_validate_json(data)  # JSON mode: specversion is required
    except pydantic.ValidationError as e:
        first = e.errors(include_url=False)
        if first and first[0]["type"] == "json_invalid":
            raise errors.DecodeError(KIND, "json", first[0]["msg"]) from None
        raise errors.DecodeError(KIND, "validation", f"not a CloudEvent: {_first(e)}") from None
    if env.type == verdicts.TYPE:
        try:
            verdict = verdicts.VerdictEvent.model_validate_json(data)
        except pydantic.ValidationError as e:
            raise errors.DecodeError("verdict", "validation", _first(e)) from None
        return Item(raw=data, envelope=env, verdict=verdict, stream_seq=stream_seq)
    if env.type.startswith(incidents.TYPE_PREFIX):
        return Item(raw=data, envelope=env, incident=codec.decode_incident(data), stream_seq=stream_seq)
    if env.type == incidents.RULES_REJECTED_TYPE:
        try:
            rejected = incidents.RulesRejectedEvent.model_validate_json(data)  # extensions kept
        except pydantic.ValidationError as e:
            raise errors.DecodeError("rules_rejected", "validation", _first(e)) from None
        return Item(raw=data, envelope=env, rules_rejected=rejected, stream_seq=stream_seq)
    return Item(raw=data, envelope=env, stream_seq=stream_seq)


def _first(e: pydantic.ValidationError) -> str:
    first = e.errors(include_url=False)
    if not first:
        return str(e)
    loc = ".".join(str(p) for p in first[0]["loc"]) or "<root>"
    return f"{loc}: {first[0]['msg']}"
