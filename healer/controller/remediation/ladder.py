"""The recovery ladder as a pure state machine: where a fault's recovery stands and what to do next.

contain → reset the GPU (a port fault: bounce the port's link) → validate → return to service; the
reset or its validation fails → reboot the node → validate → return; that fails too, or the GPU needed
recovery ``repeat_count`` times within ``repeat_within_s`` (this one included), or the ladder is
NVIDIA's "contact support" class → hardware replacement: the node stays out. A ``reset_port`` rung is
for an incident with a port (``mlx5_0/1``): one without (a node-scope fabric fault, an HCA gone) skips
it. The rungs and limits come from the rule pack (healer.rules.recovery) and are copied into the state
when a ladder starts, so a rule reload never changes a ladder in flight.

No I/O here. The shell (the controller) calls ``start`` when an incident whose rule has a ladder opens,
does what the returned ``Step`` says (the actuators), and calls ``next_step`` with what came of it; it
stores ``LadderState.to_json()`` in KV after every step (a restarted controller carries on from there)
and enforces ``Step.deadline`` (past it: ``Outcome.FAILED``). ``History`` is the GPU's earlier recoveries,
also kept in KV, so the "N in a window" rule survives a restart.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Mapping, Sequence
from typing import Any

from healer import actions
from healer.rules import recovery
from healer.schemas import incidents

VALIDATE_MARGIN_S = 600.0
"""Validation's budget beyond its soak (dcgmi diag -r 1 takes about a minute, -r 3 up to ~30)."""
RETURN_BUDGET_S = 300.0
CONTAIN_BUDGET_S = 3600.0
"""Draining may wait for jobs to be requeued; past an hour the ladder moves on to the reboot
(the scheduler's ``reboot ASAP`` drains by itself)."""
REFUSAL_RETRY_S = 60.0
"""A rung refused because work still runs on the GPU is asked again this much later ..."""
MAX_REFUSALS = 5
"""... at most this many times; then it counts as failed and the next rung (or replacement) follows."""


class Phase(enum.IntEnum):
    CONTAINING = 1
    RESETTING = 2
    REBOOTING = 3
    VALIDATING = 4
    RETURNING = 5
    RETURNED = 6
    """Terminal: back in service."""
    REPLACEMENT = 7
    """Terminal: the node stays out; a hardware_replacement incident is open."""
    STOPPED = 8
    """Terminal: an operator stopped the ladder; the node stays as it is."""
    PORT_RESETTING = 9
    """Bouncing the incident's port's link (``reset_port``)."""


TERMINAL = frozenset({Phase.RETURNED, Phase.REPLACEMENT, Phase.STOPPED})


class Outcome(enum.StrEnum):
    """What came of the step the shell was told to do."""

    CONTAINED = "contained"
    DONE = "done"
    """The reset or the reboot completed."""
    REFUSED = "refused"
    """The agent refused the reset (compute processes or jobs still on the GPU): asked again later."""
    FAILED = "failed"
    """The step failed, or ran past its deadline."""
    PASSED = "passed"
    VALIDATION_FAILED = "validation_failed"
    RETURNED = "returned"
    RECOVERED = "recovered"
    """The node recovered on its own while a shared-cause incident held this rung (#27): it is returned
    to service without the reset or reboot (no rung ran, so it is no recovery in the GPU's history)."""
    STOPPED = "stopped"
    """An operator stopped the ladder (``detail`` says who)."""


class StepKind(enum.StrEnum):
    """The ladder's own steps around its rungs. A rung's step is its kind's name (``actions.RUNGS``: the
    registry's kinds with a ``rung``, which says the step's phase and budget)."""

    CONTAIN = "contain"
    VALIDATE = "validate"
    RETURN_TO_SERVICE = "return_to_service"
    REPLACE = "hardware_replacement"
    """Open the hardware_replacement incident with its evidence bundle; keep the node out."""
    NONE = "none"
    """Nothing to do: the ladder is finished."""


def step_kind(value: str) -> str:
    """A stored step's kind back: a ``StepKind``, or a registered rung's name. Raises ValueError."""
    if value in StepKind.__members__.values():
        return StepKind(value)
    if value in actions.RUNGS:
        return value
    raise ValueError(f"{value!r} is no ladder step")


