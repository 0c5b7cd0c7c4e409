"""Storage cannot starve healing: telemetry filling a small JetStream store (a real nats-server started
with a small ``max_file_store``) never stops the lease, the incidents, the actions or ``healer breaker
reset``, because every stream reserves its byte limit. Without the limits (as provisioned before), the
same flood stops them, and what fails says why in one line."""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import AsyncIterator

import pytest
import structlog.testing

from healer import cli, config, errors, testing
from healer.bus import embedded, provision, subjects
from healer.bus import nats as natsbus
from healer.controller.observability import metrics, storage
from healer.controller.remediation import policy
from healer.controller.store import kv, lease
from healer.schemas import codec, events
from tests.conftest import sample
from tests.controller.conftest import LEASE_TTL_S, Fleet, Harness, run_until

pytestmark = pytest.mark.nats

MIB = 2**20
SMALL = {
    "telemetry_max_bytes": 24 * MIB,
    "events_max_bytes": 4 * MIB,
    "incidents_max_bytes": 4 * MIB,
    "state_max_bytes": 4 * MIB,
    "leases_max_bytes": 1 * MIB,
}
"""37 MiB of reservations in a 48 MB store."""

XID_CORDON = """
rules:
  - id: xid-fatal
    description: fatal XID
    on_event: {kind: xid, xid: [79]}
    severity: critical
    actions: [cordon]
    resolve: {for: 1h}
"""


def small_settings(url: str) -> config.NatsSettings:
    return config.NatsSettings(url=url, lease_ttl_s=LEASE_TTL_S, **SMALL)


class SmallStore(Harness):
    """The controller harness on a server whose store is 48 MB, provisioned with small byte limits."""

    async def setup(self) -> natsbus.NatsBus:
        self.bus = await natsbus.NatsBus.connect(self.srv.url, name="harness")
        await provision.ensure(self.bus, subjects.Subjects(), small_settings(self.srv.url))
        await self.bus.subscribe("healer.incidents.>", self.feed)
        return self.bus


@pytest.fixture
async def small_store(tmp_path: pathlib.Path) -> AsyncIterator[SmallStore]:
    srv = embedded.EmbeddedServer(tmp_path / "nats", max_file_store="48MB")
    srv.start()
    h = SmallStore(srv, tmp_path)
    try:
        await h.setup()
        yield h
        await h.close()
    finally:
        srv.stop()


