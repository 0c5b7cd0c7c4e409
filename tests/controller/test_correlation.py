"""One incident per fault, against a real nats-server: a DBE seen in telemetry and as XID 48 is one
incident with one cordon and one migrate; a failover keeps the join; another GPU, or the same GPU after
the window, is another fault."""

from __future__ import annotations

import asyncio
import time

from healer import testing
from healer.bus import nats as natsbus
from healer.bus import subjects
from healer.controller.core import service
from healer.schemas import codec, events, incidents
from tests.controller.conftest import Fleet, Harness, run_until, warm

XID_RULES = """
rules:
  - id: xid-fatal
    description: fatal XID
    scope: gpu
    on_event: {kind: xid, xid: [48, 79]}
    severity: critical
    actions: [cordon, migrate, inspect]
    resolve: {for: 4s}
"""
DBE_KEY = ("ecc-dbe", "n1", 1, None)
XID_KEY = ("xid-fatal", "n1", 1, None)


async def xid(harness: Harness, node: str, gpu: int, code: int = 48, uuid: str | None = None) -> None:
    event = events.new(node, "xid", gpu_index=gpu, gpu_uuid=uuid, xid=code, message="DBE")
    await harness.bus.publish_durable(subjects.Subjects().events(node), codec.encode(event), msg_id=event.id)


def joins(harness: Harness) -> list[incidents.IncidentEvent]:
    return [e for e in harness.feed.events if e.change == "updated" and "signals" in e.data.evidence]


def opened(harness: Harness) -> list[incidents.IncidentData]:
    return [e.data for e in harness.feed.events if e.change == "opened"]


async def test_a_dbe_in_telemetry_and_its_xid_48_are_one_incident_with_each_action_once(
    harness: Harness,
) -> None:
    (harness.rules / "xid.yaml").write_text(XID_RULES)
    actuator = testing.RecordingActuator()
    await harness.controller(actuator)
    fleet = Fleet(harness.bus, ["n1"])
    await warm(fleet)
    uuid = fleet.frame("n1").gpus[1].uuid
    fleet.overrides[("n1", 1)] = {"ecc_dbe_volatile": 1}
    await xid(harness, "n1", 1, uuid=uuid)
    await run_until(fleet, lambda: bool(joins(harness)) and len(actuator.executed()) == 3)
    for _ in range(5):  # more frames: still firing, nothing new
        await fleet.publish()
    await run_until(fleet, lambda: len(harness.feed.events) >= 5)
    assert len(opened(harness)) == 1, "one incident"
    [join] = joins(harness)
    assert join.data.incident_id == opened(harness)[0].incident_id
    joined = join.data.evidence["signals"]
    assert isinstance(joined, str)
    assert set(joined.split(",")) == {"ecc-dbe", "xid-fatal"}
    assert "joined by" in join.data.summary
    assert join.data.severity == "critical"
    assert join.subject == "node/n1/gpu/1"
    signals = {k.split(".", 1)[0] for k in join.data.evidence if "." in k}
    assert signals & {"ecc-dbe", "xid-fatal"}, "the joined signal's own values are in the evidence"
    last = harness.feed.events[-1].data
    assert sorted((a.kind, a.status) for a in last.actions) == [
        ("cordon", "done"), ("inspect", "done"), ("migrate", "done"),
    ], "each kind once: the XID rule adds only its inspect"  # fmt: skip
    assert len(actuator.executed()) == 3
    assert {r.incident_id for r in actuator.executed()} == {join.data.incident_id}


async def test_a_fault_on_another_gpu_is_another_incident(harness: Harness) -> None:
    (harness.rules / "xid.yaml").write_text(XID_RULES)
    actuator = testing.RecordingActuator()
    await harness.controller(actuator)
    fleet = Fleet(harness.bus, ["n1"])
    await warm(fleet)
    fleet.overrides[("n1", 0)] = {"ecc_dbe_volatile": 1}
    await xid(harness, "n1", 1)
    await run_until(fleet, lambda: len(opened(harness)) == 2)
    assert sorted((i.rule_id, i.gpu_index) for i in opened(harness)) == [("ecc-dbe", 0), ("xid-fatal", 1)]
    assert joins(harness) == []


async def test_the_same_gpu_after_the_window_is_another_incident(harness: Harness) -> None:
    (harness.rules / "xid.yaml").write_text(XID_RULES)
    offset = [0.0]
    bus = await natsbus.NatsBus.connect(harness.srv.url, name="controller-clocked")
    ctl = await service.build(
        harness.settings(), bus, scheduler=testing.RecordingActuator(), clock=lambda: time.time() + offset[0]
    )
    await ctl.start()
    harness.controllers.append((ctl, bus))
    fleet = Fleet(harness.bus, ["n1"])
    await warm(fleet)
    fleet.overrides[("n1", 1)] = {"ecc_dbe_volatile": 1}
    await run_until(fleet, lambda: len(opened(harness)) == 1)
    offset[0] = ctl.cs.correlate_window_s + 1  # the controller's clock moves past the window
    await xid(harness, "n1", 1)
    await run_until(fleet, lambda: len(opened(harness)) == 2)
    assert [i.rule_id for i in opened(harness)] == ["ecc-dbe", "xid-fatal"]
    assert joins(harness) == []


async def test_a_failover_keeps_the_join_and_resolves_only_when_every_signal_has(harness: Harness) -> None:
    (harness.rules / "xid.yaml").write_text(XID_RULES)
    actuator = testing.RecordingActuator()
    a = await harness.controller(actuator)
    fleet = Fleet(harness.bus, ["n1"])
    await run_until(fleet, lambda: a.leader)
    b = await harness.controller(actuator)
    await warm(fleet)
    fleet.overrides[("n1", 1)] = {"ecc_dbe_volatile": 1}
    await xid(harness, "n1", 1)
    await run_until(fleet, lambda: bool(joins(harness)) and len(actuator.executed()) == 3)
    await harness.crash(a)

    def joined_in_b() -> bool:
        inc = b.book.get(XID_KEY)
        return b.leader and inc is not None and inc is b.book.get(DBE_KEY)

    await run_until(fleet, joined_in_b, timeout=20)
    fleet.overrides[("n1", 1)] = {"ecc_dbe_volatile": 0}  # the DBE clears; XIDs keep coming

    def dbe_resolved() -> bool:
        inc = b.book.get(DBE_KEY)
        signal = inc.signal(DBE_KEY) if inc is not None else None
        return signal is not None and signal.resolved_at is not None

    async with asyncio.timeout(15):
        while not dbe_resolved():
            await xid(harness, "n1", 1)  # the XID signal keeps firing: it alone holds the incident open
            await fleet.publish()
            await asyncio.sleep(0.2)
    assert "resolved" not in harness.feed.changes(), "the XID signal still holds the incident open"
    assert actuator.executed("uncordon") == []
    await run_until(fleet, lambda: len(actuator.executed("uncordon")) == 1)  # XIDs stop: it goes quiet
    changes = harness.feed.changes()
    assert (changes.count("opened"), changes.count("resolved")) == (1, 1)
    assert sorted(r.kind for r in actuator.executed()) == ["cordon", "cordon", "migrate", "uncordon"]
    resolved = next(e.data for e in harness.feed.events if e.change == "resolved")
    assert [a.kind for a in resolved.actions] == ["cordon", "migrate", "inspect"], "each kind once"
