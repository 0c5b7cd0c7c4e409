"""The node agent end to end: frames on the bus, events exactly once through an outage, commands."""

from __future__ import annotations

import asyncio
import pathlib
import time

import pytest

from healer import config
from healer.agent import daemon, exposition
from healer.bus import base, embedded, provision, subjects
from healer.bus import nats as natsbus
from healer.schemas import codec, commands, events, telemetry
from healer.sim import node_source
from healer.telemetry import nvml
from tests import conftest
from tests.conftest import sample
from tests.fakes import fake_pynvml


class Frames:
    """Collects decoded frames from healer.telemetry.*."""

    def __init__(self) -> None:
        self.frames: list[telemetry.NodeFrame] = []
        self.changed = asyncio.Event()

    async def __call__(self, msg: base.Msg) -> None:
        self.frames.append(codec.decode_frame(msg.data))
        self.changed.set()

    async def wait(self, pred: object, timeout: float = 10.0) -> list[telemetry.NodeFrame]:
        assert callable(pred)
        async with asyncio.timeout(timeout):
            while not pred(self.frames):
                self.changed.clear()
                await self.changed.wait()
        return self.frames


class Running:
    def __init__(self, agent: daemon.Agent) -> None:
        self.agent = agent
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(agent.run(self.stop))

    async def close(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, 10)


async def test_frames_arrive_valid_with_increasing_seq(
    bus: base.Bus, subj: subjects.Subjects, tmp_path: pathlib.Path
) -> None:
    got = Frames()
    await bus.subscribe(subj.all_telemetry, got)
    await bus.flush()
    agent = daemon.Agent(
        node="gpu-01.cluster.local",
        source=node_source.SimSource("gpu-01.cluster.local", seed=1),
        bus=bus,
        state_dir=tmp_path,
        interval_s=0.05,
        gpus_expected=8,
    )
    run = Running(agent)
    try:
        frames = await got.wait(lambda fs: len(fs) >= 5)
    finally:
        await run.close()
    assert {f.node for f in frames} == {"gpu-01.cluster.local"}
    assert [f.seq for f in frames[:5]] == [0, 1, 2, 3, 4]
    assert len({f.boot_id for f in frames}) == 1
    assert all(len(f.gpus) == 8 and f.gpus_expected == 8 and f.source == "sim" for f in frames)
    assert frames[0].ts < frames[4].ts


async def test_agent_start_and_stop_events_are_stored(
    subj: subjects.Subjects, tmp_path: pathlib.Path
) -> None:
    bus = conftest.make_memory_bus(subj)
    agent = daemon.Agent(
        node="n1", source=node_source.SimSource("n1", gpus=2), bus=bus, state_dir=tmp_path, interval_s=0.05
    )
    run = Running(agent)
    await asyncio.sleep(0.2)
    await run.close()
    stored = [codec.decode_event(m.data) for m in bus.streams[subj.stream_events].messages]
    assert [e.kind for e in stored] == ["agent_start", "agent_stop"]
    assert len(agent.spool) == 0
    await bus.close()


async def test_events_during_an_outage_arrive_exactly_once(
    nats_server: embedded.EmbeddedServer, subj: subjects.Subjects, tmp_path: pathlib.Path
) -> None:
    """Stop nats-server for seconds, emit events meanwhile, restart it on the same port: each event
    is stored exactly once, and the agent reconnected by itself."""
    observer = await natsbus.NatsBus.connect(nats_server.url, name="observer")
    await provision.ensure(observer, subj, config.NatsSettings())
    await observer.close()
    fast = config.NatsSettings(url=nats_server.url, reconnect_wait_s=0.1, connect_timeout_s=1)
    agent_bus = await natsbus.NatsBus.connect(nats_server.url, name="agent", nats_settings=fast)
    agent = daemon.Agent(
        node="n1",
        source=node_source.SimSource("n1", gpus=2),
        bus=agent_bus,
        state_dir=tmp_path,
        interval_s=0.05,
    )
    run = Running(agent)
    try:
        before = [events.new("n1", "xid", gpu_index=0, xid=31, message=f"before {i}") for i in range(3)]
        for ev in before:
            agent.emit(ev)
        await conftest.until(lambda: len(agent.spool) == 0)
        await asyncio.to_thread(nats_server.stop)
        await conftest.until(lambda: not agent_bus.connected)
        during = [events.new("n1", "xid", gpu_index=1, xid=79, message=f"during {i}") for i in range(5)]
        for ev in during:
            agent.emit(ev)
        await asyncio.sleep(2.0)
        assert len(agent.spool) == 5, "events must wait in the spool while NATS is away"
        seq_at_outage = agent.seq
        await asyncio.to_thread(nats_server.start)
        await conftest.until(lambda: len(agent.spool) == 0 and agent_bus.connected, timeout=20)
    finally:
        await run.close()
        await agent_bus.close()
    check = await natsbus.NatsBus.connect(nats_server.url, name="check")
    try:
        stored = [codec.decode_event(d) for d in await conftest.read_stream(check, subj.all_events)]
    finally:
        await check.close()
    ids = [e.id for e in stored if e.kind == "xid"]
    assert sorted(ids) == sorted(e.id for e in before + during), "every XID event, once each"
    assert len(ids) == len(set(ids))
    assert [e.kind for e in stored].count("agent_start") == 1
    assert agent.seq > seq_at_outage, "sampling went on through the outage"
    assert sample(agent.metrics.registry, "healer_agent_frames_published_total") > 0


def command(node: str, action: str, token: int = 5, ttl: float = 30.0, **kw: object) -> commands.Command:
    now = time.time()
    return commands.Command.model_validate(
        {
            "id": f"cmd-{action}-{token}-{now}",
            "node": node,
            "action": action,
            "fencing_token": token,
            "issued_at": now - 60,
            "expires_at": now + ttl,
            **kw,
        }
    )