def _rung_phase(rung: str) -> Phase:
    spec = actions.spec(rung).rung
    if spec is None:
        raise ValueError(f"{rung!r} is no rung")
    return Phase[spec.phase]


def rung_phases() -> frozenset[Phase]:
    """The phases of the registered rungs, read from the registry when asked (a rung registered after
    import is one)."""
    return frozenset(_rung_phase(r) for r in actions.RUNGS)


_RUNG_OUTCOMES = frozenset({Outcome.DONE, Outcome.REFUSED, Outcome.FAILED, Outcome.RECOVERED})
_EXPECTED: dict[Phase, frozenset[Outcome]] = {
    Phase.CONTAINING: frozenset({Outcome.CONTAINED, Outcome.FAILED, Outcome.RECOVERED}),
    Phase.VALIDATING: frozenset({Outcome.PASSED, Outcome.VALIDATION_FAILED, Outcome.FAILED}),
    Phase.RETURNING: frozenset({Outcome.RETURNED, Outcome.FAILED}),
}
"""The outcomes each phase of the ladder's own may have; a rung's phase has ``_RUNG_OUTCOMES``."""


def expected(phase: Phase) -> frozenset[Outcome]:
    """The outcomes ``phase`` may have (none for a terminal phase)."""
    if phase in rung_phases():
        return _RUNG_OUTCOMES
    return _EXPECTED.get(phase, frozenset())


@dataclasses.dataclass(frozen=True, slots=True)
class Transition:
    at: float
    phase: Phase
    outcome: Outcome
    detail: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class LadderState:
    """One ladder in flight (or finished), JSON-able for KV ``healer-state``."""

    incident_id: str
    ladder_id: str
    node: str
    gpu_uuid: str | None
    gpu_index: int | None
    steps: tuple[str, ...]
    """The rungs (``actions.RUNGS``' kind names)."""
    contact_support: bool
    soak_s: float
    dcgm_level: int
    repeat_count: int
    repeat_within_s: float
    started_at: float
    port: str | None = None
    """The incident's RDMA port (``mlx5_0/1``) for a port fault: what ``reset_port`` bounces."""
    phase: Phase = Phase.CONTAINING
    rung: int = -1
    """Index into ``steps`` of the rung tried last; -1 before the first."""
    refusals: int = 0
    updated_at: float = 0.0
    transitions: tuple[Transition, ...] = ()

    @property
    def finished(self) -> bool:
        return self.phase in TERMINAL

    @property
    def attempted_recovery(self) -> bool:
        """Whether a rung was tried: a ladder that did counts toward the GPU's recovery history."""
        return self.rung >= 0

    def to_json(self) -> dict[str, Any]:
        doc = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # scalars: no deep copy
        doc["steps"] = list(self.steps)
        doc["phase"] = self.phase.name
        doc["transitions"] = [
            {"at": t.at, "phase": t.phase.name, "outcome": t.outcome.value, "detail": t.detail}
            for t in self.transitions
        ]
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> LadderState:
        fields = dict(doc)
        fields["steps"] = tuple(fields["steps"])
        fields["phase"] = Phase[fields["phase"]]
        fields["transitions"] = tuple(
            Transition(float(t["at"]), Phase[t["phase"]], Outcome(t["outcome"]), str(t.get("detail", "")))
            for t in fields.get("transitions", ())
        )
        return cls(**fields)


@dataclasses.dataclass(frozen=True, slots=True)
class History:
    """When this GPU (or node, for a node-scope fault) needed recovery before: ladders that tried a rung."""

    recoveries: tuple[float, ...] = ()

    def within(self, now: float, window_s: float) -> int:
        return sum(1 for ts in self.recoveries if now - window_s <= ts <= now)

    def record(self, state: LadderState, keep_s: float = 90 * 86400.0) -> History:
        """The history once ``state``'s ladder is counted (if it tried a rung); older than keep_s dropped."""
        if not state.attempted_recovery:
            return self
        now = state.updated_at or state.started_at
        kept = tuple(ts for ts in self.recoveries if now - ts <= keep_s)
        return History((*kept, state.started_at))

    def apart_from(self, started_at: float, episode_s: float) -> History:
        """Without the recoveries of the same fault episode (ladders started within ``episode_s`` of
        ``started_at``: one fault that fired several rules is one recovery, not a repeat)."""
        return History(tuple(ts for ts in self.recoveries if abs(ts - started_at) >= episode_s))

    def to_json(self) -> dict[str, Any]:
        return {"recoveries": list(self.recoveries)}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> History:
        return cls(tuple(float(ts) for ts in doc.get("recoveries", ())))


