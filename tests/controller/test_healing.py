"""The controller walks recovery ladders on a real nats-server: contain → reset → validate → return,
the reboot rung, hardware replacement, the repeat limit, failover mid-ladder, dry-run, an operator's stop."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from healer import testing
from healer.actuators import base
from healer.bus import subjects
from healer.cli import main as cli_main
from healer.controller.core import service
from healer.controller.remediation import healing, ladder_record
from healer.controller.store import kv
from healer.schemas import codec, incidents
from healer.schemas import events as node_events
from tests.controller.conftest import Fleet, Harness, run_until, warm

LADDER_RULES = """
rules:
  - id: ecc-dbe
    description: double-bit ECC errors
    scope: gpu
    when: ecc_dbe_volatile > 0
    severity: critical
    actions: [cordon, migrate]
    resolve: {when: "ecc_dbe_volatile == 0", for: 0s}
    on_resolve: [uncordon]
  - id: remap-failed
    description: a row remap failed
    scope: gpu
    when: row_remap_failure > 0
    severity: critical
    actions: [cordon]
ladders:
  - id: reset-then-reboot
    rules: [ecc-dbe]
    steps: [reset_gpu, reboot_node]
    soak: 0s
    dcgm_level: 2
    repeat_limit: {count: 3, within: 30d}
  - id: contact-support
    rules: [remap-failed]
    contact_support: true
"""


def ladder_rules(harness: Harness, repeat_count: int = 3) -> None:
    text = LADDER_RULES.replace("count: 3", f"count: {repeat_count}")
    (harness.rules / "dbe.yaml").write_text(text)


def fault(fleet: Fleet, node: str = "n1", gpu: int = 0) -> None:
    fleet.overrides[(node, gpu)] = {"ecc_dbe_volatile": 1}


def healer_on(fleet: Fleet, kind: str, node: str = "n1", gpu: int = 0) -> Any:
    """A GPU fake's ``on_done``: a successful ``kind`` (reset, validate) clears the fault."""

    def done(request: base.ActionRequest) -> None:
        if request.kind == kind:
            fleet.overrides[(node, gpu)] = {"ecc_dbe_volatile": 0}

    return done


def events(harness: Harness, rule_id: str | None = None, change: str | None = None) -> list[Any]:
    return [
        e
        for e in harness.feed.events
        if (rule_id is None or e.data.rule_id == rule_id) and (change is None or e.change == change)
    ]


def steps(data: incidents.IncidentData) -> list[tuple[str, str]]:
    return [(a.kind, a.status) for a in data.actions]


async def store(harness: Harness) -> kv.Store:
    return kv.Store(await harness.bus.key_value(subjects.Subjects().kv_state))


async def test_reset_validate_return_resolves_the_incident_recovered(harness: Harness) -> None:
    ladder_rules(harness)
    fleet = Fleet(harness.bus, ["n1", "n2"])
    sched = testing.RecordingActuator()
    gpu = testing.RecordingGpuActuator(on_done=healer_on(fleet, "reset_gpu"))
    await harness.controller(sched, gpu=gpu)
    await warm(fleet)
    fault(fleet)
    await run_until(fleet, lambda: bool(events(harness, "ecc-dbe", "resolved")))
    resolved = events(harness, "ecc-dbe", "resolved")[-1].data
    assert resolved.evidence["outcome"] == "recovered"
    assert resolved.evidence["ladder"] == "reset-then-reboot"
    assert steps(resolved) == [
        ("cordon", "done"), ("migrate", "done"), ("reset_gpu", "done"), ("validate", "done"),
        ("return_to_service", "done"),
    ]  # fmt: skip
    assert [r.kind for r in sched.executed()] == ["cordon", "migrate", "uncordon"]
    assert [(r.kind, r.gpu_index) for r in gpu.executed()] == [("reset_gpu", 0), ("validate", 0)]
    validate = gpu.executed("validate")[0]
    assert validate.params["dcgm_level"] == 2
    reset_deadline = gpu.executed("reset_gpu")[0].deadline
    assert reset_deadline is not None
    assert validate.params["soak_since"] >= reset_deadline - 600.0
    state = await store(harness)
    assert await state.keys(healing.PREFIX) == []  # finished ladders leave KV
    history = await state.get(ladder_record.history_key("n1", 0))
    assert history is not None
    assert len(history.value["recoveries"]) == 1
    assert len(events(harness, "ecc-dbe", "opened")) == 1  # the fault is gone: nothing reopens
    assert events(harness, healing.REPLACEMENT_RULE) == []


