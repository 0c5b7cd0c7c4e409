"""The incident shell around ``decide``: what a firing does to the incident book, carried out.

``decide`` says what a firing changes (open, join, refresh, resolve, nothing), whether a repeat
offender is escalated and when the escalation ladder adds a cordon; it changes nothing itself. This room
applies those changes to the incidents, counts fault episodes per GPU in KV (``history.<node>.<gpu>``),
saves every change in the book and puts it on the feed, and hands the incident's actions to the
``ActionRunner``. It is the one implementation of ``shell.Shell``: what the runner and the recovery
ladders ask of the controller around them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from healer import errors
from healer.actuators import base as actuators
from healer.controller.core import context, learning
from healer.controller.failslow import job_slowdowns
from healer.controller.incidents import book, correlation, decide, feed_publisher, shared_cause
from healer.controller.inventory import admission, blast
from healer.controller.observability import repairs
from healer.controller.remediation import action_runner, healing, policy
from healer.controller.store import kv, lease
from healer.rules import engine
from healer.schemas import incidents

HANDLE_AT_ONCE = 64
"""Nodes whose firings are handled together (``handle_all``): each waits on KV for its own incidents, so a
burst's thousand new incidents do not open one after another (#43)."""
REPEAT_COUNT_S = 1.0
"""Longest the repeat-fault count may hold up opening an incident (a KV read and write take ms; during a
stream leader election a read waits out the client's timeout instead)."""


def apply_join(inc: book.Incident, joined: correlation.Join) -> None:
    """Carry out ``correlation.join`` on ``inc``, in place (an action task may hold it)."""
    inc.signals.append(joined.signal)
    inc.severity, inc.summary, inc.labels = joined.severity, joined.summary, joined.labels
    for i, params in joined.actions.params.items():
        inc.actions[i].params = params
    inc.actions.extend(joined.actions.add)
    if joined.gpu is not None:
        inc.gpu_index, inc.gpu_uuid = joined.gpu
    if joined.node_wide is not None:
        inc.node_wide = joined.node_wide
    if joined.node_wide_at is not None:  # node-wide from now on: the node's incident, no GPU's
        inc.node_wide_at, inc.gpu_index, inc.gpu_uuid = joined.node_wide_at, None, None
    if joined.node_gpus:
        inc.node_gpus = joined.node_gpus
    inc.evidence = correlation.evidence_of(inc)


def escalate(inc: book.Incident, up: decide.Escalation) -> None:
    """Carry out a ``decide.Escalation`` on ``inc``, in place."""
    inc.escalated = True
    inc.summary += up.note
    if up.add is not None:
        inc.actions.append(up.add)


