"""A simulated fleet's days of faults and recovery ladders, as the incident feed it would produce and as
the truth the report is checked against (#42, item 5: tests/archive/test_truth.py).

Faults are drawn at the ``realistic`` scenario's rates (healer/sim/scenarios/realistic.yaml, Llama 3's
Table 5) times ``rate_scale`` (so that a small fleet has dozens in a few days), for the kinds in
``RULE_OF``: six GPU kinds that a recovery ladder of the rule pack takes, and ``node_silent`` (a whole
node, no ladder: cordoned, back when its agent is, ``silent_s`` later). Each GPU fault walks the
controller's own ladder state machine (healer.controller.remediation.ladder) with the pack's declared
ladder and the GPU's history (the repeat limit), each rung succeeding with the simulator's recovery odds
(healer.sim.repair), as benchmarks/recovery_week.py does; a ladder that gives up leaves the GPU out
until a person replaces it, ``replace_s`` later. A fault that lands on a GPU already out of service
(its own, or its node's) is no new fault: it is not drawn.

The run gives two things that do not share code:

- the **truth**: each fault (kind, GPU, start, containment, back in service, how its ladder ended) and
  a per-minute map of which GPU was out of service (every time is a whole minute, so the map is exact);
- the **feed**: the incident events the controller publishes for those faults (opened, each action as
  it takes effect, escalated, resolved; a ``hardware-replacement`` incident when a ladder gives up),
  built with the schema's own builder, ending where the run ends.

What this does not exercise: the controller's detection (rules over telemetry) and its actuators; an
incident opens at the fault's minute. Those have their own end-to-end tests (tests/controller/).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterator, Mapping
from typing import Final

import numpy as np
import numpy.typing as npt

from healer import actions as action_kinds
from healer.controller.remediation import ladder
from healer.rules import recovery, ruleset
from healer.schemas import incidents
from healer.sim import repair

MINUTE: Final = 60.0
RULE_OF: Final[dict[str, str]] = {
    "ecc_dbe": "ecc-dbe-new",
    "row_remap_pending": "row-remap-pending",
    "uncontained_ecc": "xid-fatal",
    "gsp_timeout": "xid-reset-required",
    "fell_off_bus": "gpu-lost-event",
    "row_remap_failure": "row-remap-failure",
    "node_silent": "node-silent",
}
"""Each simulated fault kind and the rule of the pack (rules/) that opens its incident; one rule per kind,
so the report's rows are the simulator's kinds."""
NODE_KINDS: Final = frozenset({"node_silent"})
REPLACEMENT_RULE: Final = "hardware-replacement"
"""The controller's replacement incident (healer.controller.remediation.healing.REPLACEMENT_RULE)."""


@dataclasses.dataclass(frozen=True)
class Settings:
    nodes: int = 64
    gpus: int = 8
    days: int = 5
    seed: int = 1
    rate_scale: float = 200.0
    start: float = 1_796_083_200.0  # 2026-12-01 00:00 UTC
    contain_min: int = 10
    reset_min: int = 2
    validate_min: int = 12
    reboot_min: int = 15
    return_min: int = 1
    silent_min: int = 30
    replace_min: int = 48 * 60

    @property
    def end(self) -> float:
        return self.start + self.days * 86400.0

    @property
    def minutes(self) -> int:
        return self.days * 1440


@dataclasses.dataclass
class Fault:
    """One fault as the simulator knows it; times are unix seconds on whole minutes."""

    id: str
    kind: str
    node: int
    gpu: int | None
    start: float
    contained_at: float
    back_at: float
    """Back in service (or replaced): the end of its time out of service (may be past the run's end)."""
    outcome: str | None
    """How its ladder ended: ``recovered`` or ``hardware_replacement``; None without a ladder."""
    actions: list[tuple[str, str, float]]
    """(kind, status, when it took effect), in order."""
    replaced_from: float | None = None
    """When its ladder gave up and a replacement incident opened."""


@dataclasses.dataclass
class Run:
    settings: Settings
    faults: list[Fault]
    out: npt.NDArray[np.bool_]
    """[node, gpu, minute]: out of service during that minute of the run."""
    cause: npt.NDArray[np.int32]
    """[node, gpu, minute]: the index in ``faults`` of the first fault that took it out; -1: in service."""
    severity: dict[str, incidents.Severity]
    contain_kind: dict[str, str]

    def node_name(self, node: int) -> str:
        return f"sim{node:03d}"


def _draw(
    s: Settings, rates: Mapping[str, float], rng: np.random.Generator
) -> list[tuple[int, str, int, int]]:
    """(minute, kind, node, gpu) of every drawn fault, in time order."""
    hours = s.nodes * s.gpus * s.days * 24
    drawn = []
    for kind in sorted(RULE_OF):
        n = int(rng.poisson(rates[kind] * s.rate_scale * hours))
        minutes = rng.integers(0, s.minutes, n)
        nodes, gpus = rng.integers(0, s.nodes, n), rng.integers(0, s.gpus, n)
        drawn += [(int(m), kind, int(nd), int(g)) for m, nd, g in zip(minutes, nodes, gpus, strict=True)]
    return sorted(drawn)


