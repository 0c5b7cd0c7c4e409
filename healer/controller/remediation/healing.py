"""Walking the recovery ladders: the shell around the pure state machine in ``ladder``.

When an incident opens whose rule has a ladder (``ladders:`` in the rule pack), ``opened`` starts one:
its state goes to KV (``ladder.<incident id>``) before anything is done. Every tick ``advance`` reads
what came of the current step from the incident itself (containment: the rule's own actions; a rung,
a validation, the return to service: the ladder action it added, run by the ``ActionRunner`` through
every gate, so modes, exclusions, rate limits, the breaker and ``max_concurrent_reboots`` apply to each
rung), asks ``ladder.next_step`` what follows, stores the new state, then adds the next step as an
action of the incident (visible on the feed). A reboot is done once the scheduler says so
(``reboot_status``: complete, or timed out). Past a step's deadline the step has failed. The end is one
of: the incident resolves with ``evidence.outcome = recovered``; a ``hardware-replacement`` incident
opens with the evidence bundle and the node stays out (``outcome = hardware_replacement``); an operator
stopped it (``healer ladder stop``, KV ``ladder-stop.<incident id>``: the incident goes back to the
rule's own handling).

A new leader loads the ladders with the incident book and carries on from the stored step: the step's
action index is stored before the action is added, and a re-run action carries the same id, so no
step is ever done twice. In dry-run the whole planned ladder is published with the incident and nothing
runs; in observe mode nothing happens at all.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from healer import actions, config, errors
from healer.actuators import base as actuators
from healer.controller.incidents import book, decide, gates, shared_cause
from healer.controller.remediation import ladder, shell
from healer.controller.remediation.ladder_record import Pending, Record, history_key
from healer.controller.store import kv
from healer.rules import engine
from healer.schemas import incidents

PREFIX = "ladder."
"""KV ``healer-state``: one ladder in flight per key (``ladder.<incident id>``)."""
STOP_PREFIX = "ladder-stop."
"""KV ``healer-state``: an operator's request to stop a ladder (``healer ladder stop``)."""
ADVANCE_AT_ONCE = 16
"""Ladders walked together in one ``advance`` (each waits on KV for its own incident)."""
REPLACEMENT_RULE = "hardware-replacement"
"""The rule id of the incidents the ladders open when a GPU needs replacing."""