async def flood(bus: natsbus.NatsBus, total_bytes: int) -> None:
    """Telemetry-sized frames (7.7 kB, as an 8-GPU node's) on the telemetry subjects, ``total_bytes``."""
    subj = subjects.Subjects()
    payload = b"x" * 7700
    for i in range(total_bytes // len(payload)):
        await bus.publish(subj.telemetry(f"flood{i % 500}"), payload)
        if i % 500 == 0:
            await bus.flush()
    await bus.flush()


async def test_a_store_full_of_telemetry_still_leads_acts_and_resets_the_breaker(
    small_store: SmallStore,
) -> None:
    h = small_store
    await flood(h.bus, 96 * MIB)  # twice the whole store
    report = await h.bus.storage(storage.streams_of(subjects.Subjects()))
    by_name = {s.name: s for s in report.streams}
    assert by_name["HEALER_TELEMETRY"].bytes <= 24 * MIB, "telemetry kept to its own limit"
    assert by_name["HEALER_TELEMETRY"].bytes > 20 * MIB, "and the flood did fill it"
    assert report.problem() is None

    (h.rules / "xid.yaml").write_text(XID_CORDON)
    actuator = testing.RecordingActuator()
    ctl = await h.controller(actuator)
    fleet = Fleet(h.bus, ["n1", "n2"])
    await run_until(fleet, lambda: ctl.leader)  # the lease is taken
    xid = events.new("n1", "xid", gpu_index=0, xid=79)
    await h.bus.publish_durable(subjects.Subjects().events("n1"), codec.encode(xid), msg_id=xid.id)
    await run_until(fleet, lambda: bool(actuator.executed("cordon")))  # an incident opened and acted on
    assert "opened" in h.feed.changes("n1")
    assert await ctl.storage.check() is None
    assert sample(ctl.metrics.registry, "healer_jetstream_storage_ok") == 1

    code = await asyncio.to_thread(cli.main, ["breaker", "reset", "--nats", h.srv.url])
    assert code == 0
    state = await policy.Breaker(ctl.state, ctl.cs).status()
    assert state["open"] is False
    assert "reset_by" in state


async def test_without_byte_limits_the_full_store_is_named_in_one_line(small_store: SmallStore) -> None:
    """As provisioned before: telemetry without a byte limit fills the store, and then every KV write
    fails. The lease says why (not ``ServiceUnavailableError()``), and so does the storage report."""
    h = small_store
    info = await h.bus.js.stream_info("HEALER_TELEMETRY")
    info.config.max_bytes = -1
    await h.bus.js.update_stream(info.config)
    await flood(h.bus, 64 * MIB)
    report = await h.bus.storage(storage.streams_of(subjects.Subjects()))
    problem = report.problem()
    assert problem is not None
    assert "HEALER_TELEMETRY without a byte limit" in problem
    assert "\n" not in problem

    leases = kv.Store(await h.bus.key_value("healer-leases"))
    standby = lease.Lease(leases, "leader.shard-0", "standby", ttl_s=LEASE_TTL_S)
    with structlog.testing.capture_logs() as logs:
        assert not await standby.try_acquire()
    assert standby.last_error is not None
    assert "store is full" in standby.last_error
    failed = [e for e in logs if e["event"] == "lease.acquire_failed"]
    assert len(failed) == 1
    assert "insufficient resources" in failed[0]["error"]

    watch = storage.StorageWatch(
        h.bus, subjects.Subjects(), metrics.ControllerMetrics(), structlog.get_logger()
    )
    with structlog.testing.capture_logs() as logs:
        assert await watch.check() == problem
        await watch.check()  # the same problem again: not logged again
    assert [e["event"] for e in logs] == ["jetstream.storage_problem"]
    assert sample(watch.metrics.registry, "healer_jetstream_storage_ok") == 0


async def test_nats_status_says_how_full_each_stream_is_and_who_leads(
    small_store: SmallStore, capsys: pytest.CaptureFixture[str]
) -> None:
    h = small_store
    await flood(h.bus, 8 * MIB)
    code = await asyncio.to_thread(cli.main, ["nats", "status", "--nats", h.srv.url])
    out = capsys.readouterr().out
    assert code == 1, "no controller leads shard 0: a standstill is an error"
    assert out.splitlines()[0].startswith("jetstream: ok")
    assert "stream HEALER_TELEMETRY: 8.1 MiB of 24.0 MiB (34%)" in out
    assert "stream HEALER_INCIDENTS: 0.0 MiB of 4.0 MiB (0%)" in out
    assert "lease shard 0: NO HOLDER" in out

    ctl = await h.controller(testing.RecordingActuator())
    await run_until(Fleet(h.bus, ["n1"]), lambda: ctl.leader)
    code = await asyncio.to_thread(cli.main, ["nats", "status", "--nats", h.srv.url])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"lease shard 0: held by {ctl.holder}" in out


def test_the_telemetry_limit_is_sized_from_the_fleet() -> None:
    ns = config.NatsSettings(fleet_nodes=10_000, frame_bytes=7700, frame_interval_s=5.0)
    assert ns.telemetry_bytes() == 10_000 * 7700 * 3600 // 5
    assert config.NatsSettings().telemetry_bytes() == config.DEFAULT_TELEMETRY_BYTES
    assert config.NatsSettings(fleet_nodes=10, telemetry_max_bytes=5 * MIB).telemetry_bytes() == 5 * MIB


async def test_a_store_too_small_for_healers_reservations_is_one_clear_error(tmp_path: pathlib.Path) -> None:
    srv = embedded.EmbeddedServer(tmp_path / "nats", max_file_store="64MB")
    srv.start()
    try:
        bus = await natsbus.NatsBus.connect(srv.url)
        try:
            with pytest.raises(errors.PermanentError, match="max_file_store"):
                await provision.ensure(bus, subjects.Subjects(), config.NatsSettings())
        finally:
            await bus.close()
    finally:
        srv.stop()


async def test_provisioning_gives_an_unlimited_stream_a_byte_limit_and_keeps_a_raised_one(
    small_store: SmallStore,
) -> None:
    h = small_store
    info = await h.bus.js.stream_info("HEALER_TELEMETRY")
    info.config.max_bytes = -1
    await h.bus.js.update_stream(info.config)
    inc = await h.bus.js.stream_info("HEALER_INCIDENTS")
    inc.config.max_bytes = 6 * MIB  # an operator raised it
    await h.bus.js.update_stream(inc.config)
    await provision.ensure(h.bus, subjects.Subjects(), small_settings(h.srv.url))
    assert (await h.bus.js.stream_info("HEALER_TELEMETRY")).config.max_bytes == 24 * MIB
    assert (await h.bus.js.stream_info("HEALER_INCIDENTS")).config.max_bytes == 6 * MIB
    assert (await h.bus.js.stream_info("KV_healer-state")).config.max_bytes == 4 * MIB