@dataclasses.dataclass(frozen=True, slots=True)
class Step:
    """What the shell does next, and the state to store before doing it."""

    kind: str
    """A ``StepKind``, or the rung's kind name."""
    state: LadderState
    reason: str
    not_before: float = 0.0
    """Do it no earlier than this (a refused reset is asked again later)."""
    deadline: float | None = None
    """Past this without an outcome, the shell reports ``Outcome.FAILED``."""
    dcgm_level: int = 0
    soak_s: float = 0.0


def start(
    ladder: recovery.Ladder,
    *,
    incident_id: str,
    node: str,
    gpu_uuid: str | None,
    gpu_index: int | None,
    now: float,
    port: str | None = None,
) -> Step:
    """A new ladder for an incident just opened: first, contain (the rule's own actions)."""
    state = LadderState(
        incident_id=incident_id,
        ladder_id=ladder.id,
        node=node,
        gpu_uuid=gpu_uuid,
        gpu_index=gpu_index,
        steps=ladder.steps,
        contact_support=ladder.contact_support,
        soak_s=ladder.soak_s,
        dcgm_level=ladder.dcgm_level,
        repeat_count=ladder.repeat_count,
        repeat_within_s=ladder.repeat_within_s,
        started_at=now,
        port=port,
        updated_at=now,
    )
    return Step(
        StepKind.CONTAIN, state, "contain first (drain / cordon and migrate)", deadline=now + CONTAIN_BUDGET_S
    )


def next_step(state: LadderState, outcome: Outcome, now: float, history: History, detail: str = "") -> Step:
    """The step after ``outcome`` of the current phase. Raises ValueError for an outcome the phase
    cannot have (a bug in the shell, never data)."""
    if state.finished:
        return Step(StepKind.NONE, state, f"ladder already finished ({state.phase.name.lower()})")
    if outcome is Outcome.STOPPED:
        stopped = _moved(state, Phase.STOPPED, outcome, now, detail)
        return Step(StepKind.NONE, stopped, f"stopped by an operator: {detail}" if detail else "stopped")
    if outcome not in expected(state.phase):
        raise ValueError(f"outcome {outcome.value!r} cannot follow phase {state.phase.name}")
    if state.phase is Phase.CONTAINING:
        if outcome is Outcome.RECOVERED:  # a replacement held by the node's domain, then it came back
            nxt = _moved(state, Phase.RETURNING, outcome, now, detail)
            why = "recovered on its own while its domain was suspected: returned without a replacement"
            return Step(StepKind.RETURN_TO_SERVICE, nxt, why, deadline=now + RETURN_BUDGET_S)
        reboot = next((i for i, s in enumerate(state.steps) if actions.spec(s).reboots), None)
        if outcome is Outcome.FAILED and reboot is not None:
            nxt = _moved(state, Phase.REBOOTING, outcome, now, detail, rung=reboot)
            why = "containment did not finish; a scheduler reboot drains by itself"
            return _rung_step(nxt, now, why)
        if outcome is Outcome.FAILED:
            return _replace(state, outcome, now, detail, "containment failed and no reboot rung is declared")
        if state.contact_support:
            return _replace(
                state, outcome, now, detail, "NVIDIA: contact support (no reset or reboot fixes this)"
            )
        before = history.within(now, state.repeat_within_s)
        if before + 1 >= state.repeat_count:
            days = state.repeat_within_s / 86400.0
            why = (
                f"recovery number {before + 1} of this GPU within {days:g} days (limit {state.repeat_count})"
            )
            return _replace(state, outcome, now, detail, why)
        first = _runnable(state, 0)
        if first is None:
            return _replace(
                state, outcome, now, detail, "no rung fits (reset_port needs the incident's port)"
            )
        return _rung_step(
            _moved(state, _rung_phase(state.steps[first]), outcome, now, detail, rung=first), now, ""
        )
    if state.phase in rung_phases():
        if outcome is Outcome.RECOVERED:
            held = state.steps[state.rung]
            nxt = _moved(state, Phase.RETURNING, outcome, now, detail, rung=state.rung - 1)  # it never ran
            why = f"recovered on its own while its domain was suspected: returned without {held}"
            return Step(StepKind.RETURN_TO_SERVICE, nxt, why, deadline=now + RETURN_BUDGET_S)
        if outcome is Outcome.DONE:
            nxt = _moved(state, Phase.VALIDATING, outcome, now, detail)
            return Step(
                StepKind.VALIDATE,
                nxt,
                f"validate after {state.steps[state.rung]}",
                deadline=now + state.soak_s + VALIDATE_MARGIN_S,
                dcgm_level=state.dcgm_level,
                soak_s=state.soak_s,
            )
        if outcome is Outcome.REFUSED and state.refusals + 1 < MAX_REFUSALS:
            nxt = dataclasses.replace(
                _moved(state, state.phase, outcome, now, detail, rung=state.rung), refusals=state.refusals + 1
            )
            return _rung_step(nxt, now + REFUSAL_RETRY_S, f"refused ({detail}); asking again")
        return _next_rung(state, outcome, now, detail)
    if state.phase is Phase.VALIDATING:
        if outcome is Outcome.PASSED:
            nxt = _moved(state, Phase.RETURNING, outcome, now, detail)
            return Step(StepKind.RETURN_TO_SERVICE, nxt, "validation passed", deadline=now + RETURN_BUDGET_S)
        return _next_rung(state, outcome, now, detail)
    # RETURNING
    if outcome is Outcome.RETURNED:
        return Step(StepKind.NONE, _moved(state, Phase.RETURNED, outcome, now, detail), "back in service")
    return _replace(state, outcome, now, detail, "the node could not be returned to service")