def _walk(
    s: Settings, lad: recovery.Ladder, kind: str, t: float, history: ladder.History, rng: np.random.Generator
) -> tuple[Fault, ladder.LadderState]:
    """One GPU fault through the ladder, minute by minute of its rungs."""
    actions: list[tuple[str, str, float]] = []
    step = ladder.start(lad, incident_id="i", node="n", gpu_uuid=None, gpu_index=0, now=t)
    start, t = t, t + s.contain_min * MINUTE
    contained = t
    step = ladder.next_step(step.state, ladder.Outcome.CONTAINED, t, history)
    fixed = False
    while step.kind not in (ladder.StepKind.NONE, ladder.StepKind.REPLACE):
        status = incidents.ActionStatus.DONE
        if step.kind in action_kinds.RUNGS and action_kinds.spec(step.kind).reboots:
            t += s.reboot_min * MINUTE
            fixed, outcome = repair.fixed_by(kind, step.kind, rng), ladder.Outcome.DONE
        elif step.kind in action_kinds.RUNGS:  # a GPU reset: the ladders here never reach a port's
            t += s.reset_min * MINUTE
            if repair.MODEL[kind].reset == 0.0:  # a lost GPU: the reset itself fails
                status, outcome = incidents.ActionStatus.FAILED_PERMANENT, ladder.Outcome.FAILED
            else:
                fixed, outcome = repair.fixed_by(kind, step.kind, rng), ladder.Outcome.DONE
        elif step.kind is ladder.StepKind.VALIDATE:
            t += s.validate_min * MINUTE
            outcome = ladder.Outcome.PASSED if fixed else ladder.Outcome.VALIDATION_FAILED
            if not fixed:
                status = incidents.ActionStatus.FAILED_PERMANENT
        else:  # RETURN_TO_SERVICE
            t += s.return_min * MINUTE
            outcome = ladder.Outcome.RETURNED
        actions.append((str(step.kind), status.value, t))
        step = ladder.next_step(step.state, outcome, t, history)
    replaced = step.kind is ladder.StepKind.REPLACE
    fault = Fault(
        id="", kind=kind, node=0, gpu=0, start=start, contained_at=contained,
        back_at=t + s.replace_min * MINUTE if replaced else t,
        outcome="hardware_replacement" if replaced else "recovered", actions=actions,
        replaced_from=t if replaced else None,
    )  # fmt: skip
    return fault, step.state


def simulate(
    s: Settings,
    rates: Mapping[str, float],
    ladders: Mapping[str, recovery.Ladder],
    rules: Mapping[str, ruleset.Rule],
) -> Run:
    """The run: ``rates`` per GPU-hour by kind, the pack's ``ladders`` by id, its ``rules`` by id (for
    each rule's severity and first, containing, action)."""
    rng, luck = np.random.default_rng(s.seed), np.random.default_rng(s.seed + 1)
    out = np.zeros((s.nodes, s.gpus, s.minutes), dtype=bool)
    cause = np.full((s.nodes, s.gpus, s.minutes), -1, dtype=np.int32)
    histories: dict[tuple[int, int], ladder.History] = collections.defaultdict(ladder.History)
    faults: list[Fault] = []
    for minute, kind, node, gpu in _draw(s, rates, rng):
        t = s.start + minute * MINUTE
        if kind in NODE_KINDS:
            if out[node, :, minute].all():
                continue
            back = t + s.silent_min * MINUTE
            fault = Fault("", kind, node, None, t, t + s.contain_min * MINUTE, back, None, [])
            span: tuple[int | slice, ...] = (node, slice(None), slice(minute, minute + s.silent_min))
        else:
            if out[node, gpu, minute]:
                continue
            lad = ladders[str(repair.MODEL[kind].ladder)]
            fault, state = _walk(s, lad, kind, t, histories[(node, gpu)], luck)
            histories[(node, gpu)] = histories[(node, gpu)].record(state)
            fault.node, fault.gpu = node, gpu
            span = (node, gpu, slice(minute, minute + round((fault.back_at - t) / MINUTE)))
        out[span] = True
        cause[span] = np.where(cause[span] < 0, len(faults), cause[span])
        fault.id = f"inc-sim-{len(faults):04d}"
        faults.append(fault)
    wanted = set(RULE_OF.values())
    severity = {rid: r.severity for rid, r in rules.items() if rid in wanted}
    contain = {rid: r.actions[0].kind for rid, r in rules.items() if rid in wanted}
    return Run(s, faults, out, cause, severity, contain)


