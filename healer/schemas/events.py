"""NodeEvent: a discrete thing that happened on a node and must never be lost (XIDs above all).

Events travel on JetStream with ``Nats-Msg-Id`` = ``id``, so a resend after an outage is deduplicated by
the server and again by any consumer that keys on ``id``.
"""

from __future__ import annotations

import time
import uuid
from typing import Final, Literal

import pydantic

from healer.schemas import base, telemetry

SCHEMA: Final = "healer.event.v1"

EventKind = Literal["xid", "gpu_lost", "nvml_error", "agent_start", "agent_stop"]


class NodeEvent(base.WireModel):
    schema_: Literal["healer.event.v1"] = pydantic.Field(default=SCHEMA, alias="schema")
    id: str = pydantic.Field(min_length=1, max_length=128, description="unique; also the Nats-Msg-Id")
    node: str = pydantic.Field(min_length=1, max_length=253, pattern=telemetry.NODE_PATTERN)
    ts: float = pydantic.Field(gt=0)
    kind: EventKind
    gpu_index: int | None = pydantic.Field(default=None, ge=0, le=255)
    gpu_uuid: str | None = pydantic.Field(default=None, max_length=96)
    xid: int | None = pydantic.Field(default=None, ge=0)
    message: str = pydantic.Field(default="", max_length=4096)


def new(
    node: str,
    kind: EventKind,
    *,
    gpu_index: int | None = None,
    gpu_uuid: str | None = None,
    xid: int | None = None,
    message: str = "",
    ts: float | None = None,
) -> NodeEvent:
    """Build an event with a fresh unique id (uuid4, so two agents never collide)."""
    return NodeEvent(
        id=f"{node}-{uuid.uuid4().hex}",
        node=node,
        ts=time.time() if ts is None else ts,
        kind=kind,
        gpu_index=gpu_index,
        gpu_uuid=gpu_uuid,
        xid=xid,
        message=message,
    )
