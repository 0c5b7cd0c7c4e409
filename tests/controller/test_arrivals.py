"""Events act at arrival: a fatal XID's first action is carried out when the event arrives, between
ticks, through the same incident shell (gates, fencing, breaker) a tick uses. Real nats-server."""

from __future__ import annotations

import asyncio
import types
from collections.abc import Awaitable, Callable
from typing import Any

from healer import errors, testing
from healer.bus import subjects
from healer.controller.core import service
from healer.controller.remediation import healing
from healer.schemas import codec, events
from tests.conftest import until
from tests.controller.conftest import Fleet, Harness, metric, warm

XID_RULES = (
    "rules:\n  - id: xid-fatal\n    description: fatal XID\n    on_event: {kind: xid, xid: [79]}\n"
    "    severity: critical\n    actions: [cordon]\n"
)


def _ticks(ctl: service.Controller) -> float:
    return metric(ctl.metrics, "tick_seconds_count")


async def _leading(
    harness: Harness, actuator: testing.RecordingActuator, nodes: list[str], **controller: Any
) -> tuple[service.Controller, Fleet]:
    """A controller with ``controller`` settings, its fleet reporting (warm), once it leads."""
    ctl = await harness.controller(actuator, **controller)
    fleet = Fleet(harness.bus, nodes)
    await warm(fleet)
    await until(lambda: ctl.role.leader and ctl.role.took_over)
    return ctl, fleet


async def test_a_fatal_xid_is_cordoned_before_the_next_tick(harness: Harness) -> None:
    (harness.rules / "xid.yaml").write_text(XID_RULES)
    actuator = testing.RecordingActuator()
    # One tick at start, the next an hour later: only acting at arrival can cordon within the test.
    ctl, _ = await _leading(harness, actuator, ["n1"], tick_s=3600.0)
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
    ctl, _ = await _leading(harness, actuator, ["n1"], tick_s=3600.0)
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
    ctl, _ = await _leading(harness, actuator, ["n1"], tick_s=0.5)
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


async def test_the_ladders_step_serves_arrivals_after_each_chunk_of_ladders(harness: Harness) -> None:
    """Each ladder of a tick waits on KV; ``between`` (the tick's arrivals) runs after every chunk of
    ``ADVANCE_AT_ONCE`` ladders walked together (#43), not once after all."""
    ctl = await harness.controller(testing.RecordingActuator(), tick_s=3600.0)
    await until(lambda: ctl.role.took_over and _ticks(ctl) >= 1)  # the first tick is over: none until 1 h
    order: list[str] = []

    async def one_ladder(rec: Any, now: float, inc: object, stopped: bool) -> None:
        order.append(f"ladder {rec.state.incident_id}")

    async def between() -> None:
        order.append("arrivals")

    chunk = healing.ADVANCE_AT_ONCE
    ids = [f"inc-{i:02d}" for i in range(chunk + 1)]
    ctl.recovery._advance = one_ladder  # type: ignore[method-assign]
    ctl.recovery.ladders = {i: types.SimpleNamespace(state=types.SimpleNamespace(incident_id=i)) for i in ids}  # type: ignore[misc]
    await ctl.recovery.advance(0.0, between)
    assert order == [*(f"ladder {i}" for i in ids[:chunk]), "arrivals", f"ladder {ids[chunk]}", "arrivals"]
    ctl.recovery.ladders = {}


async def test_a_new_ecc_error_in_a_frame_is_cordoned_before_the_next_tick(harness: Harness) -> None:
    """Condition rules without ``for`` read the nodes whose frames arrived every ``frame_arrivals_s``,
    between ticks: the new double-bit error is acted on through the same shell, long before the next
    tick; the tick after reports the firing as ongoing and opens nothing twice."""
    actuator = testing.RecordingActuator()
    ctl, fleet = await _leading(harness, actuator, ["n1", "n2"], tick_s=3600.0, frame_arrivals_s=0.05)
    await until(lambda: metric(ctl.metrics, "frame_arrivals_total") > 0)
    ticks = _ticks(ctl)
    fleet.overrides[("n1", 1)] = {"ecc_dbe_volatile": 1}
    await fleet.publish()
    await until(lambda: bool(actuator.executed("cordon")), timeout=20)
    assert [(r.kind, r.node) for r in actuator.executed("cordon")] == [("cordon", "n1")]
    assert all(r.fencing_token >= 1 for r in actuator.requests)
    assert _ticks(ctl) == ticks, "acted on between ticks, not by a tick"
    assert metric(ctl.metrics, "frame_arrival_firings_total") == 1
    await until(lambda: "opened" in harness.feed.changes("n1"))
    async with ctl.ticker.turn:
        await ctl.ticker.tick()  # the tick sees it firing: no second incident
    assert harness.feed.changes("n1").count("opened") == 1
    assert len(ctl.book.open) == 1


async def test_frames_wait_for_the_tick_when_arrival_evaluation_is_off(harness: Harness) -> None:
    actuator = testing.RecordingActuator()
    ctl, fleet = await _leading(harness, actuator, ["n1"], tick_s=3600.0, frame_arrivals_s=0)
    fleet.overrides[("n1", 1)] = {"ecc_dbe_volatile": 1}
    await fleet.publish()
    await until(lambda: metric(ctl.metrics, "frames_ingested_total") >= 4)
    await asyncio.sleep(0.5)
    assert actuator.executed("cordon") == []
    assert metric(ctl.metrics, "frame_arrivals_total") == 0
    async with ctl.ticker.turn:
        await ctl.ticker.tick()
    await until(lambda: bool(actuator.executed("cordon")), timeout=20)


async def test_an_event_whose_arrival_failed_is_evaluated_again_not_acknowledged_unseen(
    harness: Harness,
) -> None:
    """The arrival that evaluated an XID failed (KV timed out opening its incident). Kept, the event was
    acknowledged by the next step that succeeded (here the next XID's arrival), and a one-shot XID rule
    never fires twice for one delivery: the XID was lost. It goes back to the stream and is acted on
    when delivered again, with no tick in between."""
    (harness.rules / "xid.yaml").write_text(XID_RULES)
    actuator = testing.RecordingActuator()
    ctl, _ = await _leading(harness, actuator, ["n1", "n2"], tick_s=3600.0, breaker_max_percent=100.0)
    await until(lambda: _ticks(ctl) >= 1)
    ticks = _ticks(ctl)
    real_open = ctl.incidents._open
    failed: list[str] = []

    async def open_once_broken(f: Any, now: float) -> None:
        if f.node == "n1" and not failed:
            failed.append(f.node)
            raise errors.TemporaryError("KV get history.n1.2: TimeoutError()")
        await real_open(f, now)

    ctl.incidents._open = open_once_broken  # type: ignore[method-assign]
    for node in ("n1", "n2"):
        event = events.new(node, "xid", gpu_index=2, xid=79, message="fallen off the bus")
        await harness.bus.publish_durable(
            subjects.Subjects().events(node), codec.encode(event), msg_id=event.id
        )
    await until(lambda: {r.node for r in actuator.executed("cordon")} == {"n1", "n2"}, timeout=20)
    assert failed == ["n1"]
    assert metric(ctl.metrics, "events_retried_total") >= 1  # n2's too, when pulled with it
    assert _ticks(ctl) == ticks, "acted on when delivered again, not by a tick"
    await until(lambda: ctl.ingest.unacked == [] and "opened" in harness.feed.changes("n1"))
