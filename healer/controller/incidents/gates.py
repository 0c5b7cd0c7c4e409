"""Whether one planned action may reach its actuator now, as pure functions (no I/O).

Each gate is a small check over an ``Attempt`` (a snapshot the shell gathers: mode, exclusions, the
cooldown and rate window, the lease, the other incidents on the node) returning a ``Verdict``: ``ALLOW``
(on to the next gate), ``WAIT`` (retry next tick) or ``SETTLE`` (record ``status`` and go no further).
The circuit breaker is shared through KV with compare-and-set, so its decision (``breaker_admission``) is
made inside the shell's CAS loop. ``cordon_ours`` and ``holding`` say whose cordon holds a node (what
the ownership gate's ``Attempt`` fields are gathered from).

The shell (``runner.ActionRunner``, ``remediation.policy``) reads KV and the clock, calls these and
applies what they return; the incident decisions are in ``decide``, correlation in ``correlation``.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from healer import actions, config
from healer.controller.incidents import book
from healer.controller.inventory import blast
from healer.schemas import incidents


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
