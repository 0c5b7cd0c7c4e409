"""Owned, guarded long-lived tasks (kopf's guarded tasks): the controller's lease keeper, leadership,
event puller, tick and housekeeping each run under one ``Supervisor``.

A task that raises is logged (``controller.task_failed``, with its name and the error), counted
(``healer_controller_task_failures_total{task}``) and restarted after an exponential back-off
(``retry.initial_delay_s`` doubling up to ``retry.max_delay_s``; a run that lasted longer than the
ceiling starts the back-off over). A task that returns while the controller is not stopping is a bug of
the same kind and is restarted the same way. Nothing a task raises can end it silently, and ``stop()``
cancels and awaits every one, so none leaks.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import prometheus_client as prom


class Supervisor:
    def __init__(
        self,
        stop: asyncio.Event,
        failures: prom.Counter,
        log: Any,
        *,
        initial_delay_s: float = 0.2,
        max_delay_s: float = 5.0,
    ) -> None:
        self.stop = stop
        self.failures = failures
        self.log = log
        self.initial_delay_s = initial_delay_s
        self.max_delay_s = max_delay_s
        self.tasks: list[asyncio.Task[None]] = []

    def start(self, name: str, run: Callable[[], Awaitable[None]]) -> asyncio.Task[None]:
        task = asyncio.create_task(self._guard(name, run), name=f"controller-{name}")
        self.tasks.append(task)
        return task

    def delay(self, failures: int) -> float:
        """Back-off before restart number ``failures`` (1, 2, ...)."""
        return float(min(self.max_delay_s, self.initial_delay_s * 2 ** (failures - 1)))

    async def _guard(self, name: str, run: Callable[[], Awaitable[None]]) -> None:
        failures = 0
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                await run()
            except Exception as e:  # the guard: whatever a task raises, it is logged, counted, restarted
                error = repr(e)
            else:
                if self.stop.is_set():
                    return
                error = "returned while the controller runs"
            if time.monotonic() - started > self.max_delay_s:
                failures = 0
            failures += 1
            self.failures.labels(name).inc()
            delay = self.delay(failures)
            self.log.error(
                "controller.task_failed", task=name, error=error, restart_in_s=delay, failures=failures
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), timeout=delay)

    async def wait(self) -> None:
        """After ``stop`` is set: every task ends by itself or is cancelled; all are awaited."""
        if self.tasks:
            _, pending = await asyncio.wait(self.tasks, timeout=10.0)
            for t in pending:
                t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
