"""The tick: once per ``tick_s``, every rule over the shard's fleet at once, and what follows.

Each tick scores the anomaly model (every ``anomaly_interval_s``) and the fail-slow scorer (at the end
of each of its windows), evaluates the rules, resolves the
firings of nodes silent past ``node_retention_s``, and folds ingest's counters into the metrics. On the
leader it then hands each firing to the incident shell, retries pending actions, escalates, advances the
recovery ladders, and only then acknowledges the events it evaluated (a failed tick keeps them for the
next tick or the next leader). A standby evaluates too (warm state) and acts on nothing.

Between ticks, an event that matched an event rule (``ingest.arrived``) is evaluated at once
(``arrivals``): a fatal XID opens its incident and starts its first action when it arrives, through the
same incident shell as a tick's firings, instead of up to ``tick_s`` later. A tick holds the turn
through its steps (its firings, domains, fail-slow, retries, each ladder), whose awaits on KV take a
good part of a tick under load; events that arrive meanwhile are served between those steps, not after
the whole tick.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import structlog

from healer import config, errors
from healer.controller import book, feed_publisher, incident_shell, ingest, learning, role
from healer.controller import metrics as controller_metrics
from healer.rules import engine


class Ticker:
    def __init__(
        self,
        cs: config.ControllerSettings,
        *,
        engine: engine.Engine,
        ingest: ingest.Ingest,
        learning: learning.Learning,
        shell: incident_shell.IncidentShell,
        book: book.Book,
        feed: feed_publisher.FeedPublisher,
        role: role.Role,
        turn: asyncio.Lock,
        metrics: controller_metrics.ControllerMetrics,
        clock: Callable[[], float],
        stop: asyncio.Event,
        log: structlog.typing.FilteringBoundLogger,
    ) -> None:
        self.cs = cs
        self.engine = engine
        self.ingest = ingest
        self.learning = learning
        self.shell = shell
        self.book = book
        self.feed = feed
        self.role = role
        self.turn = turn
        self.metrics = metrics
        self.clock = clock
        self.stop = stop
        self.log = log

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
                next_t = now
            while not self.stop.is_set() and await self._wait_arrival(next_t - loop.time()):
                async with self.turn:
                    await self._arrivals_guarded()

    async def _arrivals_guarded(self) -> None:
        try:
            await self.arrivals()
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

    async def arrivals(self) -> None:
        """Events as they arrive, between ticks: the event rules' new firings go to the incident shell at
        once (the same ``handle`` a tick calls, so the same gates, fencing and breaker), then the events
        are acknowledged. Condition rules, retries, escalation and ladders wait for the tick."""
        now = self.clock()
        acks = self.ingest.take_acks()
        firings = self.engine.evaluate_arrivals(now)
        if not self.role.leader:
            self.ingest.keep(acks)  # a standby's engine keeps them warm; the leader acts
            return
        try:
            for f in firings:
                await self.shell.handle(f, now)
            await self.shell.correlate_domains(now)  # as in a tick: its holds apply to what follows
            self.feed.kick()
        except BaseException:
            self.ingest.keep(acks)
            raise
        self.metrics.arrivals.inc()
        await self.ingest.ack(acks)

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
        if not self.role.leader:
            self.ingest.keep(acks)  # not ours to acknowledge yet
            return
        try:
            for f in firings:
                await self.shell.handle(f, now)
                await self._between_steps()
            await self.shell.correlate_domains(now)  # before any repair of this tick: its holds apply
            await self._between_steps()
            await self.shell.failslow(now)  # step times into straggler incidents, job-level slowdowns
            await self._between_steps()
            await self.shell.retry_and_escalate(now)
            await self._between_steps()
            await self.shell.recovery.advance(now, between=self._between_steps)
            self.feed.kick()
        except BaseException:
            # Not recorded: these events are acknowledged by a later tick, or handed back (nak) to the
            # next leader at step-down, never left unacknowledged until the ack wait runs out.
            self.ingest.keep(acks)
            raise
        await self.ingest.ack(acks)
        for sev, n in self.book.by_severity().items():
            self.metrics.incidents_open.labels(sev).set(n)
