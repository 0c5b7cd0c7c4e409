"""What the demo watches: the fleet's frames, the incident feed and the simulator's ground truth.

The Observer only reads what any outside system could read (telemetry on ``healer.telemetry.>``, the
CloudEvents on ``healer.incidents.>``) plus the simulator's truth records, and from them keeps the state
the live view draws and the summary the run ends with: each injected fault, the incidents opened on its
node (or GPU), the first action taken for it and the latency from the moment the fault became visible in
telemetry (truth ``visible_at``) to that action.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Container
from typing import Any

from healer import actions
from healer.schemas import incidents, telemetry

BREAKER_RULE = "circuit-breaker"
SHARED_CAUSE_RULE = "shared-cause"
"""A domain's incident (#27): node ``<key>.<value>``, matched to no single fault, so never unexpected."""
STRAGGLER_RULE = "gpu-straggler"
"""The fail-slow incident (#28): its line names the job and the cause."""
POWER_RULE = "power-budget"
"""A domain's power-budget incident (#30): one per cap episode, its per-GPU limits as actions; matched to
no fault (the rack's jobs ramping is the story, not a fault), so never unexpected."""
OK = incidents.TOOK_EFFECT
RESTORES = actions.View(
    lambda: (k.reversible_by for k in actions.CATALOG.values() if k.caps_power and k.reversible_by)
)
"""The kinds that undo a power cap (``restore_power_limit``)."""
CAPS = actions.kinds_where(lambda k: k.caps_power)
"""The kinds that cap a GPU's power (``power_limit``)."""
INFORM_ONLY = actions.kinds_where(lambda k: k.published_only)
"""Actions that change nothing: not counted as the first action on a fault."""


@dataclasses.dataclass
class Gpu:
    node: str
    index: int
    temp_c: float
    power_w: float
    limit_w: float
    default_w: float


@dataclasses.dataclass
class Incident:
    id: str
    rule_id: str
    severity: str
    node: str
    gpu: int | None
    state: incidents.IncidentState
    summary: str
    opened_at: float
    resolved_at: float | None = None
    actions: list[incidents.ActionRecord] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Action:
    at: float
    incident_id: str
    rule_id: str
    node: str
    gpu: int | None
    kind: str
    status: str
    detail: str


@dataclasses.dataclass
class Fault:
    id: str
    kind: str
    node: str
    gpu: int | None
    start: float
    visible_at: float


def _power(d: incidents.IncidentData) -> str:
    """ " - drew X kW against a budget of Y kW" (a power-budget incident), else ""."""
    ev = d.evidence
    if d.rule_id != POWER_RULE or "draw_w" not in ev:
        return ""
    return (
        f" - drew {float(ev['draw_w'] or 0) / 1000:.1f} kW against a budget of"
        f" {float(ev.get('budget_in_force_w') or 0) / 1000:.1f} kW, {ev.get('capped_gpus')} GPUs to cap"
    )


def _straggler(d: incidents.IncidentData) -> str:
    """ " - job J, clock N % below the median of its job's P GPUs, cause C" (a straggler), else ""."""
    ev = d.evidence
    if d.rule_id != STRAGGLER_RULE or "straggler.job" not in ev:
        return ""
    out = f" - job {ev['straggler.job']}"
    if "straggler.clock_deficit_pct" in ev:
        out += f", clock {ev['straggler.clock_deficit_pct']} % below"
        peers = ev.get("straggler.peers")
        out += f" the median of its job's {peers} GPUs" if peers is not None else " its own history"
    if ev.get("straggler.cause"):
        out += f", cause {ev['straggler.cause']}"
    return out


