"""``Controller.ready()``, which /readyz serves: ready once started with rules loaded and its role
known; not ready once disconnected from NATS or when one of its own tasks has stopped."""

from __future__ import annotations

import asyncio

import pytest

from healer import testing
from healer.controller.core import readiness
from tests import conftest
from tests.controller.conftest import Harness

pytestmark = pytest.mark.nats


async def test_a_started_controller_is_ready_and_says_why(harness: Harness) -> None:
    ctl = await harness.controller(testing.RecordingActuator())
    verdict = ctl.ready()
    assert verdict.ready, verdict.summary()
    assert verdict.checks["rules"].detail == "1 rules"
    assert verdict.checks["model"].detail.startswith("off")
    assert verdict.checks["role"].detail in ("leader", "standby")


async def test_a_disconnected_controller_is_not_ready(harness: Harness) -> None:
    ctl = await harness.controller(testing.RecordingActuator())
    await harness.crash(ctl)  # tasks stopped, connection closed
    verdict = ctl.ready()
    assert not verdict.ready
    assert verdict.checks["nats"].ok is False
    assert verdict.checks["tasks"].ok is False
    assert "controller-ticks" in verdict.checks["tasks"].detail


async def test_a_controller_whose_tick_is_stuck_is_not_ready(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(readiness, "TICK_STALE_MIN_S", 0.5)
    ctl = await harness.controller(testing.RecordingActuator(), tick_s=0.05)
    await conftest.until(lambda: ctl.ready().ready and ctl.ready().checks["ticks"].detail != "0 ticks")
    release = asyncio.Event()

    async def stuck() -> None:
        await release.wait()

    monkeypatch.setattr(ctl.ticker, "tick", stuck)
    try:
        await conftest.until(lambda: not ctl.ready().ready, timeout=10, step=0.1)
        verdict = ctl.ready()
        assert verdict.checks["ticks"].ok is False
        assert verdict.checks["ticks"].detail.startswith("no tick for")
        assert verdict.checks["nats"].ok is True, "connected, and still not ready"
    finally:
        release.set()


async def test_a_standby_is_ready_too(harness: Harness) -> None:
    leader = await harness.controller(testing.RecordingActuator())
    await conftest.until(lambda: leader.leader)
    standby = await harness.controller(testing.RecordingActuator())
    await conftest.until(lambda: standby.ready().ready)
    assert standby.ready().checks["role"].detail == "standby"
    assert leader.ready().checks["role"].detail == "leader"


async def test_the_leader_gauge_never_says_leader_while_readyz_says_not_ready(harness: Harness) -> None:
    """The real controller process (``run_controller``) with its heartbeat: from the start, through the
    takeover, until it leads, the gauge and the verdict /readyz serves are read together every 5 ms;
    the gauge reads 1 only while the served verdict is ready. (It read 1 about 0.8 s before /readyz
    turned ready: the verdict is computed once a second, the lease flips at any instant.)"""
    from healer import config, health
    from healer.cli import controller_cmd
    from healer.controller.observability import metrics

    s = harness.settings(metrics_port=0)
    s = s.model_copy(update={"nats": config.NatsSettings(url=harness.srv.url, lease_ttl_s=2.0)})
    m = metrics.ControllerMetrics()
    beat = health.Health(m.registry)
    stop = asyncio.Event()
    task = asyncio.create_task(controller_cmd.run_controller(s, stop, m, beat))
    samples = []
    try:
        async with asyncio.timeout(20):
            while True:
                _, verdict = beat.snapshot()
                gauge = conftest.sample(m.registry, "healer_controller_leader")
                samples.append((gauge, verdict.ready))
                if gauge == 1 and len(samples) > 200:
                    break
                if task.done():
                    task.result()
                await asyncio.sleep(0.005)
    finally:
        stop.set()
        await asyncio.wait_for(task, 20)
    assert (1.0, True) in samples, "it came to lead, and ready"
    assert [s for s in samples if s == (1.0, False)] == [], "the gauge said leader while /readyz said not"
