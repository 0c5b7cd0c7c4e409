"""JetStream storage as the controller sees it: the ``healer_jetstream_*`` gauges, and one log line
that says why when JetStream would refuse healer's writes.

Telemetry once filled the store and stopped healing silently: leases, incidents and ``healer breaker
reset`` failed with ``ServiceUnavailableError()``. Provisioning now gives every stream a byte limit that
the server reserves (``bus.provision``); this watch is the second line: it reads the store and healer's
streams every ``CHECK_S`` (any controller, leader or standby), exports what it read, and logs
``jetstream.storage_problem`` once per change of the problem (and again every ``REPEAT_S`` while it
lasts), so a stream without a limit or a full store is named in the log and on /metrics.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import structlog

from healer import errors
from healer.bus import base, subjects
from healer.controller.observability import metrics

CHECK_S = 30.0
"""Seconds between two reads of the store (a few JetStream API requests each)."""
REPEAT_S = 600.0
"""A problem that lasts is logged again this often."""


def streams_of(subjects: subjects.Subjects) -> list[str]:
    """healer's streams, KV buckets included (a bucket is the stream ``KV_<bucket>``)."""
    return [
        subjects.stream_telemetry, subjects.stream_events, subjects.stream_incidents,
        f"KV_{subjects.kv_state}", f"KV_{subjects.kv_leases}",
    ]  # fmt: skip


class StorageWatch:
    def __init__(
        self,
        bus: base.Bus,
        subjects: subjects.Subjects,
        metrics: metrics.ControllerMetrics,
        log: structlog.typing.FilteringBoundLogger,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.bus = bus
        self.streams = streams_of(subjects)
        self.metrics = metrics
        self.log = log
        self.clock = clock
        self._checked_at = -float("inf")
        self._logged: tuple[str | None, float] = (None, -float("inf"))
        self.report: base.StorageReport | None = None

    async def maybe_check(self) -> None:
        if self.clock() - self._checked_at < CHECK_S:
            return
        await self.check()

    async def check(self) -> str | None:
        """Read the store now; returns the problem line (None when storage is fine)."""
        self._checked_at = self.clock()
        try:
            report = await self.bus.storage(self.streams)
        except errors.HealerError as e:
            self._say(f"JetStream storage unreadable: {e}")
            return str(e)
        self.report = report
        m = self.metrics
        m.js_store_used.set(report.used_bytes)
        m.js_store_limit.set(report.limit_bytes if report.limit_bytes is not None else report.reserved_bytes)
        for s in report.streams:
            m.js_stream_bytes.labels(s.name).set(s.bytes)
            m.js_stream_limit.labels(s.name).set(s.max_bytes or 0)
        problem = report.problem()
        m.js_storage_ok.set(0 if problem else 1)
        self._say(problem)
        return problem

    def _say(self, problem: str | None) -> None:
        last, at = self._logged
        now = self.clock()
        if problem == last and (problem is None or now - at < REPEAT_S):
            return
        self._logged = (problem, now)
        if problem is None:
            self.log.info("jetstream.storage_ok")
        else:
            self.log.error("jetstream.storage_problem", problem=problem)