def plan(ladder: recovery.Ladder, port: str | None = None) -> tuple[str, ...]:
    """The whole ladder as dry-run shows it, one line per step (``port``: the incident's; without one,
    a ``reset_port`` rung is skipped)."""
    lines = ["contain (the rule's actions)"]
    if ladder.contact_support:
        return (*lines, "hardware_replacement (NVIDIA: contact support)")
    rungs = [r for r in ladder.steps if not actions.per_port(r) or port is not None]
    for i, rung in enumerate(rungs):
        on_fail = rungs[i + 1] if i + 1 < len(rungs) else str(StepKind.REPLACE)
        what = f"{rung} {port}" if actions.per_port(rung) else rung
        lines.append(f"{what} (refused or failed: {on_fail})")
        soak = f"{ladder.soak_s:g}s soak"
        dcgm = f", dcgmi diag -r {ladder.dcgm_level}" if ladder.dcgm_level else ""
        lines.append(f"validate ({soak}{dcgm}; pass: return_to_service, fail: {on_fail})")
    lines.append(
        f"hardware_replacement at once when this is the GPU's recovery number {ladder.repeat_count} "
        f"within {ladder.repeat_within_s / 86400.0:g} days"
    )
    return tuple(lines)


def evidence(
    state: LadderState,
    history: History,
    device: Mapping[str, str | None],
    triggering_events: Sequence[Mapping[str, Any]],
    telemetry_summary: Mapping[str, Any],
) -> dict[str, Any]:
    """The hardware_replacement incident's evidence bundle. ``device``: serial, uuid, board part number,
    VBIOS and driver versions as the agent read them; the rest as the controller holds it."""
    return {
        "node": state.node,
        "gpu_index": state.gpu_index,
        "gpu_uuid": state.gpu_uuid,
        "device": dict(device),
        "ladder": state.ladder_id,
        "steps_taken": [
            {"at": t.at, "phase": t.phase.name.lower(), "outcome": t.outcome.value, "detail": t.detail}
            for t in state.transitions
        ],
        "previous_recoveries": list(history.recoveries),
        "triggering_events": [dict(e) for e in triggering_events],
        "telemetry": dict(telemetry_summary),
    }


