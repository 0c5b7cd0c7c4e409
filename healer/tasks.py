"""Owned, guarded tasks (kopf's ``create_guarded_task`` and its ``Scheduler``): one helper for every
process, so no task's failure is ever silent.

A ``Scheduler`` owns the tasks of one component (the controller, an agent, the status page, a feed
consumer). ``spawn`` runs a one-shot task; ``supervise`` runs a long-lived one that is restarted after
an exponential back-off (``initial_delay_s`` doubling up to ``max_delay_s``; a run that lasted longer
than the ceiling starts the back-off over) whenever it raises or returns while the scheduler is not
stopping. Either way a failure is logged once (``<scope>.task_failed``, with the task's name and the
error) and counted (``<prefix>_task_failures_total{task}``). A one-shot task keeps its exception, so
whoever awaits it still sees it; nobody has to, and nothing is reported twice (a failure re-raised by an
outer task carries the note ``REPORTED``). ``close`` stops the
scheduler and cancels and awaits every task it owns, so none leaks.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import prometheus_client as prom
import structlog

log = structlog.get_logger(__name__)

CANCEL_ROUNDS = 50
"""How many times ``close`` cancels a task that is still running (``CANCEL_WAIT_S`` apart)."""
CANCEL_WAIT_S = 0.2

REPORTED = "(reported as a task failure)"
"""The note a reported failure carries, so a task that re-raises an inner task's failure (a feed
consumer's run) does not report it again."""


def failures_counter(prefix: str, registry: prom.CollectorRegistry | None) -> prom.Counter:
    """``<prefix>_task_failures_total{task}`` on ``registry`` (a registry of its own when None)."""
    return prom.Counter(
        f"{prefix}_task_failures_total",
        "owned tasks that raised (or returned while they should run), by task",
        ["task"],
        registry=registry if registry is not None else prom.CollectorRegistry(),
    )


class Scheduler:
    def __init__(
        self,
        scope: str,
        failures: prom.Counter,
        *,
        log: Any = log,
        stop: asyncio.Event | None = None,
        initial_delay_s: float = 0.2,
        max_delay_s: float = 5.0,
    ) -> None:
        """``scope`` names the log events and the tasks (``<scope>-<name>``); ``failures`` is labelled
        by task; ``stop`` (one of its own when None) ends the supervised tasks."""
        self.scope = scope
        self.failures = failures
        self.log = log
        self.stop = stop if stop is not None else asyncio.Event()
        self.initial_delay_s = initial_delay_s
        self.max_delay_s = max_delay_s
        self.tasks: list[asyncio.Task[Any]] = []
        """The supervised tasks and the one-shot tasks still running, in the order they started."""

    # -- one-shot ----------------------------------------------------------------------------------
    def spawn(
        self, name: str, work: Coroutine[Any, Any, Any], *, task_name: str | None = None, **context: Any
    ) -> asyncio.Task[Any]:
        """Run ``work`` now in a task of its own (named ``task_name``, else ``<scope>-<name>``). If it
        raises, the failure is logged once with ``context`` and counted under ``name``."""
        self.failures.labels(
            name
        )  # the series exists at 0 from the first start: a panel shows 0, not "no data"
        task = asyncio.get_running_loop().create_task(work, name=task_name or f"{self.scope}-{name}")
        self.tasks.append(task)
        task.add_done_callback(lambda t: self._done(t, name, context))
        return task

    def _done(self, task: asyncio.Task[Any], name: str, context: dict[str, Any]) -> None:
        with contextlib.suppress(ValueError):  # closed already
            self.tasks.remove(task)
        if task.cancelled():
            return
        error = task.exception()  # retrieved here: never "exception was never retrieved" as well
        if error is None or REPORTED in getattr(error, "__notes__", ()):
            return  # a failure handed on from an inner task was reported where it happened
        error.add_note(REPORTED)
        self.failures.labels(name).inc()
        self.log.error(f"{self.scope}.task_failed", task=name, error=repr(error), **context, exc_info=error)

    # -- long-lived --------------------------------------------------------------------------------
    def supervise(self, name: str, run: Callable[[], Awaitable[None]]) -> asyncio.Task[None]:
        """Run ``run()`` until ``stop`` is set, again after a back-off whenever it fails."""
        self.failures.labels(name)
        task = asyncio.get_running_loop().create_task(self._guard(name, run), name=f"{self.scope}-{name}")
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
                error = f"returned while the {self.scope} runs"
            if time.monotonic() - started > self.max_delay_s:
                failures = 0
            failures += 1
            self.failures.labels(name).inc()
            delay = self.delay(failures)
            self.log.error(
                f"{self.scope}.task_failed", task=name, error=error, restart_in_s=delay, failures=failures
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), timeout=delay)

    # -- the end -----------------------------------------------------------------------------------
    async def wait(self, timeout_s: float = 10.0) -> None:
        """After ``stop`` is set: every task ends by itself within ``timeout_s`` or is cancelled; all are
        awaited (their failures were reported already)."""
        tasks = list(self.tasks)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=timeout_s)
            await self._cancel(list(pending))

    async def close(self) -> None:
        """Stop now: set ``stop``, cancel every task and await them all."""
        self.stop.set()
        await self._cancel(list(self.tasks))

    async def _cancel(self, tasks: list[asyncio.Task[Any]]) -> None:
        """Cancel ``tasks`` until every one has ended. One cancellation is not always enough: Python
        3.11's ``asyncio.wait_for`` (nats-py fetches through it) swallows one that races with the end
        of what it waits for, and a loop then goes on as if nothing happened; a single cancel and an
        unbounded wait hung a feed consumer's stop. A task still running after ``CANCEL_ROUNDS`` tries
        is logged by name and left (never a hang). A task spawned here meanwhile (a cancelled task's
        cleanup that started another) is cancelled with them: the scheduler's tasks are taken again
        each round."""
        pending = tasks
        for _ in range(CANCEL_ROUNDS):
            pending = [t for t in dict.fromkeys([*pending, *self.tasks]) if not t.done()]
            if not pending:
                return
            for t in pending:
                t.cancel()
            await asyncio.wait(pending, timeout=CANCEL_WAIT_S)
        pending = [t for t in pending if not t.done()]
        if pending:
            self.log.error(
                f"{self.scope}.tasks_ignore_cancel", tasks=sorted(t.get_name() for t in pending),
                tried=CANCEL_ROUNDS,
            )  # fmt: skip
