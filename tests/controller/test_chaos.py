"""Losing any one NATS server of three is survived: a real 3-node JetStream cluster, two controllers,
faults flowing, and the server leading each of healer's streams and buckets killed (SIGKILL, by its
PID) in turn, then restarted."""

from __future__ import annotations

import asyncio
import collections
import pathlib
from collections.abc import AsyncIterator

import nats.errors
import pytest

from healer import config, errors, testing
from healer.bus import embedded, provision, subjects
from healer.bus import nats as natsbus
from healer.controller.core import service
from healer.schemas import codec, events
from tests.controller.conftest import LEASE_TTL_S, Fleet, Harness, metric, run_until, warm

XID_RULE = """
rules:
  - id: xid-fatal
    description: fatal XID
    on_event: {kind: xid, xid: [79]}
    severity: critical
    actions: [cordon]
    resolve: {for: 1h}
"""


class ClusterHarness(Harness):
    async def setup(self) -> natsbus.NatsBus:
        self.bus = await natsbus.NatsBus.connect(self.srv.url, name="harness")
        await provision.ensure(
            self.bus, subjects.Subjects(), config.NatsSettings(replicas=3, lease_ttl_s=LEASE_TTL_S)
        )
        await self.bus.subscribe("healer.incidents.>", self.feed)
        return self.bus


@pytest.fixture
async def cluster_harness(
    nats_cluster: embedded.EmbeddedCluster, tmp_path: pathlib.Path
) -> AsyncIterator[ClusterHarness]:
    h = ClusterHarness(nats_cluster, tmp_path)  # type: ignore[arg-type]  # only .url is used
    (h.rules / "xid.yaml").write_text(XID_RULE)
    await h.setup()
    try:
        yield h
    finally:
        await h.close()


async def publish_event(bus: natsbus.NatsBus, event: events.NodeEvent) -> None:
    """As the agent does: a durable publish retried while the stream elects a leader."""
    async with asyncio.timeout(30):
        while True:
            try:
                subject = subjects.Subjects().events(event.node)
                await bus.publish_durable(subject, codec.encode(event), event.id)
                return
            except errors.TemporaryError:
                await asyncio.sleep(0.2)


async def leader_of(bus: natsbus.NatsBus, stream: str, *, other_than: str | None = None) -> str:
    """The name of the server leading ``stream`` (``$JS.API.STREAM.INFO``) once it has one other than
    ``other_than``; without ``other_than``, once every replica is current too."""
    async with asyncio.timeout(30):
        while True:
            try:
                cluster = (await bus.js.stream_info(stream)).cluster
            except (nats.errors.Error, TimeoutError):
                cluster = None  # no leader yet: the request goes unanswered or is refused
            if cluster is not None and cluster.leader is not None and cluster.leader != other_than:
                replicas = cluster.replicas or []
                if other_than is not None or all(r.current and not r.offline for r in replicas):
                    return cluster.leader
            await asyncio.sleep(0.1)


@pytest.mark.slow
async def test_killing_the_leader_of_each_stream_and_bucket_loses_nothing_and_repeats_nothing(
    cluster_harness: ClusterHarness, nats_cluster: embedded.EmbeddedCluster
) -> None:
    h = cluster_harness
    subj = subjects.Subjects()
    actuator = testing.RecordingActuator()
    settings = {"breaker_max_percent": 100.0, "breaker_max_nodes": 50}
    controllers = [await h.controller(actuator, **settings), await h.controller(actuator, **settings)]
    streams = [
        f"KV_{subj.kv_leases}", subj.stream_events, f"KV_{subj.kv_state}", subj.stream_incidents,
        subj.stream_telemetry,
    ]  # fmt: skip
    rounds = range(len(streams))
    fleet = Fleet(h.bus, [f"r{i}" for i in rounds] + [f"x{i}" for i in rounds])
    await warm(fleet)
    await run_until(fleet, lambda: any(c.leader for c in controllers))
    loop = asyncio.get_running_loop()
    late: list[float] = []
    for i, stream in enumerate(streams):
        name = await leader_of(h.bus, stream)
        victim = next(s for s in nats_cluster.servers if s.name == name)
        await asyncio.to_thread(victim.kill)  # blocking calls off the loop: the controllers share it
        # Faults while the stream has no leader: a DBE in the frames, an XID on the event stream.
        fleet.overrides[(f"r{i}", 0)] = {"ecc_dbe_volatile": 1}
        await fleet.publish()
        await publish_event(h.bus, events.new(f"x{i}", "xid", gpu_index=1, xid=79))
        for s in streams:  # what the victim led (often more than this one) has a new leader
            await leader_of(h.bus, s, other_than=victim.name)
        elected = loop.time()

        def cordoned(i: int = i) -> bool:
            return {f"r{i}", f"x{i}"} <= {r.node for r in actuator.executed("cordon")}

        await run_until(fleet, cordoned, timeout=30)
        late.append(loop.time() - elected)
        await asyncio.to_thread(victim.start)
        await asyncio.to_thread(nats_cluster.wait_peers)
        for s in streams:
            await leader_of(h.bus, s)  # every replica current again before the next kill
    executed = collections.Counter((r.kind, r.node) for r in actuator.executed())
    expected = {("cordon", f"r{i}") for i in rounds} | {("migrate", f"r{i}") for i in rounds}
    expected |= {("cordon", f"x{i}") for i in rounds}
    assert set(executed) == expected, "no fault lost, nothing acted on that was not a fault"
    assert [k for k, n in executed.items() if n > 1] == [], "no action repeated"
    # Acting again is bounded by the design: when the victim led the lease bucket too, the lease runs
    # out (one TTL) and the next leader's first reads may go into the election (one request timeout,
    # then its task restarts) before its next ticks. Seen at 4.4 s under two CPU burners with such a
    # handover. What this catches is a recovery that waits for the event's redelivery (ack wait, 30 s)
    # or a lease that is never taken again; that a request ends at request_timeout_s and not at
    # nats-py's own 5 s is tested on its own (tests/bus/test_bus.py).
    ns, cs = h.settings().nats, h.settings().controller
    bound = ns.lease_ttl_s + 2 * ns.request_timeout_s + 2 * cs.tick_s
    assert max(late) < bound, f"acting again within a lease handover and a request timeout: {late}"
    leaders = [c for c in controllers if c.leader]
    assert len(leaders) == 1
    assert all(metric(c.metrics, "leader") == (1 if c.leader else 0) for c in controllers)
    assert all(isinstance(c, service.Controller) for c in controllers)
