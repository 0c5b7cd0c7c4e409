"""The controller runs on the in-memory bus too (the Bus Protocol covers everything it uses): the same
closed loop as on a nats-server, with no server at all."""

from __future__ import annotations

import pathlib

from healer import config, testing
from healer.bus import subjects
from healer.controller.core import service
from healer.schemas import codec, events, incidents
from tests import conftest
from tests.controller.conftest import DBE_RULES, Fleet, run_until, warm

XID_RULE = """
rules:
  - id: xid-fatal
    description: fatal XID
    on_event: {kind: xid, xid: [79]}
    severity: critical
    actions: [cordon]
    resolve: {for: 1h}
"""


async def test_the_controller_acts_on_frames_and_events_over_the_memory_bus(tmp_path: pathlib.Path) -> None:
    subj = subjects.Subjects()
    bus = conftest.make_memory_bus(subj)
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "dbe.yaml").write_text(DBE_RULES)
    (rules / "xid.yaml").write_text(XID_RULE)
    settings = config.Settings(
        controller=config.ControllerSettings.model_validate(
            {"rules_dir": str(rules), "tick_s": 0.2, "mode": "enforce", "uncordon_hold_s": 0,
             "admission": "first-seen", "breaker_max_percent": 100.0}
        ),
    )  # fmt: skip
    actuator = testing.RecordingActuator()
    ctl = await service.build(settings, bus, scheduler=actuator)
    await ctl.start()
    try:
        fleet = Fleet(bus, ["n1", "n2"])
        await run_until(fleet, lambda: ctl.leader)
        await warm(fleet)
        fleet.overrides[("n1", 0)] = {"ecc_dbe_volatile": 1}
        event = events.new("n2", "xid", gpu_index=1, xid=79)
        await bus.publish_durable(subj.events("n2"), codec.encode(event), msg_id=event.id)
        await run_until(fleet, lambda: len(actuator.executed()) == 3)
        assert sorted((r.kind, r.node) for r in actuator.executed()) == [
            ("cordon", "n1"), ("cordon", "n2"), ("migrate", "n1"),
        ]  # fmt: skip
        assert {r.fencing_token for r in actuator.executed()} == {ctl.lease.token}
        del fleet.overrides[("n1", 0)]
        await run_until(fleet, lambda: ("uncordon", "n1") in {(r.kind, r.node) for r in actuator.executed()})
        stream = bus.stream(subj.stream_incidents)
        changes = [codec.decode_incident(m.data).change for m in stream.messages]
        assert changes.count(incidents.Change.OPENED) == 2, changes
        assert "resolved" in changes
    finally:
        await ctl.stop()