async def test_a_failed_reset_leads_to_a_reboot_then_validation_and_return(harness: Harness) -> None:
    ladder_rules(harness)
    fleet = Fleet(harness.bus, ["n1"])
    sched = testing.RecordingActuator()
    gpu = testing.RecordingGpuActuator(
        script={"reset_gpu": [incidents.ActionStatus.FAILED_PERMANENT]}, on_done=healer_on(fleet, "validate")
    )
    await harness.controller(sched, gpu=gpu)
    await warm(fleet)
    fault(fleet)
    await run_until(fleet, lambda: bool(events(harness, "ecc-dbe", "resolved")))
    resolved = events(harness, "ecc-dbe", "resolved")[-1].data
    assert resolved.evidence["outcome"] == "recovered"
    assert [k for k, _ in steps(resolved)] == [
        "cordon", "migrate", "reset_gpu", "reboot_node", "validate", "return_to_service",
    ]  # fmt: skip
    assert dict(steps(resolved))["reset_gpu"] == "failed-permanent"
    assert [r.kind for r in sched.executed()] == ["cordon", "migrate", "reboot_node", "uncordon"]
    # each step is on the feed as it happens, not only at the end
    updates = [e.data.evidence.get("ladder.phase") for e in events(harness, "ecc-dbe")]
    assert {"resetting", "rebooting", "validating", "returning"} <= set(updates)


async def test_validation_failing_twice_opens_a_hardware_replacement(harness: Harness) -> None:
    ladder_rules(harness)
    fleet = Fleet(harness.bus, ["n1"])
    sched = testing.RecordingActuator()
    gpu = testing.RecordingGpuActuator(
        script={
            "validate": [incidents.ActionStatus.FAILED_PERMANENT, incidents.ActionStatus.FAILED_PERMANENT]
        }
    )
    await harness.controller(sched, gpu=gpu)
    await warm(fleet)
    fault(fleet)
    # the replacement opens, then the fault's incident is updated with its outcome (two feed events)
    await run_until(
        fleet,
        lambda: (
            bool(events(harness, healing.REPLACEMENT_RULE))
            and events(harness, "ecc-dbe")[-1].data.evidence.get("outcome") == "hardware_replacement"
        ),
    )
    rep = events(harness, healing.REPLACEMENT_RULE)[0].data
    original = events(harness, "ecc-dbe")[-1].data
    assert rep.severity == "critical"
    assert rep.gpu_index == 0
    assert rep.node == "n1"
    assert rep.evidence["device.serial"] == "1650923000001"
    assert rep.evidence["device.board_part_number"] == "692-2G520"
    assert rep.evidence["incident"] == original.incident_id
    assert '"outcome": "validation_failed"' in str(rep.evidence["steps_taken"])
    # the GPU's telemetry as the controller holds it (the fields its rules read)
    assert rep.evidence["telemetry.latest.ecc_dbe_volatile"] == 1
    assert 0 <= float(rep.evidence["telemetry.age_s"]) < 60
    assert steps(rep) == [("hardware_replacement", "done")]
    assert original.evidence["outcome"] == "hardware_replacement"
    assert original.evidence["replacement"] == rep.incident_id
    assert [r.kind for r in gpu.executed()] == ["reset_gpu", "validate", "validate"]
    assert [r.kind for r in sched.executed()] == ["cordon", "migrate", "reboot_node"]
    # the fault clears later: the incident resolves, but the node stays out for the replacement
    fleet.overrides[("n1", 0)] = {"ecc_dbe_volatile": 0}
    await run_until(fleet, lambda: bool(events(harness, "ecc-dbe", "action")) and any(
        a.kind == "uncordon" and a.status == "skipped" for a in events(harness, "ecc-dbe")[-1].data.actions
    ))  # fmt: skip
    assert sched.executed("uncordon") == []


async def test_a_contact_support_fault_goes_to_replacement_at_once(harness: Harness) -> None:
    ladder_rules(harness)
    fleet = Fleet(harness.bus, ["n1"])
    sched = testing.RecordingActuator()
    gpu = testing.RecordingGpuActuator()
    await harness.controller(sched, gpu=gpu)
    await warm(fleet)
    fleet.overrides[("n1", 1)] = {"row_remap_failure": True}
    await run_until(fleet, lambda: bool(events(harness, healing.REPLACEMENT_RULE)))
    rep = events(harness, healing.REPLACEMENT_RULE)[0].data
    assert rep.gpu_index == 1
    assert "contact support" in rep.summary
    assert gpu.requests == []
    assert [r.kind for r in sched.executed()] == ["cordon"]


