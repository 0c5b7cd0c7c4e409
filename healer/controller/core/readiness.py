"""Readiness, served by /readyz (computed on the event loop once a second).

Ready means: connected, JetStream's API answering the lease requests, rules loaded, the anomaly model
loaded or deliberately off, the role known, the controller's own tasks running, and ticks finishing. A
stuck or disconnected controller is not ready.
"""

from __future__ import annotations

import time

from healer import health, tasks
from healer.bus import base as bus_base
from healer.controller.core import context, learning
from healer.rules import engine

STANDING_TASKS = frozenset(
    {"controller-lease", "controller-ticks", "controller-housekeeping", "controller-feed"}
)
"""Background tasks that run for the controller's whole life (readiness checks they still do)."""
TICK_STALE_MIN_S = 10.0
"""/readyz: a controller whose tick has not finished for this long (or 5 ticks, if longer) is stuck."""


class Readiness:
    def __init__(
        self,
        ctx: context.Context,
        *,
        bus: bus_base.Bus,
        engine: engine.Engine,
        learning: learning.Learning,
        supervisor: tasks.Scheduler,
    ) -> None:
        self.cs = ctx.cs
        self.bus = bus
        self.engine = engine
        self.learning = learning
        self.role = ctx.role
        self.supervisor = supervisor
        self.metrics = ctx.metrics
        self._ticks: tuple[float, float] | None = None
        """(tick count, monotonic time it was first seen), to tell a stuck tick."""

    def ready(self) -> health.Verdict:
        """Connected, rules loaded, the model loaded or deliberately off, the role known, the controller's
        own tasks running and ticking. A stuck or disconnected controller is not ready."""
        check = health.Check
        ticks = next(
            (s.value for f in self.metrics.tick.collect() for s in f.samples if s.name.endswith("_count")),
            0.0,
        )
        now = time.monotonic()
        seen, since = self._ticks if self._ticks is not None else (-1.0, now)
        if ticks != seen:
            seen, since = ticks, now
        self._ticks = (seen, since)
        stuck_s = now - since
        fresh = stuck_s <= max(TICK_STALE_MIN_S, 5 * self.cs.tick_s)
        ticking = check(fresh, f"{ticks:.0f} ticks" if fresh else f"no tick for {stuck_s:.1f} s")
        scorer = self.learning.scorer
        if not self.cs.model:
            model = check(True, "off (anomaly_score is 0)")
        elif scorer is None:
            model = check(False, f"not loaded yet: {self.cs.model}")
        else:
            loaded = self.learning.learning_scorer() is not None
            model = check(loaded, "loaded" if loaded else f"failed to load {self.cs.model} (see the log)")
        bg = self.supervisor.tasks
        role = check(True, "leader" if self.role.leader else "standby") if bg else check(False, "starting")
        dead = [  # the events task ends by design when leadership is lost; the others run until stop
            t.get_name()
            for t in bg
            if t.done() and (t.get_name() in STANDING_TASKS or t.cancelled() or t.exception() is not None)
        ]
        lease = self.role.lease
        failing_s = lease.api_failing_s()
        jetstream = check(
            failing_s < lease.ttl_s / 2,
            "reachable"
            if not failing_s
            else f"lease requests failing for {failing_s:.1f} s: {lease.last_error}",
        )
        return health.Verdict.of(
            nats=check(self.bus.connected, "connected" if self.bus.connected else "disconnected"),
            jetstream=jetstream,
            rules=check(True, f"{len(self.engine.rules.rules)} rules"),
            model=model,
            role=role,
            tasks=check(
                not dead and bool(bg),
                f"stopped: {', '.join(dead)}" if dead else "running" if bg else "not started",
            ),
            ticks=ticking,
        )
