"""Every incident can end: the circuit-breaker incident lists the nodes it counted and resolves when
the breaker closes (``healer breaker reset``), also when a previous leader opened it; a hardware
replacement, which only a person can end, resolves on ``healer incidents close``."""

from __future__ import annotations

import asyncio

import pytest

from healer import cli, testing
from healer.controller.core import service
from healer.controller.incidents import book, closing
from healer.controller.remediation import action_runner, healing
from healer.schemas import incidents
from tests.controller.conftest import Fleet, Harness, metric, run_until, warm
from tests.controller.test_healing import events, ladder_rules

pytestmark = pytest.mark.nats


def breaker_events(harness: Harness) -> list[incidents.IncidentEvent]:
    return [e for e in harness.feed.events if e.data.rule_id == action_runner.BREAKER_RULE]


async def trip(harness: Harness, actuator: testing.RecordingActuator, ctl: service.Controller) -> Fleet:
    nodes = [f"n{i:02d}" for i in range(10)]
    fleet = Fleet(harness.bus, nodes)
    await run_until(fleet, lambda: len(ctl.nodes) == 10)
    for node in nodes[:4]:  # 40 % of the fleet, the limit is 10 %: one node
        fleet.overrides[(node, 0)] = {"ecc_dbe_volatile": 1}
    await run_until(fleet, lambda: bool(breaker_events(harness)))
    return fleet


async def test_the_breaker_incident_names_its_nodes_and_resolves_on_reset(harness: Harness) -> None:
    actuator = testing.RecordingActuator()
    ctl = await harness.controller(actuator, breaker_max_percent=10.0)
    fleet = await trip(harness, actuator, ctl)
    opened = breaker_events(harness)[0]
    assert opened.change == "escalated"
    cordoned = sorted({r.node for r in actuator.executed("cordon")})
    assert len(cordoned) == 1
    assert opened.data.evidence["counted_nodes"] == ", ".join(cordoned)
    assert opened.data.evidence["counted"] == 1
    assert opened.data.evidence["limit"] == 1
    assert "this incident then resolves" in opened.data.summary

    code = await asyncio.to_thread(cli.main, ["breaker", "reset", "--nats", harness.srv.url])
    assert code == 0
    await run_until(fleet, lambda: breaker_events(harness)[-1].change == "resolved")
    resolved = breaker_events(harness)[-1]
    assert resolved.data.incident_id == opened.data.incident_id
    assert resolved.data.state == "resolved"
    assert resolved.data.evidence["closed_by"]
    assert await ctl.state.get(book.PREFIX + opened.data.incident_id) is None, "it left KV"
    assert metric(ctl.metrics, "breaker_open") == 0


async def test_a_breaker_incident_of_a_previous_leader_resolves_too(harness: Harness) -> None:
    actuator = testing.RecordingActuator()
    first = await harness.controller(actuator, breaker_max_percent=10.0)
    fleet = await trip(harness, actuator, first)
    opened = breaker_events(harness)[0]
    await harness.crash(first)
    second = await harness.controller(actuator, breaker_max_percent=10.0)
    await run_until(fleet, lambda: second.leader, timeout=20)
    assert any(i.rule_id == action_runner.BREAKER_RULE for i in second.book.open.values())
    await second.breaker.reset(by="sre-on-call")
    await run_until(fleet, lambda: breaker_events(harness)[-1].change == "resolved")
    resolved = breaker_events(harness)[-1]
    assert resolved.data.incident_id == opened.data.incident_id
    assert resolved.data.evidence["closed_by"] == "sre-on-call"


async def test_a_hardware_replacement_ends_when_a_person_closes_it(harness: Harness) -> None:
    ladder_rules(harness)
    fleet = Fleet(harness.bus, ["n1"])
    sched = testing.RecordingActuator()
    ctl = await harness.controller(sched, gpu=testing.RecordingGpuActuator())
    await warm(fleet)
    fleet.overrides[("n1", 1)] = {"row_remap_failure": True}  # contact support: replacement at once
    await run_until(fleet, lambda: bool(events(harness, healing.REPLACEMENT_RULE)))
    rep = events(harness, healing.REPLACEMENT_RULE)[0].data
    assert rep.state == "escalated"
    code = await asyncio.to_thread(
        cli.main,
        [
            "incidents",
            "close",
            rep.incident_id,
            "--nats",
            harness.srv.url,
            "--by",
            "dc-tech",
            "--reason",
            "GPU swapped",
        ],
    )
    assert code == 0
    await run_until(fleet, lambda: events(harness, healing.REPLACEMENT_RULE)[-1].change == "resolved")
    closed = events(harness, healing.REPLACEMENT_RULE)[-1].data
    assert closed.incident_id == rep.incident_id
    assert closed.evidence["closed_by"] == "dc-tech"
    assert closed.evidence["close_reason"] == "GPU swapped"
    assert await ctl.state.get(book.PREFIX + rep.incident_id) is None
    assert await ctl.state.get(closing.PREFIX + rep.incident_id) is None, "the request is consumed"
    assert sched.executed("uncordon") == [], "nothing undone: the person returns the node"


async def test_closing_an_incident_that_is_not_open_is_refused(harness: Harness) -> None:
    code = await asyncio.to_thread(cli.main, ["incidents", "close", "inc-nope", "--nats", harness.srv.url])
    assert code == 1
