"""Events act at arrival: a fatal XID's first action is carried out when the event arrives, between
ticks, through the same incident shell (gates, fencing, breaker) a tick uses. Real nats-server."""

from __future__ import annotations

from healer import testing
from healer.bus import subjects
from healer.controller import service
from healer.schemas import codec, events
from tests.conftest import until
from tests.controller.conftest import Fleet, Harness, metric, warm

XID_RULES = (
    "rules:\n  - id: xid-fatal\n    description: fatal XID\n    on_event: {kind: xid, xid: [79]}\n"
    "    severity: critical\n    actions: [cordon]\n"
)


def _ticks(ctl: service.Controller) -> float:
    return metric(ctl.metrics, "tick_seconds_count")


async def test_a_fatal_xid_is_cordoned_before_the_next_tick(harness: Harness) -> None:
    (harness.rules / "xid.yaml").write_text(XID_RULES)
    actuator = testing.RecordingActuator()
    # One tick at start, the next an hour later: only acting at arrival can cordon within the test.
    ctl = await harness.controller(actuator, tick_s=3600.0)
    fleet = Fleet(harness.bus, ["n1"])
    await warm(fleet)
    await until(lambda: ctl.role.leader and ctl.role.took_over)
    ticks = _ticks(ctl)
    event = events.new("n1", "xid", gpu_index=2, xid=79, message="fallen off the bus")
    await harness.bus.publish_durable(subjects.Subjects().events("n1"), codec.encode(event), msg_id=event.id)
    await until(lambda: bool(actuator.executed("cordon")), timeout=20)
    assert [(r.kind, r.node) for r in actuator.executed()] == [("cordon", "n1")]
    assert all(r.fencing_token >= 1 for r in actuator.requests)
    assert _ticks(ctl) == ticks, "acted on between ticks, not by a tick"
    assert metric(ctl.metrics, "event_arrivals_total") >= 1
    await until(lambda: ctl.ingest.unacked == [] and "opened" in harness.feed.changes("n1"))


async def test_an_event_no_rule_matches_wakes_nothing(harness: Harness) -> None:
    (harness.rules / "xid.yaml").write_text(XID_RULES)
    actuator = testing.RecordingActuator()
    ctl = await harness.controller(actuator, tick_s=3600.0)
    fleet = Fleet(harness.bus, ["n1"])
    await warm(fleet)
    await until(lambda: ctl.role.leader and ctl.role.took_over)
    event = events.new("n1", "xid", gpu_index=2, xid=13, message="graphics engine exception")
    await harness.bus.publish_durable(subjects.Subjects().events("n1"), codec.encode(event), msg_id=event.id)
    await until(lambda: metric(ctl.metrics, "events_ingested_total") >= 1)
    assert not ctl.ingest.arrived.is_set()
    assert metric(ctl.metrics, "event_arrivals_total") == 0
    assert actuator.requests == []
