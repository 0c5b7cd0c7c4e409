"""What the controller believes, against a real nats-server (DESIGN §8): identity from the subject, the
fleet the operator admits, time on the controller's clock.

Ordering without sleeps: one publisher's messages reach one subscription in order, so once a good frame
sent *after* a bad one has been ingested, the bad one has been judged (``listening`` makes sure the
controller's subscription exists before the first frame)."""

from __future__ import annotations

import pathlib
import time
from typing import Any

import orjson
import pytest
import structlog

from healer import config, errors, testing
from healer.bus import subjects
from healer.controller.inventory import admission
from healer.controller.observability import metrics
from healer.schemas import codec, events, telemetry
from healer.sim import node_source
from tests.conftest import sample, until
from tests.controller.conftest import Fleet, Harness, metric, run_until
from tests.controller.test_controller import LabelledScheduler

SUBJ = subjects.Subjects()
XID_RULES = (
    "rules:\n  - id: xid-fatal\n    description: fatal XID\n    on_event: {kind: xid, xid: [48]}\n"
    "    scope: gpu\n    severity: critical\n    actions: [cordon]\n    resolve: {for: 10m}\n"
)


def frame(node: str, gpus: int = 2, **fields: Any) -> telemetry.NodeFrame:
    doc: dict[str, Any] = {
        "node": node, "ts": time.time(), "seq": 1, "boot_id": "b", "agent_version": "t", "source": "sim",
        "gpus_expected": gpus, "gpus": node_source.SimSource(node, gpus=gpus, seed=1).sample().gpus, **fields,
    }  # fmt: skip
    return telemetry.NodeFrame(**doc)


async def listening(harness: Harness, actuator: testing.RecordingActuator, **settings: Any) -> Any:
    """A started controller whose telemetry subscription the server has registered (a frame published
    before that would reach nobody)."""
    ctl = await harness.controller(actuator, **settings)
    await ctl.bus.flush()
    return ctl


async def send(harness: Harness, subject_node: str, f: telemetry.NodeFrame) -> None:
    await harness.bus.publish(SUBJ.telemetry(subject_node), codec.encode(f))


@pytest.mark.usefixtures("frame_decoder")
async def test_a_frame_naming_another_node_is_rejected_and_counted(harness: Harness) -> None:
    ctl = await listening(harness, testing.RecordingActuator())
    await send(harness, "gpu-a", frame("gpu-b"))
    await send(harness, "gpu-a", frame("gpu-a"))
    await until(lambda: metric(ctl.metrics, "frames_ingested_total") == 1)
    assert (
        sample(
            ctl.metrics.registry,
            "healer_controller_messages_rejected_total",
            kind="frame",
            reason="identity_mismatch",
        )
        == 1
    )
    assert ctl.nodes == {"gpu-a"}
    assert ctl.engine is not None
    assert ctl.engine.state.node_index("gpu-b") is None


async def test_an_event_naming_another_node_cordons_nothing(harness: Harness) -> None:
    (harness.rules / "xid.yaml").write_text(XID_RULES)
    actuator = testing.RecordingActuator()
    ctl = await listening(harness, actuator)
    await until(lambda: ctl.leader)
    forged = events.new("gpu-b", "xid", gpu_index=0, xid=48)
    await harness.bus.publish_durable(SUBJ.events("gpu-a"), codec.encode(forged), msg_id=forged.id)
    real = events.new("gpu-a", "xid", gpu_index=1, xid=48)
    await harness.bus.publish_durable(SUBJ.events("gpu-a"), codec.encode(real), msg_id=real.id)
    await until(lambda: len(actuator.executed()) == 1)
    assert [(r.kind, r.node) for r in actuator.executed()] == [("cordon", "gpu-a")]
    assert (
        sample(
            ctl.metrics.registry,
            "healer_controller_messages_rejected_total",
            kind="event",
            reason="identity_mismatch",
        )
        == 1
    )
    assert harness.feed.changes("gpu-b") == []


async def test_unknown_nodes_allocate_nothing_and_do_not_grow_the_breakers_fleet(
    harness: Harness, tmp_path: pathlib.Path
) -> None:
    inventory = tmp_path / "nodes.yaml"
    inventory.write_text("nodes: [gpu-a, gpu-b]\n")
    ctl = await listening(
        harness, testing.RecordingActuator(), admission="file", inventory_file=str(inventory)
    )
    for i in range(200):
        await send(harness, f"ghost-{i}", frame(f"ghost-{i}"))
    await send(harness, "gpu-a", frame("gpu-a"))
    await until(lambda: metric(ctl.metrics, "frames_ingested_total") == 1)
    assert (
        sample(
            ctl.metrics.registry,
            "healer_controller_messages_rejected_total",
            kind="frame",
            reason="unknown_node",
        )
        == 200
    )
    assert ctl.nodes == {"gpu-a"}
    assert ctl.engine is not None
    assert ctl.engine.state.n == 1
    assert ctl.incidents.fleet_size() == 2, "the admitted fleet, not what reported"
    assert metric(ctl.metrics, "nodes_admitted") == 2