class Recovery:
    """The ladders in flight of one controller (shard); only the leader calls ``advance``."""

    def __init__(
        self,
        cs: config.ControllerSettings,
        store: kv.Store,
        book: book.Book,
        *,
        scheduler: actuators.Actuator,
        engine: engine.Engine,
        shell: shell.Shell,
        clock: Callable[[], float],
        log: structlog.typing.FilteringBoundLogger,
    ) -> None:
        self.cs = cs
        self.store = store
        self.book = book
        self.scheduler = scheduler
        self.engine = engine
        """The rule engine: each rule's ladder, the release of a firing whose incident a ladder closed
        (the fault showing again opens a new incident), the GPU's telemetry for replacement bundles."""
        self.shell = shell
        self.clock = clock
        self.log = log
        self.ladders: dict[str, Record] = {}
        self.reserved: set[str] = set()
        """Nodes whose reboot passed the concurrency gate and has not finished (this process)."""
        self.histories: dict[str, ladder.History] = {}
        """Each GPU's recovery history as read or written since the takeover (``_history``)."""

    # -- lifecycle ---------------------------------------------------------------------------------
    async def load(self) -> int:
        """The ladders in flight, from KV (a takeover)."""
        self.ladders.clear()
        self.reserved.clear()
        self.histories.clear()
        for key in await self.store.keys(PREFIX):
            doc = await self.store.get(key)
            if doc is None:
                continue
            try:
                rec = Record.from_json(doc.value)
            except (KeyError, TypeError, ValueError) as e:
                self.log.error("ladder.unreadable", key=key, error=repr(e))
                continue
            if self._mine(rec):
                self.ladders[rec.state.incident_id] = rec
                if actions.spec(rec.pending.kind).reboots and rec.pending.action is not None:
                    self.reserved.add(rec.state.node)
        return len(self.ladders)

    def _mine(self, rec: Record) -> bool:
        return self.book.find(rec.state.incident_id) is not None

    def holds(self, incident_id: str) -> bool:
        """A ladder in flight owns the incident's end (its rule resolving does not close it), the
        incidents that follow it too."""
        return incident_id in self.ladders or any(incident_id in r.followers for r in self.ladders.values())

    async def rule_resolved(self, inc: book.Incident) -> None:
        """The incident's rule resolved while its ladder runs: noted, the ladder still decides the end."""
        if not inc.evidence.get("ladder.rule_resolved"):
            inc.evidence["ladder.rule_resolved"] = True
            await self.shell.publish(inc, incidents.Change.UPDATED)

    # -- a new incident ----------------------------------------------------------------------------
    async def opened(self, inc: book.Incident, now: float) -> None:
        """Before the incident is first published: start its ladder (enforce), or add the planned
        ladder to it (dry-run)."""
        if not self.cs.recovery or not self.cs.mode.plans:
            return
        lad = self.engine.rules.ladder_for(inc.rule_id)
        if lad is None:
            return
        inc.evidence["ladder"] = lad.id
        lead = next(
            (r for r in self.ladders.values() if r.state.node == inc.node and r.state.ladder_id == lad.id),
            None,
        )
        if lead is not None:  # one ladder per node: this incident follows the one in flight
            lead.followers.append(inc.id)
            await self._save(lead)
            inc.evidence[gates.LADDER_JOINED] = lead.state.incident_id
            inc.evidence["ladder.phase"] = lead.state.phase.name.lower()
            return
        if self.cs.mode.dry_run:
            lines = ladder.plan(lad, inc.port)
            inc.evidence["ladder.plan"] = " | ".join(lines)[:4000]
            for line in lines[1:]:
                kind = line.split(" ", 1)[0]
                inc.actions.append(
                    book.PlannedAction(kind=kind, status="planned", detail=line, at=now, ladder=True)
                )
            return
        step = ladder.start(
            lad, incident_id=inc.id, node=inc.node, gpu_uuid=inc.gpu_uuid, gpu_index=inc.gpu_index, now=now,
            port=inc.port,
        )  # fmt: skip
        rec = Record(step.state, Pending.of(step))
        inc.evidence["ladder.phase"] = step.state.phase.name.lower()
        await self._save(rec)
        self.ladders[inc.id] = rec

    # -- every tick --------------------------------------------------------------------------------
    async def advance(self, now: float, between: Callable[[], Awaitable[None]] | None = None) -> None:
        """Each ladder one step on, if its step is done; ``between`` runs after each ladder (the tick
        serves the events that arrived meanwhile: each ladder waits on KV, so all of them take a good
        part of a tick under load). Up to ``ADVANCE_AT_ONCE`` ladders are walked together, each on its
        own incident: a burst's thousand ladders do not wait on KV one after another (#43). The stop
        flags (``healer ladder stop``) are listed once per tick, not read once per ladder."""
        recs = list(self.ladders.values())
        if not recs:
            return
        try:
            stops = set(await self.store.keys(STOP_PREFIX))
        except errors.HealerError as e:  # KV away: every ladder stays where it is, tried next tick
            self.log.warning("ladder.advance_failed", error=str(e))
            return
        for start in range(0, len(recs), ADVANCE_AT_ONCE):
            await asyncio.gather(
                *(
                    self._advance_guarded(rec, now, STOP_PREFIX + rec.state.incident_id in stops)
                    for rec in recs[start : start + ADVANCE_AT_ONCE]
                )
            )
            if between is not None:
                await between()

    async def _advance_guarded(self, rec: Record, now: float, stopped: bool) -> None:
        try:  # its incident looked up now: ``between`` may have opened or closed some
            await self._advance(rec, now, self.book.find(rec.state.incident_id), stopped)
        except errors.HealerError as e:  # KV away: the ladder stays where it is, tried next tick
            self.log.warning("ladder.advance_failed", incident_id=rec.state.incident_id, error=str(e))

    async def _advance(self, rec: Record, now: float, inc: book.Incident | None, stopped: bool) -> None:
        """``stopped``: a stop flag was listed for its incident this tick (read here for who and why)."""
        stop = await self.store.get(STOP_PREFIX + rec.state.incident_id) if stopped else None
        outcome: ladder.Outcome | None
        if inc is None:
            outcome, detail = ladder.Outcome.STOPPED, "the incident was closed"
        elif stop is not None:
            who = stop.value
            at = datetime.datetime.fromtimestamp(float(who.get("at", now)), tz=datetime.UTC)
            detail = f"by {who.get('by')} at {at.isoformat(timespec='seconds')}: {who.get('reason', '')}"
            outcome = ladder.Outcome.STOPPED
        else:
            outcome, detail = await self._outcome(rec, inc, now)
        if outcome is None:
            assert inc is not None
            await self._add_action(rec, inc, now)
            return
        history = await self._history(rec.state)
        repeats = history.apart_from(rec.state.started_at, decide.EPISODE_S)
        step = ladder.next_step(rec.state, outcome, now, repeats, detail)
        if (
            step.kind is ladder.StepKind.REPLACE
            and rec.state.phase is ladder.Phase.CONTAINING
            and inc is not None
        ):
            # Straight from containment to a replacement (contact support, a repeat offender): that too
            # waits while the node's failure domain is suspected, and is never done once it recovered.
            if shared_cause.needless(inc, ladder.StepKind.REPLACE, False):
                step = ladder.next_step(
                    rec.state, ladder.Outcome.RECOVERED, now, repeats, shared_cause.RECOVERED_DETAIL
                )
            elif shared_cause.holding(inc.node, step.kind, self.book.of_rule(shared_cause.RULE_ID)):
                inc.evidence["ladder.next"] = f"hardware_replacement: held by its domain ({step.reason})"[
                    :1000
                ]
                return  # asked again next tick
        await self._take(rec, inc, step, history, now)
        if stop is not None:
            await self.store.delete(STOP_PREFIX + rec.state.incident_id)

    async def _outcome(
        self, rec: Record, inc: book.Incident, now: float
    ) -> tuple[ladder.Outcome | None, str]:
        p = rec.pending
        late = p.deadline is not None and now > p.deadline
        if p.kind is ladder.StepKind.CONTAIN:
            own = [a for a in inc.actions if not a.ladder and not a.on_resolve]
            out = ladder.containment([a.status for a in own])
            if out is None and late:
                return ladder.Outcome.FAILED, "containment ran past its deadline"
            failed = next((a for a in own if a.status is not None and a.status not in incidents.OK), None)
            return out, (f"{failed.kind}: {failed.status}: {failed.detail}" if failed else "contained")
        if p.action is None or p.action >= len(inc.actions):
            return None, ""
        action = inc.actions[p.action]
        if action.status is None:
            return (ladder.Outcome.FAILED, f"{p.kind} ran past its deadline") if late else (None, "")
        if actions.spec(p.kind).reboots and action.status in incidents.TOOK_EFFECT:
            if not p.reboot_requested:
                p.reboot_requested = True  # counted by every shard's max_concurrent_reboots from now
                await self._save(rec)
            return await self._reboot_progress(rec, late)
        if action.status == incidents.ActionStatus.SKIPPED and action.facts.get(shared_cause.RECOVERED_FACT):
            return ladder.Outcome.RECOVERED, action.detail  # held by its domain, then came back by itself
        return ladder.outcome_of(p.kind, action.status), action.detail

    async def _reboot_progress(self, rec: Record, late: bool) -> tuple[ladder.Outcome | None, str]:
        if not isinstance(self.scheduler, actuators.RebootReporter):  # cannot say (the log actuator)
            return ladder.Outcome.DONE, "rebooted (the scheduler reports no reboot status)"
        try:
            status = await self.scheduler.reboot_status(rec.state.node)
        except errors.HealerError as e:
            self.log.warning("ladder.reboot_status_failed", node=rec.state.node, error=str(e))
            status = actuators.RebootStatus(actuators.RebootPhase.ISSUED)
        if status.phase is actuators.RebootPhase.COMPLETE:
            return ladder.Outcome.DONE, f"reboot complete ({status.reason})"
        if status.phase is actuators.RebootPhase.TIMED_OUT:
            return ladder.Outcome.FAILED, f"reboot timed out ({status.reason})"
        if late:
            return ladder.Outcome.FAILED, f"the reboot ran past its deadline ({status.phase.value})"
        return None, ""

    async def _take(
        self,
        rec: Record,
        inc: book.Incident | None,
        step: ladder.Step,
        history: ladder.History,
        now: float,
    ) -> None:
        before = rec.state
        rec.state = step.state
        self.log.info(
            "ladder.step", incident_id=before.incident_id, node=before.node, gpu=before.gpu_index,
            phase=step.state.phase.name.lower(), step=str(step.kind), reason=step.reason,
        )  # fmt: skip
        if step.state.attempted_recovery and before.started_at not in history.recoveries:
            key, recorded = history_key(before.node, before.gpu_index), history.record(step.state)
            self.histories.pop(key, None)  # read again if the write fails
            await self.store.put(key, recorded.to_json())
            self.histories[key] = recorded
        if before.phase is ladder.Phase.REBOOTING and step.state.phase is not ladder.Phase.REBOOTING:
            self.reserved.discard(before.node)
        if step.kind is ladder.StepKind.NONE or step.kind is ladder.StepKind.REPLACE:
            await self._finish(rec, inc, step, history, now)
            return
        rec.pending = Pending.of(step)
        due = inc is not None and self._due(rec, inc, now)
        if due:
            assert inc is not None
            rec.pending.action = len(inc.actions)  # stored with the step: one write, not two (#43)
        await self._save(rec)
        if inc is not None:
            inc.evidence["ladder.phase"] = step.state.phase.name.lower()
            inc.evidence["ladder.next"] = f"{step.kind}: {step.reason}"[:1000]
            if due:
                inc.actions.append(self._planned(rec))
            await self.shell.publish(inc, incidents.Change.UPDATED)  # the step and its action: one change
            if due:
                self.shell.spawn(inc)

    def _due(self, rec: Record, inc: book.Incident, now: float) -> bool:
        """The pending step is an action to add to the incident now (not containment, not before its
        time, not added already)."""
        p = rec.pending
        if p.kind is ladder.StepKind.CONTAIN or now < p.not_before:
            return False
        return p.action is None or p.action >= len(inc.actions)

    async def _add_action(self, rec: Record, inc: book.Incident, now: float) -> None:
        """Add the pending step as an action of the incident once it is due (its index is stored first:
        a new leader finds it, and never adds it twice)."""
        if not self._due(rec, inc, now):
            return
        rec.pending.action = len(inc.actions)
        await self._save(rec)
        inc.actions.append(self._planned(rec))
        await self.shell.publish(inc, incidents.Change.UPDATED)
        self.shell.spawn(inc)

    def _planned(self, rec: Record) -> book.PlannedAction:
        """The pending step as the incident's action."""
        p = rec.pending
        params: dict[str, Any] = {"reason": f"{p.reason} ({rec.state.ladder_id})"[:200]}
        if p.kind is ladder.StepKind.VALIDATE:
            params |= {"soak_since": rec.state.updated_at, "dcgm_level": p.dcgm_level}
        ports = self._ports(rec)
        after_reset = rec.state.rung >= 0 and actions.per_port(rec.state.steps[rec.state.rung])
        if ports and (actions.per_port(p.kind) or (p.kind is ladder.StepKind.VALIDATE and after_reset)):
            # The link reset bounces them; the validation right after it checks they are back at their
            # rate. Only an agent that answered reset_port is sent ports on validate: an older agent
            # refuses the field, and a validation it refused after a reboot would end in replacement.
            params["ports"] = ports
        return book.PlannedAction(kind=str(p.kind), params=params, ladder=True)

    def _ports(self, rec: Record) -> list[str]:
        """The RDMA ports of the ladder's incident and of the incidents that follow it (two ports down on
        one node: one ladder bounces both)."""
        ports = [rec.state.port] if rec.state.port is not None else []
        for follower_id in rec.followers:
            follower = self.book.find(follower_id)
            if follower is not None and follower.port is not None and follower.port not in ports:
                ports.append(follower.port)
        return ports

    async def _finish(
        self,
        rec: Record,
        inc: book.Incident | None,
        step: ladder.Step,
        history: ladder.History,
        now: float,
    ) -> None:
        state = step.state
        self.ladders.pop(state.incident_id, None)
        self.reserved.discard(state.node)
        await self.store.delete(PREFIX + state.incident_id)
        for follower_id in rec.followers:
            follower = self.book.find(follower_id)
            if follower is not None and follower.state != incidents.IncidentState.RESOLVED:
                await self._end(follower, state, step, None, now)
        if inc is None:
            return
        await self._end(inc, state, step, history, now)

    async def _end(
        self,
        inc: book.Incident,
        state: ladder.LadderState,
        step: ladder.Step,
        history: ladder.History | None,
        now: float,
    ) -> None:
        """End ``inc`` as its ladder ended (``history`` None: a follower, which opens no replacement of
        its own; the ladder's own incident does, for the node)."""
        inc.evidence["ladder.phase"] = state.phase.name.lower()
        inc.evidence.pop("ladder.next", None)
        if state.phase is ladder.Phase.STOPPED:
            inc.evidence["outcome"] = "ladder_stopped"
            inc.actions.append(
                book.PlannedAction(
                    kind="stop_ladder", status="done", detail=f"ladder stopped {step.reason}"[:4096],
                    at=now, ladder=True,
                )
            )  # fmt: skip
            await self.shell.publish(inc, incidents.Change.ACTION)
            return
        if state.phase is ladder.Phase.REPLACEMENT:
            inc.evidence["outcome"] = str(ladder.StepKind.REPLACE)
            if history is not None:
                replacement = await self._replacement(inc, state, step.reason, history, now)
                inc.evidence["replacement"] = replacement.id
            if not inc.evidence.get("ladder.rule_resolved"):
                # Still firing: it resolves on its rule's terms; its uncordon is then skipped, because
                # the replacement incident holds the node out of service.
                inc.state = incidents.IncidentState.ESCALATED
                await self.shell.publish(inc, incidents.Change.ESCALATED)
                return
        else:
            inc.evidence["outcome"] = "recovered"
        inc.state = incidents.IncidentState.RESOLVED
        inc.resolved_at = now
        for signal in inc.signals:  # every rule that joined the fault, not only the first
            self.engine.release(signal.rule_id, inc.node, signal.gpu_index, signal.port)
        await self.shell.publish(inc, incidents.Change.RESOLVED)

    async def _replacement(
        self,
        inc: book.Incident,
        state: ladder.LadderState,
        why: str,
        history: ladder.History,
        now: float,
    ) -> book.Incident:
        """Open the hardware_replacement incident: it holds the node out of service until a person
        closes it."""
        facts: dict[str, str | None] = {}
        for a in inc.actions:
            if actions.spec(a.kind).reads_identity and a.facts:
                facts = dict(a.facts)
        telemetry = self.engine.summary(inc.node, inc.gpu_index, now)
        bundle = ladder.evidence(state, history, facts, [dict(inc.evidence)], telemetry)
        where = f"node {inc.node}" + (f" GPU {inc.gpu_index}" if inc.gpu_index is not None else "")
        where += f" port {inc.port}" if inc.port is not None else ""
        rep = book.Incident(
            id=book.new_id(),
            rule_id=REPLACEMENT_RULE,
            severity="critical",
            node=inc.node,
            gpu_index=inc.gpu_index,
            gpu_uuid=inc.gpu_uuid,
            state=incidents.IncidentState.ESCALATED,
            summary=f"hardware replacement for {where}: {why} (after {inc.rule_id}, {inc.id})",
            evidence={**ladder.flat_evidence(bundle), "incident": inc.id},
            labels=dict(inc.labels),
            mode=inc.mode,
            opened_at=now,
            updated_at=now,
            escalated=True,
            actions=[
                book.PlannedAction(
                    kind=str(ladder.StepKind.REPLACE), params={"reason": why[:200]}, status="done",
                    detail=f"the node stays out of service: {why}"[:4096], at=now, ladder=True,
                )
            ],
        )  # fmt: skip
        await self.shell.publish(rep, incidents.Change.OPENED)
        return rep

    # -- reboots in flight -------------------------------------------------------------------------
    async def reboots(self, node: str) -> int:
        """Other nodes rebooting for a ladder now (every shard's, from KV, and this process's own);
        when fewer than ``max_concurrent_reboots``, ``node`` takes a place (it is about to reboot)."""
        stored: set[str] = set()
        for key in await self.store.keys(PREFIX):
            doc = await self.store.get(key)
            if doc is None:
                continue
            pending = doc.value.get("pending", {})
            other = doc.value.get("state", {}).get("node")
            reboots = actions.spec(str(pending.get("kind", ""))).reboots
            if reboots and pending.get("reboot_requested") and other != node:
                stored.add(str(other))
        # This process's reservations are read after the awaits, with no await before the reservation
        # below: two ladders asking at once (two action tasks) cannot both take the last place.
        busy = stored | {n for n in self.reserved if n != node}
        if len(busy) < self.cs.max_concurrent_reboots:
            self.reserved.add(node)
        return len(busy)

    # -- KV ----------------------------------------------------------------------------------------
    async def _history(self, state: ladder.LadderState) -> ladder.History:
        """The GPU's earlier recoveries: read from KV once per takeover, then as this leader wrote them
        (only the leader of the node's shard writes them; ``load`` forgets them)."""
        key = history_key(state.node, state.gpu_index)
        known = self.histories.get(key)
        if known is not None:
            return known
        doc = await self.store.get(key)
        history = ladder.History.from_json(doc.value) if doc is not None else ladder.History()
        self.histories[key] = history
        return history

    async def _save(self, rec: Record) -> None:
        await self.store.put(PREFIX + rec.state.incident_id, rec.to_json())