async def test_the_repeat_limit_sends_a_gpu_to_replacement_without_a_reset(harness: Harness) -> None:
    ladder_rules(harness, repeat_count=2)
    state = await store(harness)
    await state.put(ladder_record.history_key("n1", 0), {"recoveries": [time.time() - 86400.0]})
    fleet = Fleet(harness.bus, ["n1"])
    sched = testing.RecordingActuator()
    gpu = testing.RecordingGpuActuator()
    await harness.controller(sched, gpu=gpu)
    await warm(fleet)
    fault(fleet)
    await run_until(fleet, lambda: bool(events(harness, healing.REPLACEMENT_RULE)))
    rep = events(harness, healing.REPLACEMENT_RULE)[0].data
    assert "recovery number 2" in rep.summary
    assert gpu.requests == []


class HangingValidation(testing.RecordingGpuActuator):
    """Validation never answers (the controller is killed while it waits)."""

    async def apply(self, request: base.ActionRequest) -> base.ActionOutcome:
        if request.kind == "validate":
            self.requests.append(request)
            await asyncio.Event().wait()
        return await super().apply(request)


async def test_a_new_leader_resumes_a_ladder_without_repeating_a_step(harness: Harness) -> None:
    ladder_rules(harness)
    fleet = Fleet(harness.bus, ["n1"])
    sched = testing.RecordingActuator()
    first_gpu = HangingValidation()
    first = await harness.controller(sched, gpu=first_gpu)
    await warm(fleet)
    fault(fleet)
    await run_until(fleet, lambda: bool(first_gpu.executed("validate")))
    await harness.crash(first)
    second_gpu = testing.RecordingGpuActuator(on_done=healer_on(fleet, "validate"))
    await harness.controller(sched, gpu=second_gpu)
    await run_until(fleet, lambda: bool(events(harness, "ecc-dbe", "resolved")), timeout=25)
    resolved = events(harness, "ecc-dbe", "resolved")[-1].data
    assert resolved.evidence["outcome"] == "recovered"
    assert [r.kind for r in first_gpu.requests] == ["reset_gpu", "validate"]
    assert [r.kind for r in second_gpu.requests] == ["validate"]  # the reset is never done again
    # the same command id: an agent that already ran it answers from memory
    assert second_gpu.requests[0].params["action_id"] == first_gpu.requests[1].params["action_id"]
    assert [r.kind for r in sched.executed()] == ["cordon", "migrate", "uncordon"]


async def test_dry_run_publishes_the_whole_ladder_and_runs_none_of_it(harness: Harness) -> None:
    ladder_rules(harness)
    fleet = Fleet(harness.bus, ["n1"])
    sched = testing.RecordingActuator()
    gpu = testing.RecordingGpuActuator()
    await harness.controller(sched, gpu=gpu, mode="dry-run")
    await warm(fleet)
    fault(fleet)
    await run_until(fleet, lambda: len(events(harness, "ecc-dbe", "action")) >= 2)
    opened = events(harness, "ecc-dbe", "opened")[0].data
    plan = str(opened.evidence["ladder.plan"])
    assert "reset_gpu" in plan
    assert "reboot_node" in plan
    assert "hardware_replacement" in plan
    assert [k for k, s in steps(opened)] == [
        "reset_gpu", "validate", "reboot_node", "validate", "hardware_replacement",
    ]  # fmt: skip
    assert {s for _, s in steps(opened)} == {"planned"}
    await asyncio.sleep(0.5)
    assert gpu.requests == []
    assert sched.executed() == []
    assert await (await store(harness)).keys(healing.PREFIX) == []


async def test_an_operator_stops_a_ladder_from_the_cli(harness: Harness) -> None:
    ladder_rules(harness)
    fleet = Fleet(harness.bus, ["n1"])
    sched = testing.RecordingActuator()
    gpu = testing.RecordingGpuActuator(
        script={"reset_gpu": [incidents.ActionStatus.REFUSED] * 10}
    )  # asked again in 60 s
    ctl = await harness.controller(sched, gpu=gpu)
    await warm(fleet)
    fault(fleet)
    await run_until(fleet, lambda: bool(gpu.executed("reset_gpu")))
    incident_id = events(harness, "ecc-dbe", "opened")[0].data.incident_id
    url = harness.srv.url
    status = await asyncio.to_thread(cli_main, ["ladder", "status", "--nats", url])
    assert status == 0
    argv = ["ladder", "stop", incident_id, "--by", "alice", "--reason", "RMA ticket 42", "--nats", url]
    assert await asyncio.to_thread(cli_main, argv) == 0
    await run_until(fleet, lambda: not ctl.recovery.ladders)

    def stop_published() -> bool:  # the feed's outbox publishes after the ladder is gone
        return any(a.kind == "stop_ladder" for a in events(harness, "ecc-dbe")[-1].data.actions)

    await run_until(fleet, stop_published)
    last = events(harness, "ecc-dbe")[-1]
    stopped = [a for a in last.data.actions if a.kind == "stop_ladder"]
    assert "by alice at " in stopped[0].detail
    assert "RMA ticket 42" in stopped[0].detail
    assert last.data.evidence["outcome"] == "ladder_stopped"
    assert sched.executed("uncordon") == []
    assert len(gpu.executed("reset_gpu")) == 1
    unknown = ["ladder", "stop", "inc-nope", "--nats", url]
    assert await asyncio.to_thread(cli_main, unknown) == 1