class IncidentShell:
    """Opens, joins, refreshes and resolves incidents as ``decide`` says; owns the ``ActionRunner`` and the
    recovery ladders (``healing.Recovery``), and is the ``shell.Shell`` both of them receive."""

    def __init__(
        self,
        ctx: context.Context,
        *,
        state: kv.Store,
        book: book.Book,
        feed: feed_publisher.FeedPublisher,
        engine: engine.Engine,
        admission: admission.Admission,
        learning: learning.Learning,
        scheduler: actuators.Actuator,
        power: actuators.Actuator | None,
        gpu: actuators.Actuator | None,
        lease: lease.Lease,
        breaker: policy.Breaker,
        dry_breaker: policy.Breaker,
        exclusions: policy.Exclusions,
        limits: policy.Limits,
    ) -> None:
        self.cs = ctx.cs
        self.state = state
        self.book = book
        self._failslow_windows = 0
        """The fail-slow windows seen (``failslow`` runs once per window)."""
        self.feed = feed
        self.engine = engine
        self.role = ctx.role
        self.admission = admission
        self.learning = learning
        self.metrics = ctx.metrics
        self.clock = ctx.clock
        self.log = ctx.log
        self.repairs = repairs.RepairMeter(ctx.metrics, ctx.cs.gpus_per_node)
        self.actions = action_runner.ActionRunner(
            ctx.cs, scheduler=scheduler, power=power, gpu=gpu, lease=lease, breaker=breaker,
            dry_breaker=dry_breaker, exclusions=exclusions, limits=limits, book=book, metrics=ctx.metrics,
            shell=self, clock=ctx.clock, stop=ctx.stop, log=ctx.log,
        )  # fmt: skip
        self.recovery = healing.Recovery(
            ctx.cs, state, book, scheduler=scheduler, engine=engine, shell=self, clock=ctx.clock, log=ctx.log
        )

    # -- shell.Shell ----------------------------------------------------------------------------------
    @property
    def leader(self) -> bool:
        return self.role.leader

    def fleet_size(self) -> int:
        """The breaker's denominator: admitted nodes only (an inventory file lists every shard's)."""
        admitted = max(len(self.admission.admitted), 1)
        return admitted if self.cs.admission == "file" else admitted * max(1, self.cs.shards)

    def domains(self, node: str) -> blast.View:
        """The node's limited failure domains, from the admitted fleet's topology (``admission``)."""
        if not self.cs.domain_limits:
            return blast.View()
        return blast.View.of(self.admission.topology(), node, self.cs.domain_limits)

    async def publish(self, inc: book.Incident, change: incidents.Change) -> None:
        inc.seq += 1
        inc.updated_at = self.clock()
        inc.last_change = change
        self.feed.enqueue(self.feed.build(inc, change))  # built before any await: ids never collide
        inc.unpublished = self.feed.unpublished(inc)
        await self.book.save(inc)
        self.feed.kick()  # published by the feed task: a slow incidents stream never delays an action
        self.metrics.incident_changes.labels(change).inc()
        if change == incidents.Change.OPENED:
            self.repairs.opened(inc)
        elif change == incidents.Change.RESOLVED:
            self.repairs.resolved(inc, inc.resolved_at if inc.resolved_at is not None else inc.updated_at)
        self.log.info(
            "incident." + change, incident_id=inc.id, rule_id=inc.rule_id, node=inc.node, gpu=inc.gpu_index,
            port=inc.port, severity=inc.severity,
        )  # fmt: skip

    def spawn(self, inc: book.Incident) -> None:
        self.actions.spawn(inc)

    async def reboots(self, node: str) -> int:
        return await self.recovery.reboots(node)

    # -- what a firing does ---------------------------------------------------------------------------
    async def handle_all(self, firings: list[engine.Firing], now: float) -> None:
        """``handle`` each firing: one node's in order, up to ``HANDLE_AT_ONCE`` nodes at once (what a
        firing does touches its own node's incidents only; the domains are correlated afterwards). Every
        node's firings are handled even when another node's fail; the first failure is raised then."""
        by_node: dict[str, list[engine.Firing]] = {}
        for f in firings:
            by_node.setdefault(f.node, []).append(f)
        if len(by_node) < 2:
            for f in firings:
                await self.handle(f, now)
            return
        gate = asyncio.Semaphore(HANDLE_AT_ONCE)

        async def node(fs: list[engine.Firing]) -> None:
            async with gate:
                for f in fs:
                    await self.handle(f, now)

        results = await asyncio.gather(*(node(fs) for fs in by_node.values()), return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            raise failed[0]

    async def handle(self, f: engine.Firing, now: float) -> None:
        """Carry out what ``decide.on_firing`` says a firing does to its incident."""
        inc = self.book.get(f.key)
        change = decide.on_firing(f, inc, self.engine.rules.by_id)
        if change.change is decide.Change.NONE:
            return
        if change.change is decide.Change.OPEN:
            await self._open(f, now)
            return
        assert inc is not None
        signal = inc.signal(f.key)
        assert signal is not None
        if change.change in (decide.Change.RESOLVE, decide.Change.PART):
            signal.resolved_at = now
        if change.change is decide.Change.PART:
            inc.actions += change.on_resolve  # node-wide: this GPU's restore, at once
            inc.evidence = correlation.evidence_of(inc)
            await self.book.save(inc)  # the join survives a restart; the incident changes in nothing else
            if change.on_resolve:
                self.spawn(inc)
            return
        if change.change is decide.Change.RESOLVE:
            if self.recovery.holds(inc.id):
                await self.recovery.rule_resolved(inc)  # its recovery ladder closes it
                return
            inc.state = incidents.IncidentState.RESOLVED
            inc.resolved_at = self.clock()
            inc.evidence = {**inc.evidence, **change.evidence}
            inc.actions += change.on_resolve
            await self.publish(inc, incidents.Change.RESOLVED)
            if any(a.on_resolve and a.status is None for a in inc.actions):
                self.spawn(inc)
            return
        inc.last_seen_firing = signal.last_seen_firing = now
        if change.change is decide.Change.REFRESH:
            signal.evidence, signal.resolved_at = change.evidence, None
            inc.evidence = correlation.evidence_of(inc)
            inc.actions += change.actions  # node-wide: a GPU capped again after its restore
            await self.publish(inc, incidents.Change.UPDATED)
            if change.actions:
                self.spawn(inc)

    async def _open(self, f: engine.Firing, now: float) -> None:
        into = correlation.correlate(f, self.book.on_node(f.node), now, self.cs.correlate_window_s)
        if into is not None:
            await self._join(into, f, now)
            return
        repeats, remember = await self._episodes(f.node, f.gpu, now)
        inc = decide.new_incident(f, book.new_id(), now, self.cs.mode, repeats, self.cs)
        if (
            f.gpu is not None
            and self.learning.scorer is not None
            and "anomaly_score" in (f.rule.when_text or "")
        ):
            why = self.learning.explain(f.node, f.gpu)
            inc.evidence.update({f"anomaly.{k}": v for k, v in why.items()})  # which component, against what
        if self.learning.failslow is not None and "straggler_score" in (f.rule.when_text or ""):
            inc.evidence.update(self.learning.failslow.explain(f.node, f.gpu))  # job, peers, cause
        await asyncio.gather(remember(), self.recovery.opened(inc, now))  # both before it is published
        await self.publish(inc, incidents.Change.OPENED)
        if inc.escalated:
            await self.publish(inc, incidents.Change.ESCALATED)
        self.spawn(inc)

    async def _join(self, inc: book.Incident, f: engine.Firing, now: float) -> None:
        """Another signal of the fault ``inc`` is about: one ``updated`` change, and the actions the
        joining rule adds run after the incident's own."""
        joined = correlation.join(inc, f, now, self.engine.gpu_count(inc.node), self.engine.rules.by_id)
        apply_join(inc, joined)
        up = None
        if joined.gpu is not None:  # a node-scope incident became this GPU's fault: its episode counts
            repeats = await self.count_repeat(inc.node, inc.gpu_index, now)
            up = decide.repeat_escalation(inc.actions, repeats, self.cs)
            if up is not None:
                escalate(inc, up)
        await self.publish(inc, incidents.Change.UPDATED)
        if up is not None:
            await self.publish(inc, incidents.Change.ESCALATED)
        if any(a.status is None for a in inc.actions):
            self.spawn(inc)

    async def correlate_domains(self, now: float) -> None:
        """Each tick, after the firings: open, grow and resolve shared-cause domain incidents
        (``shared_cause``) over the node incidents now open."""
        if not self.cs.shared_cause_window_s:
            return
        current = list(self.book.open.values())
        window = shared_cause.longest_window_s(self.cs)
        recent = any(
            now - i.opened_at <= window and i.rule_id not in shared_cause.IGNORED_RULES for i in current
        )
        if not recent and not shared_cause.open_domain_incidents(current):
            return  # the common tick: nothing new, nothing to resolve (the topology is not even built)
        found = shared_cause.findings(current, self.admission.topology(), now, self.cs) if recent else []
        firing = {
            i.id
            for i in current
            if i.rule_id not in shared_cause.IGNORED_RULES and any(s.open for s in i.signals)
        }
        todo = shared_cause.plan(found, current, firing)
        for f in todo.open:
            inc = shared_cause.new_incident(f, book.new_id(), now, self.cs)
            self.metrics.shared_cause_incidents.inc()
            self.log.warning(
                "controller.shared_cause", incident_id=inc.id, domain=f.domain, rule_id=f.rule_id,
                members=len(f.members),
            )  # fmt: skip
            await self.publish(inc, incidents.Change.OPENED)
            await self._mark_members(inc, f)
        for inc, f in todo.grow:
            before, before_ids = shared_cause.members_of(inc), shared_cause.member_incidents(inc)
            if inc.domain is not None:  # the full lists (the evidence's strings are capped)
                before, before_ids = inc.domain.members, inc.domain.member_incidents
            inc.evidence = {**inc.evidence, **shared_cause.evidence(f, before, before_ids)}
            inc.domain = shared_cause.domain(f, before, before_ids)
            await self.publish(inc, incidents.Change.UPDATED)
            await self._mark_members(inc, f)
        for inc in todo.resolve:
            inc.state = incidents.IncidentState.RESOLVED
            inc.resolved_at = now
            inc.evidence = {**inc.evidence, "outcome": "domain recovered"}
            await self.publish(inc, incidents.Change.RESOLVED)

    async def failslow(self, now: float) -> None:
        """After each fail-slow window: a straggler incident opened before its job's step times said how
        much slower the job runs gets them (an update), and job-level slowdowns are opened, updated and
        resolved as ``job_slowdowns.plan`` says."""
        fs = self.learning.failslow
        if fs is None or fs.windows == self._failslow_windows:
            return
        self._failslow_windows = fs.windows
        for inc in list(self.book.open.values()):
            if "straggler.job" not in inc.evidence or "straggler.steps" in inc.evidence:
                continue
            found = fs.scorer.stragglers.get((inc.node, inc.gpu_index)) or fs.scorer.stragglers.get(
                (inc.node, None)
            )
            said = fs.step_evidence(found) if found is not None else {}
            if said:
                inc.evidence = {**inc.evidence, **said}
                await self.publish(inc, incidents.Change.UPDATED)
        named = {found.job for found in fs.scorer.stragglers.values() if found.job is not None}
        slower = fs.steps.slower_jobs(now)
        todo = job_slowdowns.plan(self.book.open.values(), fs.job_level(now), slower, named)
        for slow in todo.open:
            inc = job_slowdowns.new_incident(slow, book.new_id(), now, self.cs.mode)
            self.log.warning("controller.job_slowdown", incident_id=inc.id, job=slow.job, pct=slow.slower_pct)
            await self.publish(inc, incidents.Change.OPENED)
        for inc, slow in todo.update:
            inc.summary = job_slowdowns.summary(slow)
            inc.evidence = {**inc.evidence, **job_slowdowns.evidence(slow)}
            await self.publish(inc, incidents.Change.UPDATED)
        for inc, outcome in todo.resolve:
            inc.state, inc.resolved_at = incidents.IncidentState.RESOLVED, now
            inc.evidence = {**inc.evidence, "outcome": outcome}
            await self.publish(inc, incidents.Change.RESOLVED)

    async def _mark_members(self, domain: book.Incident, f: shared_cause.Finding) -> None:
        """Each member incident names the domain incident that holds its repairs (``held_by_incident``),
        from the moment it is a member: a repair planned later (a ladder's reboot after a long drain),
        even after the domain recovered, is then known as needless once the member has recovered."""
        ids = set(f.incidents)
        for inc in self.book.all():
            if inc.id in ids and inc.evidence.get("held_by_incident") != domain.id:
                inc.evidence = {
                    **inc.evidence,
                    "held_by_incident": domain.id,
                    "held_by_shared_cause": str(domain.evidence.get("domain")),
                }
                await self.publish(inc, incidents.Change.UPDATED)

    async def count_repeat(self, node: str, gpu: int | None, now: float) -> int:
        """Fault episodes on this GPU within ``repeat_window_s`` (``decide.episodes``), kept in KV."""
        count, remember = await self._episodes(node, gpu, now)
        await remember()
        return count

    async def _episodes(
        self, node: str, gpu: int | None, now: float
    ) -> tuple[int, Callable[[], Awaitable[None]]]:
        """``count_repeat``'s count, and the write that records this episode (the caller runs it beside
        its other writes, #43). Either failing costs at most ``REPEAT_COUNT_S`` and is counted: the count
        only escalates a repeat offender, it never holds up the quarantine of a fault."""

        async def nothing() -> None:
            return None

        if gpu is None:
            return 0, nothing
        key = f"history.{node}.{gpu}"

        def failed(e: Exception) -> None:
            self.metrics.task_failures.labels("repeat-count").inc()
            self.log.warning("controller.repeat_count_failed", node=node, gpu=gpu, error=str(e) or repr(e))

        try:
            async with asyncio.timeout(REPEAT_COUNT_S):  # not the KV client's own, longer, timeout
                doc = await self.state.get(key)
        except (errors.TemporaryError, TimeoutError) as e:
            failed(e)
            return 1, nothing
        seen = decide.episodes(doc.value.get("opened", []) if doc else [], now, self.cs.repeat_window_s)

        async def remember() -> None:
            try:
                async with asyncio.timeout(REPEAT_COUNT_S):
                    await self.state.put(key, {"opened": list(seen.times)})
            except (errors.TemporaryError, TimeoutError) as e:
                failed(e)

        return seen.count, remember

    async def retry_and_escalate(self, now: float) -> None:
        """Each tick: pending actions of incidents without a task run again, and the escalation ladder
        adds a cordon where a power cap did not help."""
        for inc in self.book.all():
            if inc.id in self.actions.tasks:
                continue
            if any(a.status is None for a in inc.actions):
                self.spawn(inc)
            up = decide.ladder_step(inc, now, self.cs)
            if up is not None:
                escalate(inc, up)
                await self.publish(inc, incidents.Change.ESCALATED)
                self.spawn(inc)
