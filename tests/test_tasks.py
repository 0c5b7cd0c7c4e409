"""The owned, guarded tasks every process uses: a failure is logged once and counted, none leaks."""

from __future__ import annotations

import asyncio
import contextlib

import prometheus_client as prom
import pytest
import structlog

from healer import tasks


def scheduler(
    *, initial_delay_s: float = 0.2, max_delay_s: float = 5.0
) -> tuple[tasks.Scheduler, prom.CollectorRegistry]:
    registry = prom.CollectorRegistry()
    failures = tasks.failures_counter("healer_test", registry)
    jobs = tasks.Scheduler("test", failures, initial_delay_s=initial_delay_s, max_delay_s=max_delay_s)
    return jobs, registry


async def wait_for(event: asyncio.Event) -> None:
    """``event.wait()`` as the ``Callable[[], Awaitable[None]]`` that ``supervise`` runs."""
    await event.wait()


def failures(registry: prom.CollectorRegistry, task: str) -> float:
    return registry.get_sample_value("healer_test_task_failures_total", {"task": task}) or 0.0


async def test_a_one_shot_task_that_raises_is_logged_once_and_counted() -> None:
    jobs, registry = scheduler()

    async def bug() -> None:
        raise ValueError("a bug")

    with structlog.testing.capture_logs() as logs:
        task = jobs.spawn("work", bug(), incident_id="inc-1")
        await asyncio.wait([task])
        await asyncio.sleep(0)  # the done callback runs on the next loop pass
    failed = [e for e in logs if e["event"] == "test.task_failed"]
    assert [(e["task"], e["incident_id"], "a bug" in e["error"]) for e in failed] == [("work", "inc-1", True)]
    assert failures(registry, "work") == 1
    with pytest.raises(ValueError, match="a bug"):
        task.result()  # whoever awaits it still sees the failure
    assert jobs.tasks == [], "a finished one-shot task is not kept"


async def test_a_failure_handed_on_by_an_outer_task_is_reported_once() -> None:
    inner, registry = scheduler()
    outer = tasks.Scheduler("outer", tasks.failures_counter("healer_outer", registry))

    async def bug() -> None:
        raise RuntimeError("gave up")

    async def run() -> None:
        t = inner.spawn("inner", bug())
        await asyncio.wait([t])
        raise t.exception()  # type: ignore[misc]

    with structlog.testing.capture_logs() as logs:
        task = outer.spawn("run", run())
        await asyncio.wait([task])
        await asyncio.sleep(0)
    assert [e["event"] for e in logs if e["event"].endswith("task_failed")] == ["test.task_failed"]
    assert registry.get_sample_value("healer_outer_task_failures_total", {"task": "run"}) == 0.0


async def test_a_supervised_task_is_restarted_after_each_failure_until_stop() -> None:
    jobs, registry = scheduler(initial_delay_s=0.001, max_delay_s=60.0)
    runs = 0
    third = asyncio.Event()

    async def flaky() -> None:
        nonlocal runs
        runs += 1
        if runs < 3:
            raise OSError(f"failure {runs}")
        third.set()
        await jobs.stop.wait()

    with structlog.testing.capture_logs() as logs:
        jobs.supervise("flaky", flaky)
        await asyncio.wait_for(third.wait(), timeout=10)
        jobs.stop.set()
        await jobs.wait()
    assert failures(registry, "flaky") == 2
    assert [e["failures"] for e in logs if e["event"] == "test.task_failed"] == [1, 2]
    assert all(t.done() for t in jobs.tasks)


async def test_a_supervised_task_that_returns_while_running_counts_as_a_failure() -> None:
    jobs, registry = scheduler(initial_delay_s=0.0, max_delay_s=0.0)
    returned = asyncio.Event()

    async def quits() -> None:
        returned.set()

    with structlog.testing.capture_logs() as logs:
        jobs.supervise("quits", quits)
        await asyncio.wait_for(returned.wait(), timeout=10)
        await asyncio.sleep(0.01)
        await jobs.close()
    assert failures(registry, "quits") >= 1
    assert any(e.get("error") == "returned while the test runs" for e in logs)


def test_back_off_doubles_up_to_its_ceiling() -> None:
    jobs, _ = scheduler(initial_delay_s=0.5, max_delay_s=3.0)
    assert [jobs.delay(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]


async def test_close_cancels_and_awaits_every_task() -> None:
    jobs, registry = scheduler()
    forever = jobs.spawn("forever", asyncio.Event().wait())
    never = asyncio.Event()
    jobs.supervise("loop", lambda: wait_for(never))
    await asyncio.sleep(0)
    await jobs.close()
    assert forever.cancelled()
    assert all(t.done() for t in jobs.tasks)
    assert failures(registry, "forever") == 0, "a cancelled task is no failure"


async def test_close_ends_a_task_that_swallowed_the_first_cancellation() -> None:
    """Python 3.11's ``wait_for`` can swallow a cancellation that races with what it waits for; the
    loop around it then goes on. ``close`` cancels again until the task ends instead of hanging."""
    jobs, _ = scheduler()
    swallowed = 0

    async def stubborn() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if swallowed == 2:
                    raise
                swallowed += 1  # as a wait_for that lost the race: the loop goes on

    task = jobs.spawn("stubborn", stubborn())
    await asyncio.sleep(0)
    async with asyncio.timeout(30):
        await jobs.close()
    assert task.cancelled()
    assert swallowed == 2


async def test_close_ends_a_task_spawned_while_it_was_cancelling() -> None:
    """A task whose cleanup starts another (an action chained after a cancelled one): the new task was
    not in the list ``close`` took and kept running after it."""
    jobs, _ = scheduler()
    started: list[asyncio.Task[object]] = []

    async def chains() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            started.append(jobs.spawn("after", asyncio.sleep(3600)))

    jobs.spawn("first", chains())
    await asyncio.sleep(0)
    async with asyncio.timeout(30):
        await jobs.close()
    [after] = started
    assert after.cancelled()
    assert jobs.tasks == []


async def test_close_gives_up_on_a_task_that_never_ends_and_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tasks, "CANCEL_ROUNDS", 3)
    monkeypatch.setattr(tasks, "CANCEL_WAIT_S", 0.01)
    jobs, _ = scheduler()
    release = asyncio.Event()

    async def immortal() -> None:
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(3600)

    task = jobs.spawn("immortal", immortal())
    await asyncio.sleep(0)
    with structlog.testing.capture_logs() as logs:
        async with asyncio.timeout(30):
            await jobs.close()
    assert not task.done(), "left running, not awaited forever"
    [entry] = [e for e in logs if e["event"] == "test.tasks_ignore_cancel"]
    assert entry["tasks"] == ["test-immortal"]
    release.set()
    task.cancel()
    await asyncio.wait([task])


async def test_a_started_task_has_its_failure_series_at_zero_before_any_failure() -> None:
    """A dashboard panel of task failures shows 0, not "no data", on a healthy process."""
    jobs, registry = scheduler()
    assert registry.get_sample_value("healer_test_task_failures_total", {"task": "once"}) is None
    done = jobs.spawn("once", asyncio.sleep(0))
    stop = asyncio.Event()
    jobs.supervise("loop", lambda: wait_for(stop))
    await done
    assert registry.get_sample_value("healer_test_task_failures_total", {"task": "once"}) == 0.0
    assert registry.get_sample_value("healer_test_task_failures_total", {"task": "loop"}) == 0.0
    stop.set()
    await jobs.close()
