"""Events act at arrival: a fatal XID's first action is carried out when the event arrives, between
ticks, through the same incident shell (gates, fencing, breaker) a tick uses. Real nats-server."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

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


async def test_an_event_that_arrives_during_a_tick_is_acted_on_between_its_steps(harness: Harness) -> None:
    """A tick holds the turn through its steps, whose KV writes take a good part of a tick under load;
    an XID that arrives meanwhile is cordoned between two of them, not after the whole tick. Here the
    tick's domain step waits until the XID is in, and its ladder step waits until the test ends."""
    (harness.rules / "xid.yaml").write_text(XID_RULES)
    actuator = testing.RecordingActuator()
    ctl = await harness.controller(actuator, tick_s=0.5)
    fleet = Fleet(harness.bus, ["n1"])
    await warm(fleet)
    await until(lambda: ctl.role.leader and ctl.role.took_over)
    shell = ctl.incidents
    in_tick, resume, release = asyncio.Event(), asyncio.Event(), asyncio.Event()
    armed = {"domains": True, "ladders": False}
    correlate, advance = shell.correlate_domains, shell.recovery.advance

    async def held_correlate(now: float) -> None:
        if armed["domains"]:
            armed["domains"] = False  # the tick's call only: the arrival's own call goes through
            in_tick.set()
            await resume.wait()
            armed["ladders"] = True
        await correlate(now)

    async def held_advance(now: float, between: Callable[[], Awaitable[None]] | None = None) -> None:
        if armed["ladders"]:
            armed["ladders"] = False
            await release.wait()
        await advance(now, between)

    shell.correlate_domains = held_correlate  # type: ignore[method-assign]
    shell.recovery.advance = held_advance  # type: ignore[method-assign]
    try:
        await until(in_tick.is_set, timeout=20)
        ticks = _ticks(ctl)
        event = events.new("n1", "xid", gpu_index=2, xid=79, message="fallen off the bus")
        await harness.bus.publish_durable(
            subjects.Subjects().events("n1"), codec.encode(event), msg_id=event.id
        )
        await until(ctl.ingest.arrived.is_set, timeout=20)  # pulled while the tick holds the turn
        resume.set()
        await until(lambda: bool(actuator.executed("cordon")), timeout=20)
        assert _ticks(ctl) == ticks, "cordoned inside the tick, which still waits in its ladder step"
        assert metric(ctl.metrics, "event_arrivals_in_tick_total") == 1
        assert [(r.kind, r.node) for r in actuator.executed()] == [("cordon", "n1")]
    finally:
        resume.set()
        release.set()
    await until(lambda: _ticks(ctl) > ticks)
    await until(lambda: ctl.ingest.unacked == [] and "opened" in harness.feed.changes("n1"))


async def test_the_ladders_step_serves_arrivals_after_each_ladder(harness: Harness) -> None:
    """Each ladder of a tick waits on KV; ``between`` (the tick's arrivals) runs after every one of them,
    not once after all."""
    ctl = await harness.controller(testing.RecordingActuator(), tick_s=3600.0)
    await until(lambda: ctl.role.took_over and _ticks(ctl) >= 1)  # the first tick is over: none until 1 h
    order: list[str] = []

    async def one_ladder(rec: object, now: float) -> None:
        order.append(f"ladder {rec}")

    async def between() -> None:
        order.append("arrivals")

    ctl.recovery._advance = one_ladder  # type: ignore[method-assign]
    ctl.recovery.ladders = {"inc-a": "a", "inc-b": "b"}  # type: ignore[dict-item]
    await ctl.recovery.advance(0.0, between)
    assert order == ["ladder a", "arrivals", "ladder b", "arrivals"]
    ctl.recovery.ladders = {}
