"""NATS outages: a controller that held the lease takes it again as soon as the server is back when
nobody else took it (before: it waited out its own stale key, 12 s after a restart in the chaos run);
while no holder is seen the shard says it is leaderless, /readyz says JetStream is unreachable, and the
standby's failing attempts are logged at a bounded rate with why."""

from __future__ import annotations

import asyncio
import pathlib

import pytest
import structlog.testing

from healer import config, testing
from healer.bus import embedded, memory, provision, subjects
from healer.bus import nats as natsbus
from healer.controller.store import kv, lease
from tests.conftest import until
from tests.controller.conftest import LEASE_TTL_S, Fleet, Harness, metric, run_until

KEY = lease.key_of(0)


async def test_a_holder_cut_off_past_its_ttl_takes_its_own_key_again_with_a_higher_token() -> None:
    bus = memory.MemoryBus()
    store = kv.Store(bus.add_bucket("leases"))
    now = [0.0]
    held = lease.Lease(store, KEY, "me", ttl_s=10.0, clock=lambda: now[0])
    assert await held.try_acquire()
    first = held.token
    assert first is not None
    bus.set_connected(False)
    now[0] = 11.0  # renewals failed for a whole TTL: dropped here, while the key still names "me"
    assert not await held.renew()
    assert held.token is None
    assert held.unheld_s() == pytest.approx(11.0)
    bus.set_connected(True)
    with structlog.testing.capture_logs() as logs:
        assert await held.try_acquire()
    assert held.token is not None
    assert held.token > first, "a new fencing token: whatever the old one did is fenced off"
    assert [e["event"] for e in logs] == ["lease.retaken"]
    assert held.unheld_s() == 0.0


async def test_a_key_another_controller_took_is_never_taken_again() -> None:
    bus = memory.MemoryBus()
    store = kv.Store(bus.add_bucket("leases"))
    now = [0.0]
    mine = lease.Lease(store, KEY, "me", ttl_s=10.0, clock=lambda: now[0])
    other = lease.Lease(store, KEY, "other", ttl_s=10.0, clock=lambda: now[0])
    assert await mine.try_acquire()
    await store.delete(KEY)  # lapsed while "me" was away ...
    assert await other.try_acquire()  # ... and the standby won it
    now[0] = 11.0
    assert not await mine.renew()
    assert not await mine.try_acquire()
    doc = await store.get(KEY)
    assert doc is not None
    assert doc.value["holder"] == "other"
    assert mine.unheld_s() == 0.0, "a holder is seen: the shard is not leaderless"


@pytest.mark.nats
async def test_after_a_server_restart_the_old_holder_leads_again_at_once(tmp_path: pathlib.Path) -> None:
    """A real nats-server stopped for longer than the lease and started again. The bucket's TTL (30 s)
    outlives the controller's (2 s) here, so the old key is certainly still there when the server is
    back, as it was after the chaos run's restart: the holder must take it again, not wait it out."""
    srv = embedded.EmbeddedServer(tmp_path / "nats")
    srv.start()
    stop = asyncio.Event()
    try:
        bus = await natsbus.NatsBus.connect(srv.url, name="lease")
        await provision.ensure(bus, subjects.Subjects(), config.NatsSettings(lease_ttl_s=30.0))
        store = kv.Store(await bus.key_value("healer-leases"))
        held = lease.Lease(store, KEY, "me", ttl_s=LEASE_TTL_S)
        keeper = asyncio.create_task(held.keep(stop))
        await until(lambda: held.held)
        first = held.token
        assert first is not None
        with structlog.testing.capture_logs() as logs:
            await asyncio.to_thread(srv.stop)
            await until(lambda: not held.held, timeout=5 * LEASE_TTL_S)
            await asyncio.to_thread(srv.start)
            loop = asyncio.get_running_loop()
            back = loop.time()
            await until(lambda: held.held, timeout=15.0)  # well under the key's 30 s
            took_s = loop.time() - back
        assert held.token is not None
        assert held.token > first
        assert "lease.retaken" in [e["event"] for e in logs]
        assert "lease.acquired" not in [e["event"] for e in logs]
        print(f"lease taken again {took_s:.1f} s after the server was back (lease TTL {LEASE_TTL_S:g} s)")
        stop.set()
        await keeper
        await bus.close()
    finally:
        stop.set()
        srv.stop()


@pytest.mark.nats
async def test_a_controller_cut_off_from_jetstream_says_so_and_leads_again(harness: Harness) -> None:
    ctl = await harness.controller(testing.RecordingActuator(), leaderless_margin_s=0.0)
    fleet = Fleet(harness.bus, ["n1"])
    await run_until(fleet, lambda: ctl.leader)
    assert ctl.ready().checks["jetstream"].ok
    with structlog.testing.capture_logs() as logs:
        await asyncio.to_thread(harness.srv.stop)
        await until(lambda: metric(ctl.metrics, "leaderless", shard="0") == 1, timeout=10 * LEASE_TTL_S)
        await until(lambda: not ctl.ready().checks["jetstream"].ok, timeout=5 * LEASE_TTL_S)
        verdict = ctl.ready()
        assert not verdict.ready
        assert "lease requests failing" in verdict.checks["jetstream"].detail
        assert metric(ctl.metrics, "leader") == 0
        await asyncio.sleep(3 * LEASE_TTL_S)  # a standby trying, and failing, to take the free lease
        await asyncio.to_thread(harness.srv.start)
        await run_until(fleet, lambda: ctl.leader, timeout=30)
        await until(lambda: ctl.ready().checks["jetstream"].ok)
    assert metric(ctl.metrics, "leaderless", shard="0") == 0
    failed = [e for e in logs if e["event"] == "lease.acquire_failed"]
    assert len(failed) == 1, "one line per ACQUIRE_LOG_S however many attempts failed"
    assert failed[0]["error"]