async def test_at_most_max_concurrent_reboots_nodes_reboot_at_once(harness: Harness) -> None:
    ladder_rules(harness)
    fleet = Fleet(harness.bus, ["n1", "n2"])
    sched = testing.RecordingActuator()
    sched.reboot_phase = base.RebootPhase.ISSUED  # the first reboot never finishes
    gpu = testing.RecordingGpuActuator(script={"reset_gpu": [incidents.ActionStatus.FAILED_PERMANENT] * 2})
    ctl: service.Controller = await harness.controller(sched, gpu=gpu, breaker_max_percent=100)
    await warm(fleet)
    fault(fleet, "n1")
    fault(fleet, "n2")

    def waiting() -> bool:
        return any(
            a.kind == "reboot_node" and a.status is None and "max_concurrent_reboots" in a.detail
            for inc in ctl.book.all()
            for a in inc.actions
        )

    await run_until(fleet, lambda: len(sched.executed("reboot_node")) == 1 and waiting())
    for _ in range(5):
        await fleet.publish()
        await asyncio.sleep(0.2)
    assert len(sched.executed("reboot_node")) == 1


async def test_ladders_asking_at_once_never_both_take_the_last_reboot_place(harness: Harness) -> None:
    """Each ladder's action task asks for a reboot place while the others wait on KV: the CI run once
    rebooted two nodes with ``max_concurrent_reboots: 1``."""
    ladder_rules(harness)
    ctl = await harness.controller(testing.RecordingActuator(), gpu=testing.RecordingGpuActuator())
    assert ctl.cs.max_concurrent_reboots == 1
    await run_until(Fleet(harness.bus, ["n1"]), lambda: ctl.leader)  # the takeover has loaded the ladders
    counts = await asyncio.gather(*(ctl.recovery.reboots(n) for n in ("n1", "n2", "n3")))
    assert len(ctl.recovery.reserved) == 1
    assert sorted(counts) == [0, 1, 1]


XID_48 = """
  - id: xid-fatal
    description: fatal XID
    on_event: {kind: xid, xid: [48]}
    severity: critical
    actions: [cordon]
    resolve: {for: 1h}
"""


async def test_a_fault_seen_twice_is_one_ladder_and_nothing_reopens_once_it_recovered(
    harness: Harness,
) -> None:
    """A DBE shows in telemetry and as XID 48: one incident (joined), one reset, and once the ladder
    returns the node, neither signal opens the fault again (every joined firing is released)."""
    text = LADDER_RULES.replace("ladders:", XID_48.strip("\n") + "\nladders:", 1)
    text = text.replace("rules: [ecc-dbe]", "rules: [ecc-dbe, xid-fatal]")
    (harness.rules / "dbe.yaml").write_text(text)
    fleet = Fleet(harness.bus, ["n1", "n2"])
    sched = testing.RecordingActuator()
    gpu = testing.RecordingGpuActuator(on_done=healer_on(fleet, "reset_gpu"))
    ctl = await harness.controller(sched, gpu=gpu)
    await run_until(fleet, lambda: ctl.leader)
    await warm(fleet)
    fault(fleet)
    xid = node_events.new("n1", "xid", gpu_index=0, xid=48)
    await harness.bus.publish_durable(subjects.Subjects().events("n1"), codec.encode(xid), msg_id=xid.id)
    await run_until(fleet, lambda: bool(events(harness, change="resolved")), timeout=30)
    for _ in range(10):  # ticks after the recovery: the XID's quiet period (1 h) has not run out
        await fleet.publish()
        await asyncio.sleep(0.2)
    assert len(events(harness, change="opened")) == 1
    resolved = events(harness, change="resolved")[-1].data
    assert resolved.evidence["outcome"] == "recovered"
    assert set(str(resolved.evidence["signals"]).split(",")) == {"ecc-dbe", "xid-fatal"}
    assert [r.kind for r in gpu.executed()] == ["reset_gpu", "validate"]
