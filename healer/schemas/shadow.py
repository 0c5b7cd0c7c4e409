"""A shadow pool's would-be anomaly incident, on the incident feed: ``io.healer.anomaly.shadow.v1``.

Until a pool of nodes (GPU model and frame interval) has been watched for ``anomaly.calibration_node_days``
its anomaly scores are capped under the rule's level, so it opens nothing; each time one of its nodes
would have opened an ``anomaly-score-high`` incident with the thresholds of the moment, the leader
publishes this event on ``<prefix>.incidents.shadow.<node>`` (stored in ``HEALER_INCIDENTS``), so an
operator can see what the model would have said before it says it (docs/anomaly.md, "Shadow mode").

The type is its own, outside ``io.healer.incident.*``: it is not an incident, has no lifecycle, and is
never sent to Alertmanager (the forwarder acknowledges other types without sending); consumers that do
not know it pass it on as any other CloudEvent.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Final, Literal

import pydantic

from healer.schemas import base, cloudevent

TYPE: Final = "io.healer.anomaly.shadow.v1"
SCHEMA: Final = "healer.anomaly-shadow.v1"


class ShadowData(pydantic.BaseModel):
    model_config = base.CONFIG

    schema_: Literal["healer.anomaly-shadow.v1"] = pydantic.Field(default=SCHEMA, alias="schema")
    node: str = pydantic.Field(min_length=1, max_length=256)
    pool: str = pydantic.Field(min_length=1, max_length=256, description="GPU model|frame interval")
    component: str = pydantic.Field(min_length=1, max_length=64, description="the deciding component")
    value: float = pydantic.Field(description="the component's value held over the rule's for (model units)")
    threshold: float = pydantic.Field(description="the pool's threshold for it at that moment (model units)")
    node_days: float = pydantic.Field(ge=0, description="node-days the pool has been watched")
    node_days_needed: float = pydantic.Field(ge=0, description="node-days before the pool goes live")


class ShadowEvent(cloudevent.CloudEvent):
    """A CloudEvents 1.0 envelope around ShadowData."""

    type: Literal["io.healer.anomaly.shadow.v1"] = TYPE
    subject: str = pydantic.Field(description="node/<node>")
    time: datetime
    data: ShadowData


def build(*, cluster: str, data: ShadowData, ts: float) -> ShadowEvent:
    """One would-be incident; its id names the node and the scoring instant (a leader that publishes it
    twice within the stream's duplicate window is deduplicated)."""
    return ShadowEvent(
        id=f"shadow-{data.node[:96]}-{int(ts)}",
        source=f"healer://{cluster}/controller",
        subject=f"node/{data.node}",
        time=datetime.fromtimestamp(ts, tz=UTC),
        data=data,
    )
