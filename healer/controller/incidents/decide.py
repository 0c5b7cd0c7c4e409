"""What the controller decides about incidents, as pure functions: state and time in, typed decisions out,
no I/O.

**Incident changes**: what a rule firing does to the incident book (open one, refresh its evidence,
resolve it and queue its on_resolve actions, or nothing: ``on_firing``), the repeat-fault escalation of
a new incident (``new_incident``, ``episodes``), and the escalation ladder (a power cap that did not help
becomes a cordon: ``ladder_step``). Whether a firing joins another incident, and what joining changes,
is in ``correlation``; whether a planned action may reach its actuator (the gates, the circuit breaker)
is in ``gates``.

Nothing here changes an incident: each decision returns the change, and the shell
(``incident_shell.IncidentShell``, ``runner.ActionRunner``) reads KV and the clock, calls these, applies
what they return, then persists, publishes and calls actuators.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
from collections.abc import Iterable, Sequence
from typing import Any

from healer import actions, config
from healer.controller.incidents import book, correlation
from healer.controller.power import power_budget
from healer.rules import engine
from healer.schemas import incidents

EPISODE_S = 120.0
"""Incidents on one GPU opened within this long of each other count as one fault episode (also the
default ``correlate_window_s``: firings that close together join one incident in the first place)."""


# -- incident changes ------------------------------------------------------------------------------
class Change(enum.Enum):
    NONE = "none"
    OPEN = "open"
    REFRESH = "refresh"
    """Fired again (a new event, or a condition after a restart): new evidence, an ``updated`` change."""
    SEEN = "seen"
    """Still firing: only ``last_seen_firing`` moves (nothing is published)."""
    RESOLVE = "resolve"
    PART = "part"
    """One signal of a joined incident resolved, another still holds it open: the signal is marked
    resolved (stored, not published); the incident and its actions stay."""


@dataclasses.dataclass(frozen=True, slots=True)
class FiringChange:
    change: Change
    evidence: dict[str, Any] = dataclasses.field(default_factory=dict)
    """OPEN / REFRESH: the evidence; RESOLVE: the evidence to merge (``resolve.`` prefixed)."""
    on_resolve: tuple[book.PlannedAction, ...] = ()
    """RESOLVE: the incident's on_resolve actions; PART (node-wide incident): one GPU's restores."""
    actions: tuple[book.PlannedAction, ...] = ()
    """REFRESH (node-wide incident): the per-GPU actions of a GPU firing again after its restore."""


def on_firing(
    f: engine.Firing, inc: book.Incident | None, rule_of: correlation.RuleOf = correlation.no_rule
) -> FiringChange:
    """What one firing does to its incident (``inc``: the open incident one of whose signals has the
    firing's key, or None). A joined incident resolves when its last holding signal does; its on_resolve
    actions are then those of every joined rule (``rule_of`` finds the others), each kind once. In a
    node-wide incident a per-GPU on_resolve action (restore_power_limit) runs for each GPU as the last
    of that GPU's signals resolves (``PART``, ``on_resolve``), and a GPU that fires again after that
    gets its rule's per-GPU actions again (``REFRESH``, ``actions``)."""
    if f.status == engine.Status.RESOLVED:
        if inc is None or inc.state == incidents.IncidentState.RESOLVED:
            return FiringChange(Change.NONE)
        forgotten = f.evidence.get("reason") == engine.FORGOTTEN  # the node left: undo nothing on it
        if any(s.open and s.key(inc.node) != f.key for s in inc.signals):
            if inc.node_wide is None or f.gpu is None or forgotten:
                return FiringChange(Change.PART)
            still = any(s.open and s.gpu_index == f.gpu and s.key(inc.node) != f.key for s in inc.signals)
            restores = () if still else correlation.gpu_restores(inc, f, rule_of, f.gpu)
            return FiringChange(Change.PART, on_resolve=restores)
        rules = [f.rule if s.key(inc.node) == f.key else rule_of(s.rule_id) for s in inc.signals]
        if not any(r is f.rule for r in rules):
            rules.insert(0, f.rule)
        planned: list[book.PlannedAction] = []
        if not forgotten and inc.node_wide is not None:
            for gpu in sorted({s.gpu_index for s in inc.signals if s.gpu_index is not None}):
                planned += correlation.gpu_restores(inc, f, rule_of, gpu)
            for rule in rules:
                if rule is not None:
                    node_level = [a for a in rule.on_resolve if not actions.per_gpu(a.kind)]
                    planned = correlation.union(planned, node_level, on_resolve=True)
        elif not forgotten:
            for rule in rules:
                if rule is not None:
                    planned = correlation.union(planned, rule.on_resolve, on_resolve=True)
        return FiringChange(
            Change.RESOLVE,
            evidence={f"resolve.{k}": v for k, v in f.evidence.items()},
            on_resolve=tuple(planned),
        )
    if inc is None:
        return FiringChange(Change.OPEN, evidence=dict(f.evidence))
    if f.status == engine.Status.FIRED:
        again: tuple[book.PlannedAction, ...] = ()
        if inc.node_wide is not None and f.gpu is not None:  # a GPU of the node fires again
            again = correlation.merge(inc.actions, correlation.gpu_actions(f.rule.actions), gpu=f.gpu).add
        return FiringChange(Change.REFRESH, evidence=dict(f.evidence), actions=again)
    return FiringChange(Change.SEEN)


def new_incident(
    f: engine.Firing, incident_id: str, now: float, mode: incidents.Mode, repeats: int,
    settings: config.ControllerSettings,
) -> book.Incident:  # fmt: skip
    """The incident a firing opens; the ``repeats``-th fault episode on a GPU is escalated for inspection."""
    rule = f.rule
    where = f"node {f.node}" + (f" GPU {f.gpu}" if f.gpu is not None else "")
    where += f" port {f.port}" if f.port is not None else ""
    group = correlation.group_of(rule) if f.gpu is not None else None
    planned = [
        # other GPUs of the node may join a node-wide group's incident: its per-GPU actions name their GPU
        book.PlannedAction(
            kind=a.kind, params=dict(a.params),
            gpu_index=f.gpu if group is not None and actions.per_gpu(a.kind) else None,
        )
        for a in rule.actions
    ]  # fmt: skip
    summary = f"{rule.id} on {where}: {rule.description}".strip().rstrip(":")
    up = repeat_escalation(planned, repeats, settings) if f.gpu is not None else None
    return book.Incident(
        signals=[correlation.signal_of(f, now)],
        id=incident_id,
        rule_id=rule.id,
        severity=rule.severity,
        node=f.node,
        gpu_index=f.gpu,
        gpu_uuid=f.gpu_uuid,
        port=f.port,
        summary=summary + (up.note if up else ""),
        evidence=dict(f.evidence),
        labels=dict(rule.labels),
        mode=mode,
        opened_at=now,
        updated_at=now,
        last_seen_firing=now,
        actions=planned + ([up.add] if up and up.add else []),
        escalated=up is not None,
        node_wide=group,
    )


@dataclasses.dataclass(frozen=True, slots=True)
class Escalation:
    """What escalating an incident changes (the shell applies it: ``incident_shell.escalate``)."""

    note: str
    """Appended to the summary."""
    add: book.PlannedAction | None = None
    """An action to add (None: the incident has one of its kind already)."""


def repeat_escalation(
    planned: Sequence[book.PlannedAction], repeats: int, settings: config.ControllerSettings
) -> Escalation | None:
    """The ``repeats``-th fault episode on the incident's GPU within ``repeat_window_s``: escalated, and
    an ``inspect`` action added (once). None below ``repeat_faults``."""
    if repeats < settings.repeat_faults:
        return None
    note = f" (fault #{repeats} on this GPU within {settings.repeat_window_s:g}s: inspect hardware)"
    inspect = book.PlannedAction(kind="inspect", params={"reason": "repeat faults"})
    return Escalation(note, None if any(a.kind == inspect.kind for a in planned) else inspect)


@dataclasses.dataclass(frozen=True, slots=True)
class Episodes:
    times: tuple[float, ...]
    """The openings to keep (this one included, at most 50)."""
    count: int


def episodes(opened: Iterable[float], now: float, window_s: float) -> Episodes:
    """Fault episodes on one GPU within ``window_s``, this one (at ``now``) included. Incidents opened
    within ``EPISODE_S`` of each other are one episode (one DBE fires several rules at once)."""
    times = [t for t in opened if now - t < window_s]
    times.append(now)
    count = 1
    for earlier, later in itertools.pairwise(times):
        if later - earlier >= EPISODE_S:
            count += 1
    return Episodes(tuple(times[-50:]), count)


def ladder_step(inc: book.Incident, now: float, settings: config.ControllerSettings) -> Escalation | None:
    """The escalation ladder: an incident still open ``power_cap_escalate_s`` after its power cap took
    effect, and not cordoned yet, gets a cordon."""
    capped = any(actions.spec(a.kind).caps_power and a.status in incidents.TOOK_EFFECT for a in inc.actions)
    cordon = book.PlannedAction(kind="cordon", params={"reason": "power cap not enough"})
    if (
        capped
        and inc.rule_id != power_budget.RULE_ID  # a domain's budget cap is the remedy, not a failed one
        and inc.state == incidents.IncidentState.OPEN
        and not any(a.kind == cordon.kind for a in inc.actions)
        and now - inc.opened_at > settings.power_cap_escalate_s
    ):
        return Escalation(LADDER_NOTE, cordon)
    return None


LADDER_NOTE = "; still firing after the power cap: cordoned (escalation ladder)"
