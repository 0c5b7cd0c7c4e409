"""Running an incident's actions: every gate between a decision and an actuator, one task per incident.

The gates are pure checks in ``gates.GATES``, in order: the mode (observe acts on nothing; dry-run asks
actuators for a plan), what needs no actuator (notify) or is not automated (GPU reset), maintenance
exclusions, per-action rate limits and cooldowns, ownership (an uncordon only undoes healer's own cordon,
and only when no other open incident still holds the node) and leadership; then the circuit breaker for
anything that takes a node out of service (a separate one for dry-run), decided in a compare-and-set
loop over KV, with the node's failure-domain limits (``blast``): a domain at its limit makes the action
wait and names the domain and the limit in the incident's evidence (``held_by_domain``,
``domain_limit``), and opens nothing. Every request carries the lease's fencing token, and a process
that is no longer the leader stops. This module gathers what the gates look at and carries out their
verdicts. Each step's outcome is recorded on the incident and published before the next one runs; a
failed step stops the chain (no migrate without a cordon) and escalates.

A breaker that trips opens one critical ``circuit-breaker`` incident (node ``fleet``) whose evidence
lists the nodes the breaker counted; it resolves when the breaker is closed again, by ``healer breaker
reset`` or by whatever else closes it (``settle_breaker``, run by the leader's housekeeping, also for
an incident a previous leader opened).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable

import structlog

from healer import actions, config, errors, tasks
from healer.actuators import base as actuators
from healer.controller.incidents import book, gates, shared_cause
from healer.controller.inventory import blast
from healer.controller.observability import metrics
from healer.controller.remediation import policy, shell
from healer.controller.store import lease
from healer.schemas import incidents

BREAKER_RULE = "circuit-breaker"
STEP_CONCURRENCY = 32
"""The most GPUs of one per-GPU power step in flight at once (each waits for its GPU's next frame)."""


class ActionRunner:
    """Owns the per-incident action tasks. ``shell`` saves and publishes each incident change; whether
    this process leads, the fleet size and the reboots elsewhere are asked of it at the moment of acting."""

    breaker_incident: book.Incident | None

    def __init__(
        self,
        cs: config.ControllerSettings,
        *,
        scheduler: actuators.Actuator,
        power: actuators.Actuator | None,
        gpu: actuators.Actuator | None = None,
        lease: lease.Lease,
        breaker: policy.Breaker,
        dry_breaker: policy.Breaker,
        exclusions: policy.Exclusions,
        limits: policy.Limits,
        book: book.Book,
        metrics: metrics.ControllerMetrics,
        shell: shell.Shell,
        clock: Callable[[], float],
        stop: asyncio.Event,
        log: structlog.typing.FilteringBoundLogger,
    ) -> None:
        self.cs = cs
        self.scheduler, self.power, self.gpu = scheduler, power, gpu
        self.lease = lease
        self.breaker, self.dry_breaker = breaker, dry_breaker
        self.exclusions, self.limits = exclusions, limits
        self.book = book
        self.metrics = metrics
        self.shell = shell
        self.clock = clock
        self.stop = stop
        self.log = log
        self.tasks: dict[str, asyncio.Task[None]] = {}
        """The running action task of each incident."""
        self.jobs = tasks.Scheduler("controller", metrics.task_failures, log=log, stop=stop)
        """Owns the action tasks (``tasks.Scheduler``): a bug in one is logged and counted, never silent."""
        self.breaker_incident = None

    def spawn(self, inc: book.Incident) -> None:
        """Run the incident's pending actions in its own task, after any task it already has. A failure
        is logged once and counted (``task_failures_total{task="actions"}``): a temporary or permanent
        one as ``controller.actions_failed``, a bug as ``controller.task_failed`` with its traceback."""
        previous = self.tasks.get(inc.id)

        async def chained() -> None:
            if previous is not None:
                await asyncio.wait([previous])  # its own failure was reported when it ended
            try:
                await self.run(inc)  # made here: a task cancelled before it ran leaves no coroutine behind
            except errors.HealerError as e:
                self.metrics.task_failures.labels("actions").inc()
                self.log.error("controller.actions_failed", incident_id=inc.id, error=str(e))
            finally:
                if self.tasks.get(inc.id) is task:
                    del self.tasks[inc.id]

        task = self.jobs.spawn("actions", chained(), task_name=f"actions:{inc.id}", incident_id=inc.id)
        self.tasks[inc.id] = task

    async def run(self, inc: book.Incident) -> None:
        batch: dict[int, gates.Verdict] = {}
        """The verdicts of the step being settled (``_act_step``), by ``id`` of each of its actions."""
        held = False
        """An action of that step waits."""
        for action in inc.actions:
            if action.status is not None:
                if action.status not in incidents.OK and not action.ladder and action.gpu_index is None:
                    return  # a failed step stops the chain (no migrate without a cordon)
                continue  # (one GPU's failed cap in a node-wide incident does not hold up the others)
            if not self.shell.leader:
                return
            if action.on_resolve and actions.spec(action.kind).undoes_cordon and self.cs.uncordon_hold_s:
                wait = (inc.resolved_at or 0) + self.cs.uncordon_hold_s - self.clock()
                if wait > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.stop.wait(), timeout=wait)
                    if self.stop.is_set():
                        return
            if id(action) not in batch:
                batch = await self._act_step(inc, action)
            verdict = batch.pop(id(action), None) or await self._act(inc, action)
            if verdict.status is None:
                action.detail = verdict.reason
                held = True
                if batch:
                    continue  # the rest of its step ran: their outcomes are recorded first
                return  # waits (rate limit, cooldown, temporary failure): retried next tick
            status = verdict.status
            action.status, action.detail, action.at = status, verdict.reason[:4096], self.clock()
            self.metrics.actions.labels(action.kind, status).inc()
            await self.shell.publish(inc, incidents.Change.ACTION)
            if status == incidents.ActionStatus.SKIPPED:
                await self._hand_over(inc, action)
            if action.ladder:
                continue  # the recovery ladder reads the outcome and takes the next step
            if status in incidents.FAILED and not inc.escalated:
                inc.escalated = True
                await self.shell.publish(inc, incidents.Change.ESCALATED)
            if status not in incidents.OK and action.gpu_index is None:
                return
            if held and not batch:
                return  # a step with a waiting action: what follows it waits too
        if inc.state == incidents.IncidentState.RESOLVED:
            await self.book.save(inc)  # all on_resolve actions done: the incident leaves KV

    def _step(self, inc: book.Incident, first: book.PlannedAction) -> list[book.PlannedAction]:
        """``first`` and the pending actions right after it that are one step of a per-GPU power change
        (a budget's caps across a domain's GPUs, a node-wide incident's caps on each GPU): the same kind,
        each for its own GPU. A step runs at once, not one GPU's confirmation after another's."""
        spec = actions.spec(first.kind)
        if not (spec.per_gpu and spec.actuator is actions.Actuator.POWER) or first.gpu_index is None:
            return [first]
        start = inc.actions.index(first)
        step: list[book.PlannedAction] = []
        for a in inc.actions[start:]:
            same = a.kind == first.kind and a.on_resolve == first.on_resolve and a.gpu_index is not None
            if a.status is not None or not same:
                break
            step.append(a)
        return step

    async def _act_step(self, inc: book.Incident, first: book.PlannedAction) -> dict[int, gates.Verdict]:
        """The verdicts of ``first``'s step (``_step``) by ``id`` of each action, all carried out together
        (at most ``STEP_CONCURRENCY`` at once). The fleet-wide rate window counts the step once per node
        it acts on, reserved in one write before any of it runs (``Limits.reserve``); a window without
        room makes the whole step wait. A step of one is left to ``run``."""
        step = self._step(inc, first)
        if len(step) < 2:
            return {}
        now = self.clock()
        nodes = list(dict.fromkeys(a.node or inc.node for a in step))
        if self.cs.mode.plans:
            reserved = await self.limits.reserve(first.kind, nodes, inc.id, now)
            if not reserved.allowed:
                return {id(a): reserved for a in step}
        gate = asyncio.Semaphore(STEP_CONCURRENCY)

        async def one(action: book.PlannedAction) -> gates.Verdict:
            async with gate:
                return await self._act(inc, action, reserved=True)

        verdicts = await asyncio.gather(*(one(a) for a in step))
        return {id(a): v for a, v in zip(step, verdicts, strict=True)}

    async def _hand_over(self, inc: book.Incident, action: book.PlannedAction) -> None:
        """An uncordon skipped because other open incidents still hold the node: healer's cordon passes
        to them, so the last of them to end lifts it (a node stays out while any incident on it is
        open, and does not stay out after the last)."""
        undo = actions.spec(action.kind)
        if not (undo.undoes_cordon and (action.on_resolve or undo.ladder_only)) or not gates.cordon_ours(inc):
            return
        for other in gates.holding(inc, self.book.open.values()):
            if not other.evidence.get(gates.HANDED_OVER):
                other.evidence[gates.HANDED_OVER] = inc.id
                await self.book.save(other)

    def _attempt(self, inc: book.Incident, action: book.PlannedAction, now: float) -> gates.Attempt:
        """The snapshot the gates decide on, without the cooldown and rate window (read from KV only
        once the local gates allow)."""
        undo = actions.spec(action.kind)
        uncordon = undo.undoes_cordon and (action.on_resolve or undo.ladder_only)
        node = action.node or inc.node
        return gates.Attempt(
            kind=action.kind,
            params=action.params,
            on_resolve=action.on_resolve,
            node=node,
            incident_id=inc.id,
            now=now,
            mode=self.cs.mode,
            settings=self.cs,
            excluded=self.exclusions.nodes.get(node),
            limits=gates.LimitsView(),
            lease_valid=self.lease.token is not None and self.lease.valid(),
            cordon_ours=uncordon and gates.cordon_ours(inc),
            held_elsewhere=uncordon and gates.held_elsewhere(inc, self.book.open.values()),
            ladder_step=action.ladder,
        )

    async def _act(
        self, inc: book.Incident, action: book.PlannedAction, *, reserved: bool = False
    ) -> gates.Verdict:
        """The action's verdict: WAIT (retried next tick) or SETTLE with the status to record (from a gate,
        or from the actuator's outcome). ``reserved``: its step holds its place in the rate window
        already (``_act_step``); the cooldown is still checked."""
        now = self.clock()
        mode = self.cs.mode
        spec = actions.kind(action.kind)
        node = action.node or inc.node  # a domain incident's action acts on one of its members
        if shared_cause.needless(inc, action.kind, action.on_resolve):
            action.facts = {**action.facts, shared_cause.RECOVERED_FACT: "true"}  # the ladder returns it
            return gates.Verdict.settle(incidents.ActionStatus.SKIPPED, shared_cause.RECOVERED_DETAIL)
        if not action.on_resolve:
            domain = shared_cause.holding(node, action.kind, self.book.of_rule(shared_cause.RULE_ID))
            if domain is not None:
                return await self._shared_cause_held(domain, inc, action)
        attempt = self._attempt(inc, action, now)
        verdict = gates.gate(attempt, gates.LOCAL_GATES)
        if verdict.allowed:  # only now read the cooldown and rate window from KV
            limits = await self.limits.view(action.kind, node, now, window=not reserved)
            rebooting = await self.shell.reboots(node) if actions.spec(action.kind).reboots else 0
            attempt = dataclasses.replace(attempt, limits=limits, reboots_elsewhere=rebooting)
            verdict = gates.gate(attempt, gates.STORED_GATES)
        if not verdict.allowed:
            return verdict
        if spec is None:
            return gates.Verdict.settle(
                incidents.ActionStatus.FAILED_PERMANENT, f"no actuator for {action.kind}"
            )
        if spec.takes_out_of_service:
            breaker = self.breaker if mode.acts else self.dry_breaker
            fleet = self.shell.fleet_size()
            admission = await breaker.admit(node, fleet, inc.id, self.shell.domains(node))
            if admission.held is not None:
                return await self._domain_held(admission.held, inc)
            if admission.tripped:
                await self._breaker_tripped(admission, inc, fleet)
            if not admission.allowed:
                return gates.Verdict.settle(incidents.ActionStatus.REFUSED, admission.reason)
        token = self.lease.token
        if token is None or not self.lease.valid():
            return gates.Verdict.wait("not the leader any more")
        request = self._request(inc, action, spec, node, token, now)
        actuator = {actions.Actuator.POWER: self.power, actions.Actuator.GPU: self.gpu}.get(
            spec.actuator, self.scheduler
        )
        if actuator is None:
            return gates.Verdict.settle(
                incidents.ActionStatus.FAILED_PERMANENT, f"no actuator for {action.kind}"
            )
        if not reserved:
            await self.limits.record(action.kind, node, inc.id, now)
            # that write can take up to the KV client's timeout: a lease lost meanwhile (a standby may
            # hold it by now) must not send the request with the old fencing token, which a scheduler
            # does not check
            if self.lease.token != token or not self.lease.valid():
                return gates.Verdict.wait("not the leader any more")
        outcome = await actuator.apply(request)
        if outcome.status == incidents.ActionStatus.FAILED_TEMPORARY:
            action.attempts += 1
            if action.attempts <= self.cs.action_retries:
                return gates.Verdict.wait(f"attempt {action.attempts} failed: {outcome.detail}")
        action.facts = dict(outcome.facts)
        record = outcome.record(action.kind, now)
        detail = record.detail
        if outcome.dry_run and outcome.plan:
            detail = (detail + "; would run: " + " | ".join(outcome.plan)).strip("; ")
        if action.node is not None:  # the feed's record names the member and GPU it acted on
            detail = f"{node} gpu {request.gpu_index}: {detail}"
        return gates.Verdict.settle(outcome.status, detail)

    def _request(
        self,
        inc: book.Incident,
        action: book.PlannedAction,
        spec: actions.ActionKind,
        node: str,
        token: int,
        now: float,
    ) -> actuators.ActionRequest:
        return actuators.ActionRequest(
            incident_id=inc.id,
            kind=spec.scheduler_verb or action.kind,
            node=node,
            gpu_index=action.gpu_index if action.gpu_index is not None else inc.gpu_index,
            params={**action.params, "action_id": f"{inc.id}:{inc.actions.index(action)}"},
            summary=(action.params.get("reason") or inc.summary)[:1024],
            fencing_token=token,
            dry_run=self.cs.mode.dry_run,
            deadline=now + 600.0,
        )

    async def _shared_cause_held(
        self, domain: book.Incident, inc: book.Incident, action: book.PlannedAction
    ) -> gates.Verdict:
        """A repair of a node whose domain is suspected waits while the shared-cause incident is open."""
        reason = (
            f"held by shared-cause incident {domain.id}: {domain.evidence.get('suspected')} suspected; "
            f"{action.kind} waits until the domain recovers"
        )
        if action.detail != reason:  # once per held action, not every tick it waits
            self.log.warning(
                "controller.shared_cause_hold", incident_id=inc.id, node=inc.node, kind=action.kind
            )
        if inc.evidence.get("held_by_incident") != domain.id:  # usually named already when it joined
            inc.evidence.update(
                held_by_incident=domain.id, held_by_shared_cause=str(domain.evidence.get("domain"))
            )
            await self.shell.publish(inc, incidents.Change.UPDATED)
        return gates.Verdict.wait(reason)

    async def _domain_held(self, hold: blast.Hold, inc: book.Incident) -> gates.Verdict:
        """A failure domain at its limit: the action waits (retried next tick), the incident names the
        domain and the limit (published once per change of hold), nothing else stops."""
        if (
            inc.evidence.get("held_by_domain") != hold.domain
            or inc.evidence.get("domain_limit") != hold.limit
        ):
            inc.evidence.update(
                held_by_domain=hold.domain,
                domain_limit=hold.limit,
                domain_limit_setting=f"{hold.key}: {hold.setting}",
                domain_out=", ".join(hold.counted)[:1000],
            )
            self.metrics.domain_holds.inc()
            self.log.warning("controller.domain_hold", incident_id=inc.id, node=inc.node, reason=hold.reason)
            await self.shell.publish(inc, incidents.Change.UPDATED)
        return gates.Verdict.wait(hold.reason)

    async def _breaker_tripped(
        self, admission: gates.BreakerAdmission, refused: book.Incident, fleet_size: int
    ) -> None:
        now = self.clock()
        counted = [gates.BreakerEntry.of(e).node for e in (admission.state or {}).get("entries", [])]
        inc = book.Incident(
            id=book.new_id(),
            rule_id=BREAKER_RULE,
            severity="critical",
            node="fleet",
            state=incidents.IncidentState.ESCALATED,
            summary=f"circuit breaker open: {admission.reason}. healer takes no more nodes out of service "
            "until the breaker is closed (`healer breaker reset`); this incident then resolves.",
            evidence={
                "counted_nodes": ", ".join(counted)[:4000],
                "counted": len(counted),
                "limit": gates.limit_of(fleet_size, self.cs),
                "fleet_size": fleet_size,
                "window_s": self.cs.breaker_window_s,
                "refused_node": refused.node,
                "refused_incident": refused.id,
            },
            mode=self.cs.mode,
            opened_at=now,
            updated_at=now,
            escalated=True,
        )
        self.breaker_incident = inc
        self.metrics.breaker_open.set(1)
        await self.shell.publish(inc, incidents.Change.ESCALATED)

    async def settle_breaker(self) -> None:
        """Resolve the open ``circuit-breaker`` incidents whose breaker is closed now (reset by a person,
        or closed by anything else), with who closed it and when in the evidence."""
        found = [i for i in self.book.open.values() if i.rule_id == BREAKER_RULE]
        if self.breaker_incident is not None and self.breaker_incident not in found:
            found.append(self.breaker_incident)
        for inc in found:
            if inc.state == incidents.IncidentState.RESOLVED:
                continue
            breaker = self.breaker if inc.mode.acts else self.dry_breaker
            status = await breaker.status()
            if status.get("open"):
                continue
            inc.state = incidents.IncidentState.RESOLVED
            inc.resolved_at = self.clock()
            by = str(status.get("reset_by") or "the breaker closed")
            inc.evidence = {**inc.evidence, "closed_by": by, "closed_at": status.get("reset_at")}
            inc.summary = f"circuit breaker closed ({by}); healer takes nodes out of service again."
            if self.breaker_incident is inc:
                self.breaker_incident = None
            self.metrics.breaker_open.set(0)
            await self.shell.publish(inc, incidents.Change.RESOLVED)
