"""The live simulated fleet on a bus: frames and events out, commands in, and a power cap that cools
(the closed loop), on the in-memory bus and on a real nats-server."""

from __future__ import annotations

import pathlib
import time

import pytest
from structlog.testing import capture_logs

from healer import errors
from healer.agent import sim_fleet
from healer.bus import base, subjects
from healer.schemas import codec, commands
from healer.sim import recording, replay, scenarios
from tests import conftest


def _command(node: str, cid: str, **kw: object) -> bytes:
    now = time.time()
    cmd = commands.Command(
        id=cid,
        node=node,
        fencing_token=1,
        issued_at=now,
        expires_at=now + 60,
        **kw,
    )
    return codec.encode(cmd)


async def test_live_fleet_publishes_frames_and_events_and_a_power_cap_cools_the_gpu(
    bus: base.Bus, subj: subjects.Subjects
) -> None:
    sc = scenarios.Scenario(name="t", workload={"training": 1.0})
    sim = scenarios.build(sc, nodes=3, gpus=4, seed=1, start_ts=time.time(), run_id=scenarios.fresh_run_id())
    fleet_live = sim_fleet.LiveFleet(sim, bus, subj, interval_s=1.0)
    frames_seen, events_seen = conftest.Collector(), conftest.Collector()
    await bus.subscribe(subj.all_telemetry, frames_seen)
    await bus.subscribe(subj.all_events, events_seen)
    await fleet_live.start()
    await bus.flush()
    await fleet_live.tick(1.0)
    evts = await events_seen.wait_for(3)
    assert sorted(codec.decode_event(m.data).kind for m in evts) == ["agent_start"] * 3
    await frames_seen.wait_for(3)
    first = {subj.node_of(m.subject): codec.decode_frame(m.data) for m in frames_seen.msgs}
    assert set(first) == {"sim-00000", "sim-00001", "sim-00002"}
    assert all(f.source == "sim" and len(f.gpus) == 4 for f in first.values())

    for _ in range(60):
        await fleet_live.tick(5.0)
    before = codec.decode_frame((await frames_seen.wait_for(3 * 61))[3 * 61 - 1].data)
    reply = await bus.request(
        subj.command("sim-00002"),
        _command("sim-00002", "c1", action="set_power_limit", gpu_index=1, watts=300.0),
    )
    result = codec.decode_command_result(reply.data)
    assert result.status == "applied"
    assert result.gpus[0].applied_w == 300.0
    for _ in range(60):
        await fleet_live.tick(5.0)
    after = codec.decode_frame((await frames_seen.wait_for(3 * 121))[3 * 121 - 1].data)
    assert before.node == after.node == "sim-00002"
    hot, cool = before.gpus[1], after.gpus[1]
    assert cool.power_limit_w == 300.0
    assert hot.temp_c is not None
    assert cool.temp_c is not None
    assert cool.temp_c < hot.temp_c - 10
    assert after.gpus[0].power_limit_w == 700.0

    reply = await bus.request(
        subj.command("sim-00002"), _command("sim-00002", "c2", action="restore_power_limit")
    )
    assert codec.decode_command_result(reply.data).status == "applied"
    assert sim.fleet.power_limit[2, 1] == 700.0
    await fleet_live.close()


async def test_live_fleet_refuses_garbage_and_a_silent_node_does_not_answer(
    bus: base.Bus, subj: subjects.Subjects
) -> None:
    sim = scenarios.build(scenarios.load("healthy"), nodes=2, gpus=2, seed=1, run_id=scenarios.fresh_run_id())
    fleet_live = sim_fleet.LiveFleet(sim, bus, subj)
    await fleet_live.start()
    await bus.flush()
    reply = await bus.request(subj.command("sim-00000"), b"{not json")
    result = codec.decode_command_result(reply.data)
    assert result.status == "refused"
    assert "json" in result.detail
    sim.fleet.silent[1] = True
    with pytest.raises(errors.TemporaryError):
        await bus.request(
            subj.command("sim-00001"),
            _command("sim-00001", "c3", action="set_power_limit", watts=300.0),
            timeout=0.3,
        )
    assert fleet_live.stats.commands_ignored == 1
    await fleet_live.close()


async def test_replay_republishes_the_recorded_frames_and_events(
    bus: base.Bus, subj: subjects.Subjects, tmp_path: pathlib.Path
) -> None:
    sim = scenarios.build(
        scenarios.load("fell-off-bus"), nodes=2, gpus=2, seed=3, run_id=scenarios.fresh_run_id()
    )
    path = tmp_path / "r.npz"
    recording.record(sim, path, duration_s=100.0, interval_s=10.0)
    frames_seen, events_seen = conftest.Collector(), conftest.Collector()
    await bus.subscribe(subj.all_telemetry, frames_seen)
    await bus.subscribe(subj.all_events, events_seen)
    await bus.flush()
    with recording.Recording(path) as rec:
        stats = await replay.replay(rec, bus, subj, speed=0, rebase=False)
        expected = [b for _, step in rec.frames(source="replay") for _, b in step]
        n_events = len(rec.events())
    assert stats.frames == len(expected) == 20  # a node with a lost GPU keeps reporting
    got = await frames_seen.wait_for(len(expected))
    assert [m.data for m in got] == expected
    assert codec.decode_frame(got[0].data).source == "replay"
    evts = await events_seen.wait_for(n_events)
    assert {codec.decode_event(m.data).kind for m in evts} == {"agent_start", "xid", "gpu_lost"}


async def test_an_outage_drops_frames_but_keeps_events_for_later(subj: subjects.Subjects) -> None:
    mem = conftest.make_memory_bus(subj)
    sim = scenarios.build(scenarios.load("healthy"), nodes=2, gpus=2, seed=1, run_id="outage")
    fleet_live = sim_fleet.LiveFleet(sim, mem, subj)
    events_seen = conftest.Collector()
    await mem.subscribe(subj.all_events, events_seen)
    mem.set_connected(False)
    with capture_logs() as logs:
        await fleet_live.tick(1.0)
    assert fleet_live.stats.frames_dropped == 2
    assert fleet_live.stats.events_retried == 2
    assert {e["event"] for e in logs} >= {"sim.frames_dropped", "sim.events_deferred"}
    mem.set_connected(True)
    await fleet_live.tick(1.0)
    assert fleet_live.stats.frames == 2
    assert len(await events_seen.wait_for(2)) == 2
    await mem.close()
