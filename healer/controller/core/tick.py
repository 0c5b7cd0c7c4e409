"""The tick: once per ``tick_s``, every rule over the shard's fleet at once, and what follows.

Each tick scores the anomaly model (every ``anomaly_interval_s``) and the fail-slow scorer (at the end
of each of its windows), evaluates the rules, resolves the
firings of nodes silent past ``node_retention_s``, and folds ingest's counters into the metrics. On the
leader it then hands each firing to the incident shell, retries pending actions, escalates, advances the
recovery ladders, and only then acknowledges the events it evaluated (a failed tick keeps them for the
next tick or the next leader). A standby evaluates too (warm state) and acts on nothing.

Between ticks, an event that matched an event rule (``ingest.arrived``) is evaluated at once
(``arrivals``): a fatal XID opens its incident and starts its first action when it arrives, through the
same incident shell as a tick's firings, instead of up to ``tick_s`` later. Frames are read the same way
every ``frame_arrivals_s`` (0.1 s): the rules without ``for`` on the nodes whose frames arrived since
(``Engine.evaluate_frames``), so a new ECC error in a frame is acted on within about that long, not up
to a tick later; the rest of the rules, and every resolution, wait for the tick. A tick holds the turn
through its steps (its firings, domains, fail-slow, retries, each ladder), whose awaits on KV take a
good part of a tick under load; events that arrive meanwhile are served between those steps, not after
the whole tick.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

from healer import errors
from healer.controller.core import context, incident_shell, ingest, learning
from healer.controller.incidents import book, feed_publisher
from healer.rules import engine

FRAME_ARRIVALS_SHARE = 0.1
"""Most of the time between two arrival evaluations of frames that one may take: past it they are
spaced further apart than ``controller.frame_arrivals_s`` (``Ticker._evaluate_frames``)."""


class Ticker:
    def __init__(
        self,
        ctx: context.Context,
        *,
        engine: engine.Engine,
        ingest: ingest.Ingest,
        learning: learning.Learning,
        shell: incident_shell.IncidentShell,
        book: book.Book,
        feed: feed_publisher.FeedPublisher,
    ) -> None:
        self.cs = ctx.cs
        self.engine = engine
        self.ingest = ingest
        self.learning = learning
        self.shell = shell
        self.book = book
        self.feed = feed
        self.role = ctx.role
        self.turn = ctx.turn
        self.metrics = ctx.metrics
        self.clock = ctx.clock
        self.stop = ctx.stop
        self.log = ctx.log
        self._frames_at = -math.inf
        """When the next arrival evaluation of frames is due, on the event loop's ctx.clock."""

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        next_t = loop.time()
        while not self.stop.is_set():
            started = time.perf_counter()
            try:
                async with self.turn:
                    await self.tick()
            except errors.HealerError as e:
                self.log.error("controller.tick_failed", error=str(e))
            except Exception:  # a bug in one incident's handling must not stop the controller
                self.log.exception("controller.tick_crashed")
            self.metrics.tick.observe(time.perf_counter() - started)
            self.role.show()
            next_t += self.cs.tick_s
            now = loop.time()
            if next_t < now:
                next_t = now  # a tick that overran: no arrival evaluation of frames before the next
            self._frames_at = max(self._frames_at, now + self.cs.frame_arrivals_s)
            while not self.stop.is_set():
                frames_due = self._frames_at if self.cs.frame_arrivals_s > 0 else math.inf
                woke = await self._wait_arrival(min(next_t, frames_due) - loop.time())
                now = loop.time()
                if self.stop.is_set() or (not woke and now >= next_t):
                    break
                if woke or now >= frames_due:
                    async with self.turn:
                        await self._arrivals_guarded(frames=not woke)

    async def _arrivals_guarded(self, frames: bool = False) -> None:
        try:
            await self.arrivals(frames)
        except errors.HealerError as e:
            self.log.error("controller.arrivals_failed", error=str(e))
        except Exception:  # as for a tick: one bad incident must not stop the controller
            self.log.exception("controller.arrivals_crashed")

    async def _between_steps(self) -> None:
        """Inside a tick (which holds the turn): the events that arrived since are acted on now, not
        after the tick's remaining steps."""
        if self.ingest.arrived.is_set() and not self.stop.is_set():
            self.ingest.arrived.clear()
            self.metrics.arrivals_in_tick.inc()
            await self._arrivals_guarded()

    async def _wait_arrival(self, timeout: float) -> bool:
        """Until the next tick is due (False), an event arrives (True) or the controller stops (False)."""
        arrived = self.ingest.arrived
        if not arrived.is_set() and timeout > 0:
            waits = [asyncio.ensure_future(self.stop.wait()), asyncio.ensure_future(arrived.wait())]
            try:
                await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
                await asyncio.gather(*waits, return_exceptions=True)
        if arrived.is_set() and not self.stop.is_set():
            arrived.clear()
            return True
        return False

    async def arrivals(self, frames: bool = False) -> None:
        """Events as they arrive, between ticks, or with ``frames`` the rules without ``for`` on the
        nodes whose frames arrived since (``Engine.evaluate_frames``): the new firings go to the incident
        shell at once (the same ``handle`` a tick calls, so the same gates, fencing and breaker), then
        the events are acknowledged. Other rules, resolutions, retries, escalation and ladders wait for
        the tick."""
        now = self.clock()
        if frames:
            acks: list[Any] = []
            firings = self._evaluate_frames(now)
            if not firings:
                return  # the common case: frames came in, nothing fired
        else:
            acks = self.ingest.take_acks()
            firings = self.engine.evaluate_arrivals(now)
        if not self.role.leader:
            self.ingest.keep(acks)  # a standby's engine keeps them warm; the leader acts
            return
        try:
            await self.shell.handle_all(firings, now)
            await self.shell.correlate_domains(now)  # as in a tick: its holds apply to what follows
            self.feed.kick()
        except BaseException as e:
            await self._not_recorded(acks, e)
            raise
        if not frames:
            self.metrics.arrivals.inc()
        await self.ingest.ack(acks)

    async def _not_recorded(self, acks: list[Any], e: BaseException) -> None:
        """A step that evaluated these events failed before it recorded their decisions: they go back to
        the stream to be evaluated afresh (``Ingest.retry``); a one-shot XID rule fires only once per
        delivery, so a later step acknowledging them would lose the XID. A step cancelled (the
        controller stopping) keeps them for the step-down's hand-back."""
        if isinstance(e, asyncio.CancelledError):
            self.ingest.keep(acks)
        else:
            await self.ingest.retry(acks)

    def _evaluate_frames(self, now: float) -> list[engine.Firing]:
        """One arrival evaluation of frames; the next is due ``frame_arrivals_s`` later, or later still
        while reading them took more than ``FRAME_ARRIVALS_SHARE`` of the time between them. What is
        counted is what reading them at arrival adds: their flush into the fleet state is work the tick
        would do anyway, and is left out. The spacing goes by the wall time it held the loop; the counter
        by this thread's CPU time, so its rate is a share of a core also while other processes load the
        machine."""
        self.engine.flush()
        started, cpu = time.perf_counter(), time.thread_time()
        firings = self.engine.evaluate_frames(now)
        cost = time.perf_counter() - started
        cpu = time.thread_time() - cpu
        gap = max(self.cs.frame_arrivals_s, cost / FRAME_ARRIVALS_SHARE - cost)
        self._frames_at = asyncio.get_running_loop().time() + gap
        self.metrics.frame_arrivals.inc()
        self.metrics.frame_arrival_seconds.inc(cpu)
        self.metrics.frame_arrival_firings.inc(len(firings))
        return firings

    async def tick(self) -> None:
        now = self.clock()
        acks = self.ingest.take_acks()
        scores = self.learning.score(now)
        if scores is not None:
            for node, per_gpu in scores.items():
                self.engine.set_anomaly_scores(node, per_gpu)
        verdicts = self.learning.failslow.tick(now) if self.learning.failslow is not None else None
        if verdicts is not None:
            for node, per_gpu in verdicts.items():
                self.engine.set_straggler_scores(node, per_gpu)
        firings = self.engine.evaluate(now) + self.ingest.forget_silent(now)
        self.metrics.lag.fold()
        self.ingest.account()
        self.metrics.evaluations.inc(len(self.engine.rules.rules))
        self.metrics.fleet_nodes.set(len(self.ingest.nodes))
        shadow = self.learning.shadow_events(
            self.feed.cluster
        )  # taken on every controller, sent by the leader
        if not self.role.leader:
            self.ingest.keep(acks)  # not ours to acknowledge yet
            return
        for ev in shadow:
            self.feed.enqueue_shadow(ev)
        try:
            for start in range(0, len(firings), incident_shell.HANDLE_AT_ONCE):
                await self.shell.handle_all(firings[start : start + incident_shell.HANDLE_AT_ONCE], now)
                await self._between_steps()
            await self.shell.correlate_domains(now)  # before any repair of this tick: its holds apply
            await self._between_steps()
            await self.shell.failslow(now)  # step times into straggler incidents, job-level slowdowns
            await self._between_steps()
            await self.shell.retry_and_escalate(now)
            await self._between_steps()
            await self.shell.recovery.advance(now, between=self._between_steps)
            self.feed.kick()
        except BaseException as e:
            # Not recorded: these events are evaluated again (or handed back to the next leader at
            # step-down), never acknowledged unseen nor left unacknowledged until the ack wait runs out.
            await self._not_recorded(acks, e)
            raise
        await self.ingest.ack(acks)
        for sev, n in self.book.by_severity().items():
            self.metrics.incidents_open.labels(sev).set(n)
        self.shell.repairs.health(
            self.book.open.values(), len(self.shell.admission.admitted) * self.cs.gpus_per_node
        )