async def test_scheduler_admission_admits_only_the_nodes_the_scheduler_lists(harness: Harness) -> None:
    scheduler = LabelledScheduler({"n1": {}})
    ctl = await listening(harness, scheduler, admission="scheduler", admission_refresh_s=0.1)
    fleet = Fleet(harness.bus, ["n1", "ghost"])
    await run_until(fleet, lambda: "n1" in ctl.nodes)
    await until(lambda: "ghost" in ctl.admission.refused)
    assert ctl.nodes == {"n1"}
    assert ctl.admission.admitted == {"n1"}
    assert ctl.incidents.fleet_size() == 1


def test_scheduler_admission_needs_a_scheduler_that_lists_nodes() -> None:
    cs = config.ControllerSettings(admission="scheduler", actuator="log")
    with pytest.raises(errors.PermanentError, match="admission 'first-seen'"):
        admission.Admission(cs, metrics.ControllerMetrics(), scheduler=testing.RecordingActuator(), log=None)
    assert config.ControllerSettings().admission == "scheduler", "the safe default"


@pytest.mark.usefixtures("frame_decoder")
async def test_a_frame_with_more_gpus_than_allowed_never_widens_the_state(harness: Harness) -> None:
    ctl = await listening(harness, testing.RecordingActuator(), max_gpus_per_node=8)
    await send(harness, "gpu-a", frame("gpu-a", gpus=32))
    await send(harness, "gpu-a", frame("gpu-a", gpus=2))
    await until(lambda: metric(ctl.metrics, "frames_ingested_total") == 1)
    assert (
        sample(
            ctl.metrics.registry,
            "healer_controller_messages_rejected_total",
            kind="frame",
            reason="too_many_gpus",
        )
        == 1
    )
    assert ctl.engine is not None
    assert ctl.engine.state.gpus == 8


async def test_a_clock_ten_years_ahead_is_counted_and_does_not_silence_the_node(harness: Harness) -> None:
    ctl = await listening(harness, testing.RecordingActuator())
    await send(harness, "gpu-a", frame("gpu-a", ts=time.time() + 10 * 365 * 86400))
    for i in range(3):
        await send(harness, "gpu-a", frame("gpu-a", seq=2 + i))
    await until(lambda: metric(ctl.metrics, "frames_ingested_total") == 4)
    assert metric(ctl.metrics, "clock_skewed_total", kind="frame") == 1
    assert ctl.engine is not None
    ctl.engine.evaluate(ctl.clock())
    assert ctl.engine.state.dropped_frames == 0


@pytest.mark.usefixtures("frame_decoder")
async def test_impossible_readings_are_counted_per_field(harness: Harness) -> None:
    ctl = await listening(harness, testing.RecordingActuator())
    hot = frame("gpu-a")
    doc = hot.model_dump(mode="json", by_alias=True)
    doc["gpus"][0]["temp_c"] = 1e300
    await harness.bus.publish(SUBJ.telemetry("gpu-a"), orjson.dumps(doc))
    await send(harness, "gpu-a", frame("gpu-a"))
    await until(lambda: metric(ctl.metrics, "frames_ingested_total") == 1)
    assert (
        sample(
            ctl.metrics.registry, "healer_controller_invalid_fields_total", kind="frame", field="gpus.temp_c"
        )
        == 1
    )
    assert (
        sample(
            ctl.metrics.registry, "healer_controller_decode_errors_total", kind="frame", reason="validation"
        )
        == 1
    )


async def test_incidents_of_a_forgotten_node_resolve_without_undoing_anything(harness: Harness) -> None:
    (harness.rules / "silent.yaml").write_text(
        "rules:\n  - id: node-silent\n    description: silent\n    scope: node\n"
        "    when: absent(telemetry[1s])\n    severity: major\n    actions: [cordon]\n"
        "    on_resolve: [uncordon]\n"
    )
    actuator = testing.RecordingActuator()
    ctl = await listening(harness, actuator, node_retention_s=3.0)
    await send(harness, "gpu-a", frame("gpu-a"))
    await until(lambda: len(actuator.executed("cordon")) == 1)
    await until(lambda: "resolved" in harness.feed.changes("gpu-a"), timeout=15)
    assert metric(ctl.metrics, "nodes_forgotten_total") == 1
    assert actuator.executed("uncordon") == [], "healer's cordon on a node that left stays"
    assert ctl.nodes == set()


def test_the_gpu_limit_is_never_below_the_configured_gpus_per_node() -> None:
    cs = config.ControllerSettings(admission="first-seen", gpus_per_node=32, max_gpus_per_node=16)
    meters = metrics.ControllerMetrics()
    check = admission.Admission(cs, meters, scheduler=None, log=structlog.get_logger())
    assert check.frame_ok("gpu-a", frame("gpu-a", gpus=32))
    assert not check.frame_ok("gpu-a", frame("gpu-a", gpus=33))
    assert (
        sample(
            meters.registry,
            "healer_controller_messages_rejected_total",
            kind="frame",
            reason="too_many_gpus",
        )
        == 1
    )
