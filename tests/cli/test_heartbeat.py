"""The CLI processes' heartbeat is an owned task (#25): a failing one is counted, logged and restarted."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import prometheus_client as prom
from structlog.testing import capture_logs

from healer import health, tasks
from healer.cli import common


class FlakyHealth(health.Health):
    """A real ``Health`` whose first heartbeat loop dies (as a bug in it would); later ones run."""

    def __init__(self, registry: prom.CollectorRegistry) -> None:
        super().__init__(registry)
        self.starts = 0
        self.beating = asyncio.Event()

    async def keep(
        self,
        readiness: Callable[[], health.Verdict],
        interval_s: float = 1.0,
        served: Callable[[health.Verdict], None] | None = None,
    ) -> None:
        self.starts += 1
        if self.starts == 1:
            raise RuntimeError("heartbeat bug")
        self.beating.set()
        await super().keep(readiness, interval_s=0.05, served=served)


async def test_a_heartbeat_that_fails_is_counted_logged_and_restarted() -> None:
    registry = prom.CollectorRegistry()
    failures = tasks.failures_counter("healer_test", registry)
    beat = FlakyHealth(registry)
    with capture_logs() as logs:
        async with common.heartbeat("test", beat, lambda: health.Verdict.of(), failures):
            await asyncio.wait_for(beat.beating.wait(), 10)
            await asyncio.sleep(0.1)  # a beat or two of the restarted loop
            _, verdict = beat.snapshot()
            assert verdict.ready, "it beats again: /readyz answers from the restarted loop"
    assert beat.starts == 2
    assert registry.get_sample_value("healer_test_task_failures_total", {"task": "health"}) == 1
    assert [e["task"] for e in logs if e["event"] == "test.task_failed"] == ["health"]
