"""What the controller decides, as pure functions: state and time in, typed decisions out, no I/O.

Three kinds of decision live here. **Incident changes**: what a rule firing does to the incident book
(open one, refresh its evidence, resolve it and queue its on_resolve actions, or nothing), the repeat-fault
escalation of a new incident, and the escalation ladder (a power cap that did not help becomes a cordon).
**Correlation**: whether a new firing is another signal of a fault that already has an incident (the
same GPU, the same RDMA port for a port-scope rule, or the same node for a node-scope rule, within
``correlate_window_s``), and what joining it
changes (``correlate``, ``join``): one incident per fault, its actions the union of the rules' actions.
**Node-wide faults**: a GPU rule with ``node_wide`` opens a GPU incident that other GPUs of its node
firing rules of the same group join; once ``node_wide.threshold`` of the node's GPUs did, it is one node
incident (no GPU) with per-GPU evidence, and its per-GPU actions (a power cap) are planned, and undone
as each GPU's firing resolves, for each GPU that fired.
**Gates**: whether one planned action may reach its actuator now. Each gate is a small check over an
``Attempt`` (a snapshot the shell gathers: mode, exclusions, the cooldown and rate window, the lease, the
other incidents on the node) returning a ``Verdict``: ``ALLOW`` (on to the next gate), ``WAIT`` (retry
next tick) or ``SETTLE`` (record ``status`` and go no further). The circuit breaker is shared through KV
with compare-and-set, so its decision (``breaker_admission``) is made inside the shell's CAS loop.

Nothing here changes an incident: each decision returns the change, and the shell
(``incident_shell.IncidentShell``, ``runner.ActionRunner``) reads KV and the clock, calls these, applies
what they return, then persists, publishes and calls actuators.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from healer import actions, config
from healer.controller.incidents import book
from healer.controller.inventory import blast
from healer.controller.power import power_budget
from healer.rules import engine, ruleset
from healer.schemas import fields, incidents

EPISODE_S = 120.0
"""Incidents on one GPU opened within this long of each other count as one fault episode (also the
default ``correlate_window_s``: firings that close together join one incident in the first place)."""


# -- verdicts --------------------------------------------------------------------------------------
class Gate(enum.Enum):
    ALLOW = "allow"
    """This gate lets the action through (to the next gate, then the actuator)."""
    WAIT = "wait"
    """Not now: the action stays pending and is tried again next tick."""
    SETTLE = "settle"
    """The action is settled here with ``status`` (skipped, refused, done), no actuator is called."""


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    gate: Gate
    reason: str = ""
    status: incidents.ActionStatus | None = None
    """Set for SETTLE (and for an actuator's outcome)."""

    @classmethod
    def allow(cls, reason: str = "") -> Verdict:
        return cls(Gate.ALLOW, reason)

    @classmethod
    def wait(cls, reason: str) -> Verdict:
        return cls(Gate.WAIT, reason)

    @classmethod
    def settle(cls, status: incidents.ActionStatus, reason: str) -> Verdict:
        return cls(Gate.SETTLE, reason, status)

    @property
    def allowed(self) -> bool:
        return self.gate is Gate.ALLOW


ALLOW = Verdict.allow()


# -- cooldowns and rate limits ---------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class LastAction:
    """The newest action of one kind on one node (for the per-node cooldown)."""

    at: float
    incident_id: str


@dataclasses.dataclass(frozen=True, slots=True)
class LimitsView:
    """What the cooldown and rate-limit gate needs: the last action of this kind on this node (None when
    the kind has no cooldown or none ran) and the times of this kind's actions in the last minute."""

    last: LastAction | None = None
    window: tuple[float, ...] = ()


def limits_verdict(
    kind: str,
    node: str,
    incident_id: str,
    now: float,
    view: LimitsView,
    settings: config.ControllerSettings,
) -> Verdict:
    last = view.last
    if last is not None and last.incident_id != incident_id and now - last.at < settings.action_cooldown_s:
        return Verdict.wait(f"cooldown: {kind} on {node} {now - last.at:.0f}s ago for {last.incident_id}")
    if len(view.window) >= settings.actions_per_minute:
        return Verdict.wait(f"rate limit: {len(view.window)} {kind} actions in the last minute")
    return ALLOW


# -- the circuit breaker ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class BreakerEntry:
    """One node healer took out of service, in the breaker's window. Stored in KV as ``[node, at,
    incident_id]`` (the format ``healer breaker status`` shows)."""

    node: str
    at: float
    incident_id: str = ""

    @classmethod
    def of(cls, raw: Sequence[Any]) -> BreakerEntry:
        return cls(str(raw[0]), float(raw[1]), str(raw[2]) if len(raw) > 2 else "")

    def dump(self) -> list[Any]:
        return [self.node, self.at, self.incident_id]


@dataclasses.dataclass(frozen=True, slots=True)
class BreakerAdmission:
    allowed: bool
    reason: str
    tripped: bool = False
    """This very request opened the breaker (the controller raises a fleet incident)."""
    state: dict[str, Any] | None = None
    """The breaker document to write (compare-and-set); None when nothing changes."""
    held: blast.Hold | None = None
    """A failure domain at its ``domain_limits`` limit holds the action (it waits; nothing opens)."""


def limit_of(fleet_size: int, settings: config.ControllerSettings) -> int:
    by_percent = math.floor(fleet_size * settings.breaker_max_percent / 100.0)
    return max(1, min(settings.breaker_max_nodes, by_percent))


def breaker_admission(
    state: Mapping[str, Any],
    node: str,
    fleet_size: int,
    incident_id: str,
    now: float,
    settings: config.ControllerSettings,
    domains: blast.View | None = None,
) -> BreakerAdmission:
    """May healer take ``node`` out of service, given the breaker document ``state``? ``domains``: the
    node's limited failure domains; one at its limit holds the request before the fleet-wide limit is
    looked at, so a full rack never trips the breaker for the rest of the fleet."""
    entries = [
        e for e in map(BreakerEntry.of, state.get("entries", [])) if now - e.at < settings.breaker_window_s
    ]
    if any(e.node == node for e in entries):
        return BreakerAdmission(True, "node already counted in the breaker window")
    if state.get("open"):
        return BreakerAdmission(
            False, f"circuit breaker open since {state.get('opened_at')}: {state.get('reason')}"
        )
    if domains is not None and settings.domain_limits:
        hold = blast.domain_hold((e.node for e in entries), node, domains, settings.domain_limits)
        if hold is not None:
            return BreakerAdmission(False, hold.reason, held=hold)
    limit = limit_of(fleet_size, settings)
    counted = [e.dump() for e in entries]
    if len(entries) + 1 > limit:
        reason = (
            f"{len(entries) + 1} nodes in {settings.breaker_window_s:g}s would exceed "
            f"the limit of {limit} (fleet of {fleet_size})"
        )
        doc = {
            "open": True,
            "opened_at": now,
            "reason": reason,
            "entries": counted,
            "refused": [node, incident_id],
        }
        return BreakerAdmission(False, reason, tripped=True, state=doc)
    doc = {"open": False, "entries": [*counted, BreakerEntry(node, now, incident_id).dump()]}
    return BreakerAdmission(True, f"{len(entries) + 1} of {limit} in the window", state=doc)


# -- the gates -------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class Attempt:
    """Everything the gates look at for one planned action, gathered by the shell."""

    kind: str
    params: Mapping[str, Any]
    on_resolve: bool
    node: str
    incident_id: str
    now: float
    mode: incidents.Mode
    settings: config.ControllerSettings
    excluded: Mapping[str, Any] | None
    """The node's maintenance exclusion (who, why), or None."""
    limits: LimitsView
    lease_valid: bool
    """This process holds a lease token renewed within half its TTL."""
    cordon_ours: bool = False
    """(uncordon) This incident's own cordon-like action is done."""
    held_elsewhere: bool = False
    """(uncordon) Another open incident still holds the node out of service."""
    ladder_step: bool = False
    """A recovery-ladder step (healer.controller.remediation.healing), not one of the rule's actions."""
    reboots_elsewhere: int = 0
    """(reboot_node) Other nodes rebooting for a recovery ladder now."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", incidents.Mode(self.mode))  # the enum, also when given its value


Check = Callable[[Attempt], Verdict]


def mode_gate(a: Attempt) -> Verdict:
    return (
        Verdict.settle(incidents.ActionStatus.SKIPPED, "observe mode: incidents only")
        if not a.mode.plans
        else ALLOW
    )


def actuator_gate(a: Attempt) -> Verdict:
    """Actions that need no actuator (notify) or are not automated outside a ladder (GPU reset)."""
    spec = actions.spec(a.kind)
    if spec.published_only:
        return Verdict.settle(
            incidents.ActionStatus.DONE, str(a.params.get("message") or "incident published")
        )
    if spec.runs_in_ladder_only and not a.ladder_step:
        return Verdict.settle(
            incidents.ActionStatus.SKIPPED,
            "a GPU reset is a recovery-ladder step: declare a ladder for this rule (ladders:)",
        )
    return ALLOW


def exclusion_gate(a: Attempt) -> Verdict:
    if a.excluded is None:
        return ALLOW
    return Verdict.settle(
        incidents.ActionStatus.SKIPPED,
        f"node excluded for maintenance by {a.excluded.get('by')}: {a.excluded.get('reason')}",
    )


def limits_gate(a: Attempt) -> Verdict:
    return limits_verdict(a.kind, a.node, a.incident_id, a.now, a.limits, a.settings)


def ownership_gate(a: Attempt) -> Verdict:
    """An uncordon (or a ladder's return to service) only undoes healer's own cordon, and only when no
    other open incident holds the node."""
    spec = actions.spec(a.kind)
    if not (spec.undoes_cordon and (a.on_resolve or spec.ladder_only)):
        return ALLOW
    if not a.cordon_ours and spec.ladder_only:
        return Verdict.settle(
            incidents.ActionStatus.SKIPPED, "healer did not take this node out of service: left as it is"
        )
    if not a.cordon_ours or a.held_elsewhere:
        return Verdict.settle(
            incidents.ActionStatus.SKIPPED, "another open incident still holds this node cordoned"
        )
    return ALLOW


def reboot_gate(a: Attempt) -> Verdict:
    """At most ``max_concurrent_reboots`` nodes reboot for recovery ladders at once."""
    if not actions.spec(a.kind).reboots or a.reboots_elsewhere < a.settings.max_concurrent_reboots:
        return ALLOW
    return Verdict.wait(
        f"{a.reboots_elsewhere} other nodes rebooting (max_concurrent_reboots "
        f"{a.settings.max_concurrent_reboots}): waiting"
    )


def lease_gate(a: Attempt) -> Verdict:
    return ALLOW if a.lease_valid else Verdict.wait("not the leader any more")


LOCAL_GATES: tuple[Check, ...] = (mode_gate, actuator_gate, exclusion_gate)
"""The gates that need nothing from KV (the shell reads the cooldown and rate window only after them)."""
STORED_GATES: tuple[Check, ...] = (limits_gate, ownership_gate, reboot_gate, lease_gate)
GATES: tuple[Check, ...] = LOCAL_GATES + STORED_GATES
"""In order; the first that does not allow decides. The circuit breaker comes after them (in the shell's
compare-and-set loop) for the kinds that take capacity out of service."""


def gate(attempt: Attempt, checks: Iterable[Check] = GATES) -> Verdict:
    for check in checks:
        verdict = check(attempt)
        if not verdict.allowed:
            return verdict
    return ALLOW


HANDED_OVER = "cordon.handed_over_by"
"""Evidence of an incident that inherited healer's cordon of its node from another incident: that one
resolved while this one still held the node (its uncordon skipped), so this one's uncordon lifts it."""
LADDER_JOINED = "ladder.joined"
"""Evidence of an incident whose node already walks a recovery ladder for another incident (that
incident's id): it follows that ladder instead of starting its own (``healing``: one ladder per node)."""


def cordon_ours(inc: book.Incident) -> bool:
    """Healer's own scheduler action (other than an uncordon) on this incident is done, or the incident
    inherited healer's cordon of the node (``HANDED_OVER``)."""
    return bool(inc.evidence.get(HANDED_OVER)) or any(
        (spec := actions.kind(a.kind)) is not None
        and spec.scheduler_verb is not None
        and not spec.undoes_cordon
        and a.status == incidents.ActionStatus.DONE
        for a in inc.actions
    )


def holding(inc: book.Incident, others: Iterable[book.Incident]) -> list[book.Incident]:
    """The other open incidents on the node that have taken it out of service, apart from those that
    follow this incident's recovery ladder (it ends them: ``LADDER_JOINED``)."""
    return [
        other
        for other in others
        if other.id != inc.id
        and other.node == inc.node
        and other.state != incidents.IncidentState.RESOLVED
        and other.evidence.get(LADDER_JOINED) != inc.id
        and any(a.kind in actions.TAKES_OUT_OF_SERVICE and a.status in incidents.OK for a in other.actions)
    ]


def held_elsewhere(inc: book.Incident, others: Iterable[book.Incident]) -> bool:
    """Another open incident on the node has taken it out of service (``holding``)."""
    return bool(holding(inc, others))


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


RuleOf = Callable[[str], ruleset.Rule | None]
"""Finds a loaded rule by id (``Engine.rules.by_id``)."""


def _no_rule(rule_id: str) -> ruleset.Rule | None:
    return None


def on_firing(f: engine.Firing, inc: book.Incident | None, rule_of: RuleOf = _no_rule) -> FiringChange:
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
            restores = () if still else gpu_restores(inc, f, rule_of, f.gpu)
            return FiringChange(Change.PART, on_resolve=restores)
        rules = [f.rule if s.key(inc.node) == f.key else rule_of(s.rule_id) for s in inc.signals]
        if not any(r is f.rule for r in rules):
            rules.insert(0, f.rule)
        planned: list[book.PlannedAction] = []
        if not forgotten and inc.node_wide is not None:
            for gpu in sorted({s.gpu_index for s in inc.signals if s.gpu_index is not None}):
                planned += gpu_restores(inc, f, rule_of, gpu)
            for rule in rules:
                if rule is not None:
                    node_level = [a for a in rule.on_resolve if not actions.per_gpu(a.kind)]
                    planned = union(planned, node_level, on_resolve=True)
        elif not forgotten:
            for rule in rules:
                if rule is not None:
                    planned = union(planned, rule.on_resolve, on_resolve=True)
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
            again = merge(inc.actions, _gpu_actions(f.rule.actions), gpu=f.gpu).add
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
    group = group_of(rule) if f.gpu is not None else None
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
        signals=[signal_of(f, now)],
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


# -- correlation: one incident per fault --------------------------------------------------------------
def holds(rule: ruleset.Rule) -> bool:
    """A firing of this rule holds its incident open until it resolves. An event rule without
    ``resolve`` never resolves (each event fires anew): its signal is evidence only."""
    return not (rule.on_event is not None and rule.resolve_for_s <= 0)


def signal_of(f: engine.Firing, now: float) -> book.Signal:
    return book.Signal(
        rule_id=f.rule.id, gpu_index=f.gpu, gpu_uuid=f.gpu_uuid, port=f.port, since=now,
        last_seen_firing=now, holds=holds(f.rule), evidence=dict(f.evidence),
    )  # fmt: skip


def group_of(rule: ruleset.Rule) -> str | None:
    """The rule's node-wide group (``node_wide.group``), None when it has no ``node_wide``."""
    return rule.node_wide.group if rule.node_wide is not None and rule.scope == fields.Scope.GPU else None


def _gpu_actions(wanted: Iterable[actions.Action]) -> list[actions.Action]:
    return [a for a in wanted if actions.per_gpu(a.kind)]


def capped(inc: book.Incident, gpu: int) -> bool:
    """A per-GPU action (a power cap) of the incident acts on ``gpu`` and was not undone since."""
    state = False
    for a in inc.actions:
        if a.gpu_index == gpu and actions.per_gpu(a.kind):
            state = not a.on_resolve
    return state


def gpu_restores(
    inc: book.Incident, f: engine.Firing, rule_of: RuleOf, gpu: int
) -> tuple[book.PlannedAction, ...]:
    """(node-wide incident) The per-GPU on_resolve actions of the rules that fired on ``gpu``, for that
    GPU, if one of its actions is still in effect (none after a restore, none for a GPU never capped)."""
    if not capped(inc, gpu):
        return ()
    rules = [
        f.rule if s.rule_id == f.rule.id else rule_of(s.rule_id) for s in inc.signals if s.gpu_index == gpu
    ]
    planned: list[book.PlannedAction] = []
    for rule in rules:
        if rule is not None:
            planned = union(planned, _gpu_actions(rule.on_resolve), on_resolve=True, gpu=gpu)
    return tuple(planned)


def same_gpu(inc: book.Incident, f: engine.Firing) -> bool:
    """The incident is about the firing's GPU: by UUID where both are known (an index can change at a
    reboot), else by index."""
    if inc.gpu_uuid is not None and f.gpu_uuid is not None:
        return inc.gpu_uuid == f.gpu_uuid
    return f.gpu is not None and inc.gpu_index == f.gpu


def correlate(
    f: engine.Firing, open_incidents: Iterable[book.Incident], now: float, window_s: float
) -> book.Incident | None:
    """The open incident a firing that has none joins, or None (it opens its own).

    A GPU firing of a ``node_wide`` rule first joins its node's incident of the same group: the
    node-wide one whenever it opened, else one opened less than ``node_wide.within`` ago (about another
    GPU, which the join may make node-wide), then the node's node-wide incident of a group the rule's
    ``node_wide.joins`` names (the cause that explains it: a straggler behind a power brake).
    Otherwise candidates are the node's open incidents opened less than ``window_s`` ago (0 turns this
    correlation off). A port firing (a port-scope rule) joins
    only the newest one about the same port: two faulty ports of a node are two incidents. A GPU firing
    joins the newest one about the same GPU; failing that, the node's only GPU-less incident that is
    neither node-wide nor a port's (a node-scope signal such as ``gpus_missing`` that fired first: the
    incident then takes the GPU). A node-scope firing joins the node's only candidate (a port incident
    too: ``rdma-ports-missing`` beside the one port that is down); with two or more it cannot tell which
    fault it belongs to and opens its own."""
    on_node = [i for i in open_incidents if i.node == f.node and i.state != incidents.IncidentState.RESOLVED]
    if f.port is not None:
        same_port = [i for i in on_node if i.port == f.port and 0 <= now - i.opened_at < window_s]
        return max(same_port, key=lambda i: i.opened_at) if same_port else None
    group = group_of(f.rule)
    if group is not None and f.gpu is not None and f.rule.node_wide is not None:
        within_s = f.rule.node_wide.within_s
        mine = [
            i for i in on_node
            if i.node_wide == group and (i.node_wide_at is not None or 0 <= now - i.opened_at < within_s)
        ]  # fmt: skip
        if mine:
            return max(mine, key=lambda i: (i.node_wide_at is not None, i.opened_at))
        explains = [
            i for i in on_node
            if i.node_wide in f.rule.node_wide.joins and i.node_wide_at is not None
        ]  # fmt: skip
        if explains:  # a node-wide incident of a group that explains this rule: one cause, one incident
            return max(explains, key=lambda i: i.opened_at)
    if window_s <= 0:
        return None
    recent = [i for i in on_node if 0 <= now - i.opened_at < window_s]
    if f.gpu is None:
        return recent[0] if len(recent) == 1 else None
    same = [i for i in recent if same_gpu(i, f)]
    if same:
        return max(same, key=lambda i: i.opened_at)
    gpuless = [i for i in recent if i.gpu_index is None and i.node_wide_at is None and i.port is None]
    return gpuless[0] if len(gpuless) == 1 else None


def stronger(kind: str, current: Mapping[str, Any], wanted: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters of one action kind two joined rules both ask for: the stronger where they
    differ, as the catalogue says for the kind (``ActionKind.stronger``: a power cap the lower limit, a
    GPU reset at once rather than when idle); otherwise (a reason or a message) the first, a missing one
    filled from the other."""
    merge = actions.spec(kind).stronger
    return merge(current, wanted) if merge is not None else {**wanted, **current}


@dataclasses.dataclass(frozen=True, slots=True)
class Merge:
    """What a rule's actions add to those already planned: each kind once."""

    params: dict[int, dict[str, Any]]
    """Index in the plan → the stronger parameters of a kind planned and not tried yet (one already
    carried out stays as it was)."""
    add: tuple[book.PlannedAction, ...]
    """The kinds not planned yet, appended in the rule's order."""


def merge(
    planned: Sequence[book.PlannedAction],
    wanted: Iterable[actions.Action],
    *,
    on_resolve: bool = False,
    gpu: int | None = None,
) -> Merge:
    """``gpu``: the GPU a node-wide incident's per-GPU kinds act on (None: the incident's own). A
    per-GPU kind is matched only with the same GPU's, planned after that GPU's last restore."""
    params: dict[int, dict[str, Any]] = {}
    add: list[book.PlannedAction] = []

    def target(kind: str) -> int | None:
        return gpu if actions.per_gpu(kind) else None

    def current(n: int, p: book.PlannedAction, kind: str) -> bool:
        if p.kind != kind or p.on_resolve != on_resolve or p.gpu_index != target(kind):
            return False
        if gpu is None or not actions.per_gpu(kind) or on_resolve:
            return True
        return not any(
            q.on_resolve and q.gpu_index == gpu and actions.per_gpu(q.kind) for q in planned[n + 1 :]
        )

    for a in wanted:
        i = next((n for n, p in enumerate(planned) if current(n, p, a.kind)), None)
        if i is not None:
            if planned[i].status is None:
                params[i] = stronger(a.kind, params.get(i, planned[i].params), a.params)
        elif not any(p.kind == a.kind for p in add):
            add.append(
                book.PlannedAction(
                    kind=a.kind, params=dict(a.params), on_resolve=on_resolve, gpu_index=target(a.kind)
                )
            )
        else:
            n = next(n for n, p in enumerate(add) if p.kind == a.kind)
            add[n] = add[n].model_copy(update={"params": stronger(a.kind, add[n].params, a.params)})
    return Merge({i: p for i, p in params.items() if p != planned[i].params}, tuple(add))


def union(
    planned: Sequence[book.PlannedAction],
    wanted: Iterable[actions.Action],
    *,
    on_resolve: bool = False,
    gpu: int | None = None,
) -> list[book.PlannedAction]:
    """A new plan: ``planned`` (copies) with ``wanted`` merged in (``merge``)."""
    m = merge(planned, wanted, on_resolve=on_resolve, gpu=gpu)
    out = [
        p.model_copy(update={"params": m.params[i]}) if i in m.params else p for i, p in enumerate(planned)
    ]
    return [*out, *m.add]


def evidence_of(inc: book.Incident) -> dict[str, Any]:
    """The incident's evidence: the opening signal's values as they are; once others joined, each
    joined signal's values prefixed with its rule id, and ``signals`` listing every rule, first first.
    An incident about two or more GPUs (node-wide) keeps every GPU's values under ``gpu<index>.``
    (``gpu3.temp_c``; ``gpu3.<rule>.`` for another rule than the opening one), and says which GPUs
    fired (``gpus``), which still do (``gpus_firing``) and, once node-wide, of how many."""
    first, *rest = inc.signals
    gpus = sorted({s.gpu_index for s in inc.signals if s.gpu_index is not None})
    if inc.node_wide is not None and (len(gpus) > 1 or inc.node_wide_at is not None):
        evidence: dict[str, Any] = {
            "node_wide": inc.node_wide,
            "gpus": ",".join(map(str, gpus)),
            "gpus_firing": ",".join(
                map(str, sorted({s.gpu_index for s in inc.signals if s.gpu_index is not None and s.open}))
            ),
        }
        if inc.node_gpus:
            evidence["node_gpus"] = inc.node_gpus
        if len({s.rule_id for s in inc.signals}) > 1:
            evidence["signals"] = ",".join(dict.fromkeys(s.rule_id for s in inc.signals))
        for s in inc.signals:
            where = "node" if s.gpu_index is None else f"gpu{s.gpu_index}"
            rule = "" if s.rule_id == inc.rule_id else f"{s.rule_id}."
            evidence.update({f"{where}.{rule}{k}": v for k, v in s.evidence.items()})
        return evidence
    evidence = dict(first.evidence)
    if rest:
        evidence["signals"] = ",".join(s.rule_id for s in inc.signals)
        for s in rest:
            evidence.update({f"{s.rule_id}.{k}": v for k, v in s.evidence.items()})
    return evidence


def max_severity(a: incidents.Severity, b: incidents.Severity) -> incidents.Severity:
    return max(a, b, key=lambda s: incidents.SEVERITY_LEVELS[s].rank)


@dataclasses.dataclass(frozen=True, slots=True)
class Join:
    """What joining a firing changes on the incident it correlates with (the shell applies it:
    ``incident_shell.apply_join``)."""

    signal: book.Signal
    severity: incidents.Severity
    summary: str
    labels: dict[str, str]
    actions: Merge
    """New kinds appended (pending), pending ones strengthened."""
    gpu: tuple[int, str | None] | None = None
    """A GPU-less incident takes the GPU (index, UUID) of the GPU signal that joined it."""
    node_wide: str | None = None
    """The incident's node-wide group from now on (set when a GPU-less incident takes a grouped GPU)."""
    node_wide_at: float | None = None
    """Set when this join makes it node-wide: the incident leaves its GPU and becomes the node's."""
    node_gpus: int = 0


def join(
    inc: book.Incident, f: engine.Firing, now: float, node_gpus: int = 0, rule_of: RuleOf = _no_rule
) -> Join:
    """``f`` (a firing ``correlate`` matched with ``inc``) becomes another signal of ``inc``: the
    incident takes the higher severity, the union of the actions and says which rule joined. In a
    node-wide group's incident, the firing's per-GPU actions are planned for its GPU, and the join that
    brings the GPUs that fired to ``node_wide.threshold(node_gpus)`` (``node_gpus``: the GPUs the node
    reports) makes it the node's incident."""
    group = group_of(f.rule)
    adopt = inc.gpu_index is None and inc.node_wide_at is None and f.gpu is not None
    node_wide = group if adopt and inc.node_wide is None else None
    grouped = (inc.node_wide or node_wide) is not None and f.gpu is not None
    where = f" (GPU {f.gpu})" if adopt or (grouped and f.gpu != inc.gpu_index) else ""
    summary = f"{inc.summary}; joined by {f.rule.id}{where}"
    gpus = {s.gpu_index for s in inc.signals if s.gpu_index is not None} | {f.gpu}
    gpus.discard(None)
    promote = (
        inc.node_wide_at is None
        and group is not None
        and group == inc.node_wide
        and f.rule.node_wide is not None
        and f.rule.node_wide.reached(len(gpus), node_gpus)
    )
    node_wide_at = now if promote else None
    if promote or inc.node_wide_at is not None:
        opener = f.rule if f.rule.id == inc.rule_id else rule_of(inc.rule_id)
        total = max(node_gpus, inc.node_gpus, len(gpus))
        listed = ",".join(str(g) for g in sorted(g for g in gpus if g is not None))
        summary = f"{inc.rule_id} on node {inc.node}: node-wide, {len(gpus)} of {total} GPUs ({listed})"
        if opener is not None and opener.description:
            summary += f": {opener.description}"
    return Join(
        signal=signal_of(f, now),
        severity=max_severity(inc.severity, f.rule.severity),
        summary=summary.strip(),
        labels={**f.rule.labels, **inc.labels},
        actions=merge(inc.actions, f.rule.actions, gpu=f.gpu if grouped else None),
        gpu=(f.gpu, f.gpu_uuid) if adopt and f.gpu is not None else None,
        node_wide=node_wide,
        node_wide_at=node_wide_at,
        node_gpus=max(node_gpus, len(gpus)) if promote or inc.node_wide_at is not None else 0,
    )


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
