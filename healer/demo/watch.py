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
from typing import Any

from healer.rules import actions
from healer.schemas import incidents, telemetry

BREAKER_RULE = "circuit-breaker"
SHARED_CAUSE_RULE = "shared-cause"
STRAGGLER_RULE = "gpu-straggler"
"""The fail-slow incident (#28): its line names the job and the cause."""
"""A domain's incident (#27): node ``<key>.<value>``, matched to no single fault, so never unexpected."""
OK = incidents.TOOK_EFFECT
RESTORES = frozenset(k.reversible_by for k in actions.CATALOG.values() if k.caps_power)
"""The kinds that undo a power cap (``restore_power_limit``)."""
INFORM_ONLY = ("notify",)
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
    state: str
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


class Observer:
    def __init__(self, t0: float) -> None:
        self.t0 = t0
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
        self._new_lines: list[tuple[float, str]] = []

    # -- inputs ------------------------------------------------------------------------------------
    def on_frame(self, frame: telemetry.NodeFrame) -> None:
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
        if change == "opened":
            self._say(at, f"incident opened: {d.rule_id} ({d.severity}) on {where}{_straggler(d)}")
        elif change == "resolved":
            inc.resolved_at = at
            self._say(at, f"incident resolved: {d.rule_id} on {where}")
        elif change == "escalated":
            if d.rule_id == BREAKER_RULE:
                self.breaker = {"open": True, "at": at, "reason": d.summary}
                self._say(at, f"CIRCUIT BREAKER OPEN: {d.summary}")
            else:
                self._say(at, f"incident escalated: {d.rule_id} on {where}")
        for i, a in enumerate(d.actions):
            if (d.incident_id, i) in self._seen_actions:
                continue
            self._seen_actions.add((d.incident_id, i))
            self.actions.append(
                Action(a.at, d.incident_id, d.rule_id, d.node, d.gpu_index, a.kind, a.status, a.detail)
            )
            self._say(a.at, f"action {a.kind} on {where}: {a.status} ({d.rule_id}) {a.detail}".rstrip())

    def _say(self, at: float, line: str) -> None:
        self.log.append((at, line))
        self._new_lines.append((at, line))

    def take_lines(self) -> list[tuple[float, str]]:
        out, self._new_lines = self._new_lines, []
        return out

    # -- views -------------------------------------------------------------------------------------
    def open_incidents(self) -> list[Incident]:
        return sorted(
            (i for i in self.incidents.values() if i.state != "resolved" and i.rule_id != BREAKER_RULE),
            key=lambda i: i.opened_at,
        )

    def cordoned(self) -> list[str]:
        nodes = {a.node for a in self.actions if a.kind in actions.TAKES_OUT_OF_SERVICE and a.status in OK}
        back = ("uncordon", "return_to_service")
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
                    "resolved": bool(incs) and all(i.state == "resolved" for i in incs),
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
            if i.id not in matched and i.rule_id not in (BREAKER_RULE, SHARED_CAUSE_RULE)
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
                "resolved": sum(1 for i in self.incidents.values() if i.state == "resolved"),
                "unexpected": sorted(unexpected),
            },
            "actions": dict(sorted(by_kind.items())),
            "cordoned_nodes": self.cordoned(),
            "breaker": self.breaker,
            "domain_incidents": self.domain_incidents(),
            "story": self.story(rows),
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
                i.state == "resolved" and any(a.kind in RESTORES and a.status in OK for a in i.actions)
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
        }
