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

EventKind = Literal["xid", "sxid", "gpu_lost", "nvml_error", "agent_start", "agent_stop"]
"""``sxid``: an NVSwitch error (its code in ``xid``, the switch's PCI address in ``pci_bus_id``)."""
EventSource = Literal["nvml", "kmsg"]
DetailValue = str | int | bool


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
    # What the kernel log adds to an XID (null when the event came from NVML or says nothing of it).
    source: EventSource | None = pydantic.Field(default=None, description="where the agent saw it")
    pid: int | None = pydantic.Field(default=None, ge=0, description="process the driver named")
    process: str | None = pydantic.Field(default=None, max_length=256, description="its name")
    pci_bus_id: str | None = pydantic.Field(default=None, max_length=32, description="as the log gave it")
    details: dict[str, DetailValue] = pydantic.Field(
        default_factory=dict, description="decoded log fields: link, registers, unit, fatal ..."
    )


def new(
    node: str,
    kind: EventKind,
    *,
    gpu_index: int | None = None,
    gpu_uuid: str | None = None,
    xid: int | None = None,
    message: str = "",
    ts: float | None = None,
    source: EventSource | None = None,
    pid: int | None = None,
    process: str | None = None,
    pci_bus_id: str | None = None,
    details: dict[str, DetailValue] | None = None,
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
        source=source,
        pid=pid,
        process=process,
        pci_bus_id=pci_bus_id,
        details=details or {},
    )