@dataclasses.dataclass
class PowerWatch:
    """The power story's rack (#30): its members' summed GPU power from their frames, against its budget."""

    domain: str
    members: frozenset[str]
    budget_w: float
    draw: dict[str, float] = dataclasses.field(default_factory=dict)
    """Each member's GPUs' summed power in its newest frame."""
    peak_w: float = 0.0
    over_at: float | None = None
    """The first frame in which the rack drew more than its budget."""
    under_at: float | None = None
    """The first frame after that in which it drew its budget or less."""
    jobs_started_at: float | None = None
    jobs_ended_at: float | None = None

    def total(self) -> float:
        return sum(self.draw.values())

    def on_frame(self, frame: telemetry.NodeFrame) -> None:
        if frame.node not in self.members:
            return
        self.draw[frame.node] = sum(g.power_w or 0.0 for g in frame.gpus)
        if len(self.draw) < len(self.members):
            return
        total = self.total()
        self.peak_w = max(self.peak_w, total)
        if total > self.budget_w and self.over_at is None:
            self.over_at = frame.ts
        elif total <= self.budget_w and self.over_at is not None and self.under_at is None:
            self.under_at = frame.ts


class Observer:
    def __init__(self, t0: float, power: PowerWatch | None = None) -> None:
        self.t0 = t0
        self.power = power
        self.frames = 0
        self.frame_nodes: dict[str, float] = {}
        self.gpus: dict[tuple[str, int], Gpu] = {}
        self.gpus_expected: dict[str, int] = {}
        self.incidents: dict[str, Incident] = {}
        self.actions: list[Action] = []
        self.faults: list[Fault] = []
        self.log: collections.deque[tuple[float, str]] = collections.deque(maxlen=200)
        self.breaker: dict[str, Any] = {"open": False}
        self.feed_events = 0
        self._seen_actions: set[tuple[str, int]] = set()
        self._power_step: dict[str, list[incidents.ActionRecord]] = {}
        """A power-budget incident's actions settled since its last line (printed at its next change)."""
        self._new_lines: list[tuple[float, str]] = []

    # -- inputs ------------------------------------------------------------------------------------
    def on_frame(self, frame: telemetry.NodeFrame) -> None:
        if self.power is not None:
            over, under = self.power.over_at, self.power.under_at
            self.power.on_frame(frame)
            p = self.power
            if over is None and p.over_at is not None:
                self._say(
                    p.over_at,
                    f"{p.domain} over its power budget: {p.total() / 1000:.1f} kW"
                    f" of {p.budget_w / 1000:.1f} kW",
                )
            if under is None and p.under_at is not None and p.over_at is not None:
                self._say(
                    p.under_at,
                    f"{p.domain} back under its power budget {p.under_at - p.over_at:.0f} s after going over:"
                    f" {p.total() / 1000:.1f} kW of {p.budget_w / 1000:.1f} kW, no job stopped",
                )
        self.frames += 1
        self.frame_nodes[frame.node] = frame.ts
        self.gpus_expected[frame.node] = frame.gpus_expected or len(frame.gpus)
        for g in frame.gpus:
            self.gpus[(frame.node, g.index)] = Gpu(
                frame.node,
                g.index,
                g.temp_c or 0.0,
                g.power_w or 0.0,
                g.power_limit_w or 0.0,
                g.power_default_w or 0.0,
            )

    def note(self, at: float, line: str) -> None:
        """A line of the story that is no fault (the power story's jobs starting and ending)."""
        self._say(at, line)

    def on_truth(self, records: list[dict[str, Any]]) -> None:
        for r in records:
            f = Fault(r["id"], r["kind"], r["node"], r["gpu"], float(r["start"]), float(r["visible_at"]))
            self.faults.append(f)
            where = f.node + (f" GPU {f.gpu}" if f.gpu is not None else "")
            self._say(f.start, f"fault injected: {f.kind} on {where}")

    def on_incident(self, ev: incidents.IncidentEvent) -> None:
        self.feed_events += 1
        d = ev.data
        at = ev.time.timestamp()
        inc = self.incidents.get(d.incident_id)
        if inc is None:
            inc = Incident(d.incident_id, d.rule_id, d.severity, d.node, d.gpu_index, d.state, d.summary, at)
            self.incidents[d.incident_id] = inc
        inc.state, inc.summary, inc.actions = d.state, d.summary, list(d.actions)
        where = d.node + (f" GPU {d.gpu_index}" if d.gpu_index is not None else "")
        change = ev.change
        if d.rule_id == POWER_RULE and change in (incidents.Change.OPENED, incidents.Change.UPDATED):
            self._flush_power(d.incident_id, where)  # the step before is settled: a new one or its cost
        if change is incidents.Change.OPENED:
            self._say(at, f"incident opened: {d.rule_id} ({d.severity}) on {where}{_straggler(d)}{_power(d)}")
        elif change is incidents.Change.RESOLVED:
            inc.resolved_at = at
            self._say(at, f"incident resolved: {d.rule_id} on {where}")
        elif change is incidents.Change.ESCALATED:
            if d.rule_id == BREAKER_RULE:
                self.breaker = {"open": True, "at": at, "reason": d.summary}
                self._say(at, f"CIRCUIT BREAKER OPEN: {d.summary}")
            else:
                self._say(at, f"incident escalated: {d.rule_id} on {where}")
        elif (
            change is incidents.Change.UPDATED
            and d.rule_id == POWER_RULE
            and "sm_clock_after_mhz" in d.evidence
        ):
            ev_ = d.evidence
            self._say(
                at,
                f"{where}: the step's limits hold, drawing"
                f" {float(ev_.get('draw_after_w') or 0) / 1000:.1f} kW"
                f" of {float(ev_.get('budget_in_force_w') or 0) / 1000:.1f} kW; SM clock"
                f" {ev_.get('sm_clock_before_mhz')} -> {ev_.get('sm_clock_after_mhz')} MHz",
            )
        fresh = []
        for i, a in enumerate(d.actions):
            if (d.incident_id, i) in self._seen_actions:
                continue
            self._seen_actions.add((d.incident_id, i))
            self.actions.append(
                Action(a.at, d.incident_id, d.rule_id, d.node, d.gpu_index, a.kind, a.status, a.detail)
            )
            fresh.append(a)
            if d.rule_id != POWER_RULE:  # a domain's per-GPU limits: one line per step, below
                self._say(a.at, f"action {a.kind} on {where}: {a.status} ({d.rule_id}) {a.detail}".rstrip())
        if d.rule_id == POWER_RULE:
            self._power_step.setdefault(d.incident_id, []).extend(fresh)
            if change is incidents.Change.RESOLVED:
                self._flush_power(d.incident_id, where)

    def _flush_power(self, incident_id: str, where: str) -> None:
        """One line for a power-budget step's per-GPU limits (a domain's step can be 64 actions)."""
        step = self._power_step.get(incident_id)
        if step:
            kinds = collections.Counter(f"{a.kind} {a.status}" for a in step)
            line = ", ".join(f"{n} x {k}" for k, n in sorted(kinds.items()))
            self._say(step[-1].at, f"actions on {where}: {line}")
            step.clear()

    def _say(self, at: float, line: str) -> None:
        self.log.append((at, line))
        self._new_lines.append((at, line))

    def take_lines(self) -> list[tuple[float, str]]:
        out, self._new_lines = self._new_lines, []
        return out

    # -- views -------------------------------------------------------------------------------------
    def open_incidents(self) -> list[Incident]:
        return sorted(
            (
                i
                for i in self.incidents.values()
                if i.state != incidents.IncidentState.RESOLVED and i.rule_id != BREAKER_RULE
            ),
            key=lambda i: i.opened_at,
        )

    def cordoned(self) -> list[str]:
        nodes = {a.node for a in self.actions if a.kind in actions.TAKES_OUT_OF_SERVICE and a.status in OK}
        back = actions.kinds_where(lambda k: k.undoes_cordon)
        nodes -= {a.node for a in self.actions if a.kind in back and a.status in OK}
        return sorted(nodes)

    def capped(self) -> list[Gpu]:
        return [g for g in self.gpus.values() if g.default_w and g.limit_w < g.default_w - 0.5]

    def hottest(self, n: int = 5) -> list[Gpu]:
        return sorted(self.gpus.values(), key=lambda g: -g.temp_c)[:n]

    def silent_nodes(self, now: float, after_s: float = 5.0) -> list[str]:
        return sorted(n for n, ts in self.frame_nodes.items() if now - ts > after_s)

    # -- the summary -------------------------------------------------------------------------------
    def domain_incidents(self) -> list[dict[str, Any]]:
        """The shared-cause incidents (#27): one per suspected domain, e.g. a rack that lost power."""
        return [
            {"node": i.node, "state": i.state, "summary": i.summary}
            for i in self.incidents.values()
            if i.rule_id == SHARED_CAUSE_RULE
        ]

    def _matches(self, f: Fault, node: str, gpu: int | None, at: float) -> bool:
        return node == f.node and (f.gpu is None or gpu is None or gpu == f.gpu) and at >= f.start - 1.0

    def fault_rows(self) -> list[dict[str, Any]]:
        rows = []
        for f in sorted(self.faults, key=lambda f: (f.start, f.node)):
            incs = [i for i in self.incidents.values() if self._matches(f, i.node, i.gpu, i.opened_at)]
            acts = sorted(
                (a for a in self.actions if a.incident_id in {i.id for i in incs}), key=lambda a: a.at
            )
            done = [a for a in acts if a.status in OK and a.kind not in INFORM_ONLY]
            first = done[0] if done else None
            rows.append(
                {
                    "id": f.id,
                    "kind": f.kind,
                    "node": f.node,
                    "gpu": f.gpu,
                    "t_start_s": round(f.start - self.t0, 1),
                    "t_visible_s": round(f.visible_at - self.t0, 1),
                    "detected": bool(incs),
                    "rules": sorted({i.rule_id for i in incs}),
                    "t_detected_s": round(min(i.opened_at for i in incs) - self.t0, 1) if incs else None,
                    "first_action": f"{first.kind}:{first.status}" if first else None,
                    "latency_to_action_s": round(first.at - f.visible_at, 1) if first else None,
                    "actions": [f"{a.kind}:{a.status}" for a in acts],
                    "resolved": bool(incs) and all(i.state == incidents.IncidentState.RESOLVED for i in incs),
                }
            )
        return rows

    def summary(self, *, duration_s: float, nodes: int, gpus: int, interrupted: bool) -> dict[str, Any]:
        rows = self.fault_rows()
        by_kind: dict[str, int] = collections.Counter(f"{a.kind}:{a.status}" for a in self.actions)
        latencies = [r["latency_to_action_s"] for r in rows if r["latency_to_action_s"] is not None]
        matched = {
            i.id
            for f in self.faults
            for i in self.incidents.values()
            if self._matches(f, i.node, i.gpu, i.opened_at)
        }
        unexpected = [
            f"{i.rule_id} on {i.node}" + (f" GPU {i.gpu}" if i.gpu is not None else "")
            for i in self.incidents.values()
            if i.id not in matched and i.rule_id not in (BREAKER_RULE, SHARED_CAUSE_RULE, POWER_RULE)
        ]
        return {
            "fleet": {"nodes": nodes, "gpus": nodes * gpus},
            "duration_s": round(duration_s, 1),
            "interrupted": interrupted,
            "frames": self.frames,
            "faults_injected": len(self.faults),
            "faults_detected": sum(1 for r in rows if r["detected"]),
            "faults_acted_on": sum(1 for r in rows if r["first_action"]),
            "latency_to_action_s": {
                "min": min(latencies) if latencies else None,
                "max": max(latencies) if latencies else None,
            },
            "faults": rows,
            "incidents": {
                "opened": sum(1 for i in self.incidents.values() if i.rule_id != BREAKER_RULE),
                "resolved": sum(
                    1 for i in self.incidents.values() if i.state == incidents.IncidentState.RESOLVED
                ),
                "unexpected": sorted(unexpected),
            },
            "actions": dict(sorted(by_kind.items())),
            "cordoned_nodes": self.cordoned(),
            "breaker": self.breaker,
            "domain_incidents": self.domain_incidents(),
            **({"power": self.power_summary()} if self.power is not None else {}),
            "story": self.story(rows),
        }

    def power_incidents(self) -> list[Incident]:
        return [i for i in self.incidents.values() if i.rule_id == POWER_RULE]

    def power_summary(self) -> dict[str, Any]:
        """The power story (#30): when the rack went over, when it was back under, when it was restored."""
        p = self.power
        assert p is not None
        incs = self.power_incidents()

        def rel(t: float | None) -> float | None:
            return None if t is None else round(t - self.t0, 1)

        resolved = [i.resolved_at for i in incs if i.resolved_at is not None]
        return {
            "domain": p.domain,
            "budget_kw": round(p.budget_w / 1000, 2),
            "peak_kw": round(p.peak_w / 1000, 2),
            "jobs_started_s": rel(p.jobs_started_at),
            "over_budget_s": rel(p.over_at),
            "under_budget_s": rel(p.under_at),
            "under_within_s": None
            if p.under_at is None or p.over_at is None
            else round(p.under_at - p.over_at, 1),
            "jobs_ended_s": rel(p.jobs_ended_at),
            "restored_s": rel(max(resolved)) if resolved else None,
            "episodes": len(incs),
        }

    def story(self, rows: list[dict[str, Any]]) -> dict[str, bool]:
        """The steps the demo promises, each true only if the feed shows it happened."""

        def row(kind: str) -> list[dict[str, Any]]:
            return [r for r in rows if r["kind"] == kind]

        def did(r: dict[str, Any], kind: str) -> bool:
            return any(f"{kind}:{status}" in r["actions"] for status in OK)

        def has(rs: list[dict[str, Any]], *kinds: str) -> bool:
            return bool(rs) and all(all(did(r, k) for k in kinds) for r in rs)

        def anyhas(rs: list[dict[str, Any]], *kinds: str) -> bool:
            return any(all(did(r, k) for k in kinds) for r in rs)

        hot = row("cooling_degradation")
        hot_incidents = [
            i
            for f in self.faults
            if f.kind == "cooling_degradation"
            for i in self.incidents.values()
            if self._matches(f, i.node, i.gpu, i.opened_at)
        ]
        return {
            "overheat_capped": anyhas(hot, "power_limit"),
            "overheat_resolved_and_restored": any(
                i.state == incidents.IncidentState.RESOLVED
                and any(a.kind in RESTORES and a.status in OK for a in i.actions)
                for i in hot_incidents
            ),
            "dbe_cordoned_and_migrated": has(row("ecc_dbe"), "cordon", "migrate"),
            "dbe_reset_validated_returned": anyhas(
                row("ecc_dbe"), "reset_gpu", "validate", "return_to_service"
            ),
            "nvlink_cordoned": has(row("nvlink_crc_rising"), "cordon"),
            "silent_node_cordoned": has(row("node_silent"), "cordon"),
            "rack_power_loss_one_incident": [d["node"][:5] for d in self.domain_incidents()] == ["rack."],
            "straggler_named_and_drained": bool(row("clock_limit"))
            and all(STRAGGLER_RULE in r["rules"] for r in row("clock_limit"))
            and has(row("clock_limit"), "cordon"),
            "breaker_tripped": bool(self.breaker.get("open")),
            **(self.power_story() if self.power is not None else {}),
        }

    def power_story(self) -> dict[str, bool]:
        """The power story's steps (only when the demo has one), each true only if the feed (and the
        rack's frames) show it."""
        p = self.power
        assert p is not None
        incs = self.power_incidents()
        members = p.members

        def done(i: Incident, kinds: Container[str]) -> bool:
            return any(a.kind in kinds and a.status in OK for a in i.actions)

        stopped = [
            a
            for a in self.actions
            if a.node in members and a.kind in actions.TAKES_OUT_OF_SERVICE and a.status in OK
        ]
        return {
            "rack_over_budget_capped": any(done(i, CAPS) for i in incs),
            "rack_under_budget_no_job_stopped": p.under_at is not None and bool(incs) and not stopped,
            "rack_restored_when_load_fell": any(
                i.state == incidents.IncidentState.RESOLVED and done(i, RESTORES) for i in incs
            ),
        }