def _data(
    run: Run,
    f: Fault,
    state: incidents.IncidentState,
    done: list[tuple[str, str, float]] | None,
    **evidence: str,
) -> incidents.IncidentData:
    """The incident's data; ``done``: the ladder's actions so far after its containment (None: not even
    contained yet)."""
    rule = RULE_OF[f.kind]
    first = [] if done is None else [(run.contain_kind[rule], "done", f.contained_at)]
    done = done or []
    acts = [incidents.ActionRecord(kind=k, status=st, at=at) for k, st, at in first + done]
    return incidents.IncidentData(
        incident_id=f.id, rule_id=rule, severity=run.severity[rule], node=run.node_name(f.node),
        gpu_index=f.gpu, state=state, summary=f"{f.kind} on {run.node_name(f.node)}", actions=acts,
        evidence={**evidence, **({"gpus_expected": run.settings.gpus} if f.gpu is None else {})},
        mode=incidents.Mode.ENFORCE,
    )  # fmt: skip


def _fault_events(run: Run, f: Fault) -> Iterator[tuple[float, incidents.Change, incidents.IncidentData]]:
    lad = {} if f.outcome is None else {"ladder": str(repair.MODEL[f.kind].ladder)}
    yield f.start, incidents.Change.OPENED, _data(run, f, incidents.IncidentState.OPEN, None, **lad)
    own = f.actions
    yield f.contained_at, incidents.Change.ACTION, _data(run, f, incidents.IncidentState.OPEN, [], **lad)
    for n, (_, _, at) in enumerate(own, 1):
        yield at, incidents.Change.ACTION, _data(run, f, incidents.IncidentState.OPEN, own[:n], **lad)
    ended = {**lad, "outcome": f.outcome} if f.outcome is not None else lad
    if f.replaced_from is not None:
        yield (
            f.replaced_from,
            incidents.Change.ESCALATED,
            _data(run, f, incidents.IncidentState.ESCALATED, own, **ended),
        )
        rep = incidents.IncidentData(
            incident_id=f"{f.id}-rep", rule_id=REPLACEMENT_RULE, severity="critical",
            node=run.node_name(f.node), gpu_index=f.gpu, state="escalated", summary="hardware replacement",
            evidence={"incident": f.id}, mode=incidents.Mode.ENFORCE,
            actions=[incidents.ActionRecord(kind="hardware_replacement", status="done", at=f.replaced_from)],
        )  # fmt: skip
        yield f.replaced_from, incidents.Change.OPENED, rep
        yield (
            f.back_at,
            incidents.Change.RESOLVED,
            rep.model_copy(update={"state": incidents.IncidentState.RESOLVED}),
        )
    yield f.back_at, incidents.Change.RESOLVED, _data(run, f, incidents.IncidentState.RESOLVED, own, **ended)


def feed(run: Run, cluster: str = "sim") -> list[incidents.IncidentEvent]:
    """The incident events of the run, in time order, up to its end (later ones have not happened)."""
    out = []
    for f in run.faults:
        for k, (ts, change, data) in enumerate(_fault_events(run, f)):
            if ts < run.settings.end:
                event_id = f"{data.incident_id}.{k}"
                out.append((ts, event_id, incidents.build(
                    event_id=event_id, cluster=cluster, change=change, data=data, ts=ts)))  # fmt: skip
    return [ev for _, _, ev in sorted(out, key=lambda x: (x[0], x[1]))]


def gpu_hours_out(run: Run) -> float:
    """The truth: GPU-minutes out of service in the run, from the per-minute map, in hours."""
    return float(run.out.sum()) / 60.0


def gpu_hours_by_kind(run: Run) -> dict[str, float]:
    """The truth by cause: GPU-hours out of service by the kind of the first fault that took each GPU out."""
    counts = np.bincount(run.cause[run.cause >= 0], minlength=len(run.faults))
    out: dict[str, float] = collections.defaultdict(float)
    for f, minutes in zip(run.faults, counts, strict=True):
        out[f.kind] += float(minutes) / 60.0
    return dict(out)


def gpu_hours_by_day(run: Run) -> dict[int, float]:
    """GPU-hours out of service per day of the run (0 = its first UTC day)."""
    per_minute = run.out.sum(axis=(0, 1))
    return {d: float(per_minute[d * 1440 : (d + 1) * 1440].sum()) / 60.0 for d in range(run.settings.days)}


def gpu_hours_contained(run: Run) -> dict[str, float]:
    """The truth by what the scheduler did: of each GPU-minute out of service, whether the fault that took
    the GPU out first (``cause``) was contained by then, and by which kind of its rule's first action;
    the key "" for the minutes before containment."""
    cause = run.cause[run.cause >= 0]
    minute = np.nonzero(run.cause >= 0)[2]
    contained = np.array([(f.contained_at - run.settings.start) / MINUTE for f in run.faults])
    before = minute < contained[cause]
    out: dict[str, float] = {"": float(before.sum()) / 60.0}
    after = np.bincount(cause[~before], minlength=len(run.faults))
    for f, minutes in zip(run.faults, after, strict=True):
        kind = run.contain_kind[RULE_OF[f.kind]]
        out[kind] = out.get(kind, 0.0) + float(minutes) / 60.0
    return out