def _moved(
    state: LadderState, phase: Phase, outcome: Outcome, now: float, detail: str, rung: int | None = None
) -> LadderState:
    return dataclasses.replace(
        state,
        phase=phase,
        rung=state.rung if rung is None else rung,
        refusals=state.refusals if phase is state.phase else 0,
        updated_at=now,
        transitions=(*state.transitions, Transition(now, state.phase, outcome, detail)),
    )


def _runnable(state: LadderState, start: int) -> int | None:
    """The first rung from ``start`` on that fits the incident (``reset_port`` needs its port)."""
    for i in range(start, len(state.steps)):
        if not actions.per_port(state.steps[i]) or state.port is not None:
            return i
    return None


def _rung_step(state: LadderState, when: float, reason: str) -> Step:
    rung = state.steps[state.rung]
    spec = actions.spec(rung).rung
    budget = spec.budget_s if spec is not None else 0.0
    return Step(
        rung,
        state,
        reason or f"rung {state.rung + 1} of {len(state.steps)}: {rung}",
        not_before=when,
        deadline=when + budget,
    )


def _next_rung(state: LadderState, outcome: Outcome, now: float, detail: str) -> Step:
    nxt_rung = _runnable(state, state.rung + 1)
    if nxt_rung is None:
        what = state.steps[state.rung]
        back = f"port {state.port}" if state.port is not None else "the GPU"
        return _replace(state, outcome, now, detail, f"{what} did not bring {back} back ({outcome.value})")
    nxt = _moved(state, _rung_phase(state.steps[nxt_rung]), outcome, now, detail, rung=nxt_rung)
    why = f"{state.steps[state.rung]} {outcome.value}; next rung: {state.steps[nxt_rung]}"
    return _rung_step(nxt, now, why)


def _replace(state: LadderState, outcome: Outcome, now: float, detail: str, why: str) -> Step:
    return Step(StepKind.REPLACE, _moved(state, Phase.REPLACEMENT, outcome, now, detail), why)


# -- what the shell's actions came to, as outcomes ---------------------------------------------------
def containment(statuses: Sequence[str | None]) -> Outcome | None:
    """The rule's own actions (``statuses``: one per action, None while not run): CONTAINED when all
    went through, FAILED when one did not, None while some still run."""
    if any(s is not None and s not in incidents.OK for s in statuses):
        return Outcome.FAILED
    if any(s is None for s in statuses):
        return None
    return Outcome.CONTAINED


def outcome_of(kind: str, status: str) -> Outcome:
    """What a settled ladder action's status means for its step. ``skipped`` is a gate saying no for
    good (observe mode, a maintenance exclusion): the ladder stops there and leaves the node as it is;
    for the return to service it means the node was not healer's to return (or another incident still
    holds it): the GPU is back all the same."""
    if kind is StepKind.RETURN_TO_SERVICE:
        return Outcome.FAILED if status in incidents.FAILED else Outcome.RETURNED
    if status == incidents.ActionStatus.SKIPPED:
        return Outcome.STOPPED
    if kind is StepKind.VALIDATE:
        if status in incidents.TOOK_EFFECT:
            return Outcome.PASSED
        return (
            Outcome.VALIDATION_FAILED if status == incidents.ActionStatus.FAILED_PERMANENT else Outcome.FAILED
        )
    if status in incidents.OK:  # skipped was handled above
        return Outcome.DONE
    return Outcome.REFUSED if status == incidents.ActionStatus.REFUSED else Outcome.FAILED


def flat_evidence(doc: Mapping[str, Any]) -> dict[str, str | int | float | bool | None]:
    """An evidence bundle as incident evidence (flat, scalar values): nested mappings become dotted keys,
    lists their JSON text."""
    out: dict[str, str | int | float | bool | None] = {}
    for key, value in doc.items():
        if isinstance(value, Mapping):
            for k, v in flat_evidence(value).items():
                out[f"{key}.{k}"] = v
        elif isinstance(value, list | tuple):
            out[key] = json.dumps(value, default=str)[:4000]
        else:
            out[key] = value
    return out