async def hold_lease(bus: natsbus.NatsBus, subj: subjects.Subjects) -> int:
    """Write a controller's lease in KV healer-leases; its revision is the fencing token agents accept."""
    leases = await bus.js.key_value(subj.kv_leases)
    return int(await leases.put("leader.shard-0", b'{"holder": "test"}'))


@pytest.mark.parametrize("kind", ["sim", "nvml-fake"])
async def test_power_command_round_trip_over_real_nats(
    kind: str, nats_bus: natsbus.NatsBus, subj: subjects.Subjects, tmp_path: pathlib.Path
) -> None:
    src: node_source.SimSource | nvml.NvmlSource
    if kind == "sim":
        src = node_source.SimSource("n1", gpus=4, seed=3)
    else:
        src = nvml.NvmlSource("n1", nvml=fake_pynvml.FakeNvml(4).module())
    got = Frames()
    await nats_bus.subscribe(subj.all_telemetry, got)
    await nats_bus.flush()
    agent = daemon.Agent(node="n1", source=src, bus=nats_bus, state_dir=tmp_path, interval_s=0.05)
    run = Running(agent)
    try:
        frames = await got.wait(lambda fs: len(fs) >= 1)
        original = frames[-1].gpus[2].power_limit_w
        assert original == 700.0

        async def send(cmd: commands.Command) -> commands.CommandResult:
            reply = await nats_bus.request(subj.command("n1"), codec.encode(cmd), timeout=5)
            return codec.decode_command_result(reply.data)

        t1 = await hold_lease(nats_bus, subj)  # a controller leads: its lease's revision is the token
        res = await send(command("n1", "set_power_limit", gpu_index=2, percent_of_default=80, token=t1))
        assert res.status == "applied"
        assert res.gpus[0].previous_w == 700.0
        assert res.gpus[0].applied_w == 560.0
        n = len(got.frames)
        frames = await got.wait(lambda fs: len(fs) > n)
        assert frames[-1].gpus[2].power_limit_w == 560.0
        assert frames[-1].gpus[1].power_limit_w == 700.0

        t2 = await hold_lease(nats_bus, subj)  # a new leader
        res = await send(command("n1", "set_power_limit", gpu_index=2, watts=50.0, token=t2))
        assert res.status == "applied"
        assert res.gpus[0].clamped
        assert res.gpus[0].applied_w == 200.0

        expired = await send(command("n1", "restore_power_limit", gpu_index=2, token=t2, ttl=-0.5))
        assert expired.status == "refused"
        assert "expired" in expired.detail
        stale = await send(command("n1", "restore_power_limit", gpu_index=2, token=t1))
        assert stale.status == "refused"
        assert "stale fencing token" in stale.detail

        forged = await send(command("n1", "restore_power_limit", gpu_index=2, token=10**15))
        assert forged.status == "refused"
        assert "no lease's" in forged.detail
        assert sample(agent.metrics.registry, "healer_agent_fencing_refused_total") == 1
        t3 = await hold_lease(nats_bus, subj)
        res = await send(command("n1", "restore_power_limit", gpu_index=2, token=t3))
        assert res.status == "applied"
        assert res.gpus[0].applied_w == 700.0, "restores the limit healer found, not the last one it set"
        n = len(got.frames)
        frames = await got.wait(lambda fs: len(fs) > n)
        assert frames[-1].gpus[2].power_limit_w == 700.0

        garbage = await nats_bus.request(subj.command("n1"), b"{not json", timeout=5)
        assert codec.decode_command_result(garbage.data).status == "refused"
    finally:
        await run.close()


async def test_frames_are_buffered_and_bounded_while_disconnected(
    subj: subjects.Subjects, tmp_path: pathlib.Path
) -> None:
    bus = conftest.make_memory_bus(subj)
    got = Frames()
    await bus.subscribe(subj.all_telemetry, got)
    agent = daemon.Agent(
        node="n1", source=node_source.SimSource("n1", gpus=1), bus=bus, state_dir=tmp_path, buffer_frames=3
    )
    await agent._ensure_connected()
    bus.set_connected(False)
    for _ in range(5):
        await agent.tick()
    assert len(agent.frames) == 3
    assert sample(agent.metrics.registry, "healer_agent_frames_dropped_total") == 2
    bus.set_connected(True)
    await agent.tick()
    await bus.idle()
    assert [f.seq for f in got.frames] == [2, 3, 4, 5], "oldest dropped, the rest in order"
    await bus.close()


async def test_frames_carry_each_gpus_jobs_from_the_job_mapping_directory(
    bus: base.Bus, subj: subjects.Subjects, tmp_path: pathlib.Path
) -> None:
    job_map = tmp_path / "jobs"
    job_map.mkdir()
    (job_map / "0").write_text("4711\n")
    (job_map / "3").write_text("4711\n4712\n")
    got = Frames()
    await bus.subscribe(subj.all_telemetry, got)
    await bus.flush()
    agent = daemon.Agent(
        node="n1",
        source=node_source.SimSource("n1", seed=1),
        bus=bus,
        state_dir=tmp_path / "state",
        interval_s=0.05,
        metrics=exposition.AgentMetrics(job_map_dir=job_map),
    )
    run = Running(agent)
    try:
        frames = await got.wait(lambda fs: len(fs) >= 1)
    finally:
        await run.close()
    jobs = {g.index: g.jobs for g in frames[0].gpus}
    assert jobs[0] == ["4711"]
    assert jobs[3] == ["4711", "4712"]
    assert jobs[1] == []  # no file: no job on that GPU
