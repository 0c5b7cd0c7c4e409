"""Leadership: only the lease holder acts and publishes.

A standby ingests the same telemetry (warm state). When it wins the lease it takes over: it reloads the
incident book and the recovery ladders from KV, puts each incident's last change on the feed again (a
leader that died between saving a change and publishing it loses nothing; the stream drops a duplicate),
hands the rule engine what the stored incidents say was
firing (so each resolves by its rule's own terms), reads the exclusions, and runs what was left pending:
actions recorded as done are never repeated, and every action carries the new lease's fencing token.
When it loses the lease it steps down: the events it pulled and did not acknowledge go back to the
stream at once for the next leader.

``role.Role`` is the state every room reads (``leader``); ``Leadership`` is the supervised task that
follows the lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from healer.controller.core import context, ingest
from healer.controller.failslow import job_slowdowns
from healer.controller.incidents import book, feed_publisher, shared_cause
from healer.controller.power import power_budget
from healer.controller.remediation import healing, policy, shell
from healer.rules import engine

TAKEOVER_ATTEMPTS = 3
"""A takeover that fails this many times in a row releases the lease (for one TTL) to a standby."""
RULE_MISSING = "no loaded rule has this id: the incident stays open until a person resolves it"


class Leadership:
    """Takes over when the lease is won, steps down when it is lost (the supervised ``leadership`` task)."""

    def __init__(
        self,
        ctx: context.Context,
        *,
        book: book.Book,
        recovery: healing.Recovery,
        engine: engine.Engine,
        exclusions: policy.Exclusions,
        ingest: ingest.Ingest,
        shell: shell.Shell,
        feed: feed_publisher.FeedPublisher,
        dedup_window_s: float,
    ) -> None:
        self.role = ctx.role
        self.lease = ctx.role.lease
        self.book = book
        self.recovery = recovery
        self.engine = engine
        self.exclusions = exclusions
        self.ingest = ingest
        self.shell = shell
        self.feed = feed
        self.dedup_window_s = dedup_window_s
        """The incidents stream's duplicate window: what the feed resends on a takeover must fall in it."""
        self.turn = ctx.turn
        """Held by a tick, a takeover and a rules reload: a takeover never reloads the incidents under a
        tick that started before a lost lease was won again (that tick's objects would act twice)."""
        self.metrics = ctx.metrics
        self.stop = ctx.stop
        self.log = ctx.log
        self.failures = 0
        """Takeovers failed in a row."""

    async def run(self) -> None:
        """Take over when the lease is won, step down when it is lost. A takeover that fails raises: the
        supervisor logs it and runs this again after a back-off (a retry); after
        ``TAKEOVER_ATTEMPTS`` failures in a row the lease is released for a TTL so a standby can try."""
        role = self.role
        while not self.stop.is_set():
            role.changed.clear()
            if self.lease.held and not role.took_over:
                async with self.turn:
                    await self._take_over()
            elif not self.lease.held and role.took_over:
                role.took_over = False
            if not self.lease.held:
                await self.ingest.hand_back()
            role.show()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(role.changed.wait(), timeout=0.5)

    async def _take_over(self) -> None:
        token = self.lease.token
        self.engine.events_read = False  # no event rule is quiet until what came while nobody led is read
        try:
            await self.book.load()
            await self.recovery.load()
            self._restore_firings()
            await self.exclusions.refresh()
        except Exception as e:
            self.failures += 1
            self.metrics.takeover_failures.inc()
            if self.failures >= TAKEOVER_ATTEMPTS:
                self.failures = 0
                self.log.error(
                    "controller.takeover_abandoned", token=token, error=repr(e),
                    detail="lease released for one TTL so a standby can take over",
                )  # fmt: skip
                await self.lease.release(hold_off_s=self.lease.ttl_s)
                self.role.changed.set()
            raise
        if self.lease.token != token:  # lost (or lost and won again) meanwhile: start over
            return
        self.failures = 0
        self.role.took_over = True
        self.role.show()
        resent = self.feed.resend(self.book.all(), window_s=self.dedup_window_s, now=time.time())
        self.log.info("controller.took_over", token=token, incidents=len(self.book.open), resent=resent)
        for inc in self.book.all():
            if any(a.status is None for a in inc.actions):
                self.shell.spawn(inc)

    def _restore_firings(self) -> None:
        """Hand the engine what the incidents from KV say was firing, so each resolves by its rule's
        own terms (an event rule after its quiet period, a condition rule when its resolve condition
        holds on fresh data) instead of staying open for ever after a restart or a failover."""
        for inc in self.book.open.values():
            if inc.node == "fleet" or inc.rule_id == healing.REPLACEMENT_RULE:
                continue  # the breaker's incident, a replacement: a person closes them
            if inc.rule_id == shared_cause.RULE_ID:
                continue  # a domain incident resolves with its members (incident_shell.correlate_domains)
            if inc.rule_id == power_budget.RULE_ID:
                continue  # resolves when its domain is restored (power_shell)
            if inc.rule_id == job_slowdowns.RULE_ID:
                continue  # resolves when its job's step times are back (incident_shell.failslow)
            # A signal resolved already (or that never resolves) leaves the engine nothing to follow.
            for signal in (s for s in inc.signals if s.open):
                restored = self.engine.restore(
                    signal.rule_id, inc.node, signal.gpu_index, since=signal.since,
                    last=max(signal.last_seen_firing, inc.updated_at),
                    evidence=signal.evidence, gpu_uuid=signal.gpu_uuid, port=signal.port,
                )  # fmt: skip
                if not restored:
                    self.log.warning(
                        "controller.incident_rule_missing", incident_id=inc.id, rule_id=signal.rule_id,
                        detail=RULE_MISSING,
                    )  # fmt: skip
