"""The report's figures, read from the archive: ``healer report`` (docs/archive.md defines each one).

``build`` takes the archive, the window's end and length and a few settings, and returns the report as
plain data (schema ``healer.report.v1``), which ``healer report --json`` prints and ``page`` draws. It
reads, never writes; every assumption it makes (a node's GPU count, the fleet's size) is stated in the
report's ``assumptions``.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import sqlite3
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any, Final

import orjson

from healer.archive import breakdown, store
from healer.schemas import incidents, verdicts

SCHEMA: Final = "healer.report.v1"
BREAKER_RULE: Final = "circuit-breaker"
"""The circuit breaker's incidents (docs/events.md): trips, not faults; no capacity of their own."""
SHARED_CAUSE_RULE: Final = "shared-cause"
"""A shared-cause domain incident (docs/controller.md): its members are incidents of their own."""
NOT_FAULTS: Final = frozenset({BREAKER_RULE, SHARED_CAUSE_RULE, breakdown.POWER_RULE})
"""Incidents that are no fault of their own: no incident of the window, no GPU-hours (a power budget's
GPUs are capped, not out of service); each is listed on its own."""
REPLACEMENT_RULE: Final = "hardware-replacement"
"""A recovery ladder's hardware replacement (docs/remediation.md): a follow-up of a fault incident (its
``evidence.incident``), not a fault of its own. Listed per rule, and its time is out of service, but it
counts neither as an incident of the window nor toward repeat offenders or repair times."""
FOLLOW_UPS: Final = frozenset({REPLACEMENT_RULE})
NODE_GPU_KEYS: Final = ("gpus_expected", "gpu_count")
"""Evidence values that give a node's GPU count, first found wins."""
SEVERITY_WEIGHT: Final[dict[str, float]] = {
    name: level.rank / max(lv.rank for lv in incidents.SEVERITY_LEVELS.values())
    for name, level in incidents.SEVERITY_LEVELS.items()
}
"""An incident's weight in the fleet health score: its severity's rank over the highest rank (info 0,
warning 1/3, major 2/3, critical 1)."""
DAY_S: Final = 86400.0


@dataclasses.dataclass(frozen=True)
class Options:
    end: float
    """The window's end (unix seconds): now, normally."""
    since_s: float
    """The window's length."""
    fleet_gpus: int | None = None
    """GPUs in the fleet; None: the nodes the archive has seen times ``node_gpus``."""
    node_gpus: int = 8
    """A node's GPU count when its incident's evidence does not give one."""
    repeat_threshold: int = 3
    repeat_window_s: float = 30 * DAY_S
    group_by: tuple[str, ...] = ("pool", "partition", "rack")
    """Label keys the GPU-hours lost are also broken down by (``gpu_hours_lost.by_label``)."""
    fleet_source: str = "given"
    """How ``fleet_gpus`` was found, when given (the report's ``assumptions.fleet_gpus_source``)."""

    @property
    def start(self) -> float:
        return self.end - self.since_s


percentile = breakdown.percentile
_spread = breakdown.spread


def gpus_of(row: Mapping[str, Any], node_gpus: int) -> int:
    """GPUs an incident takes out of service: 1 for a GPU or port, the node's count for a node, 0 for the
    breaker's and shared-cause incidents."""
    if row["rule_id"] in NOT_FAULTS:
        return 0
    if row["scope"] != "node":
        return 1
    evidence = orjson.loads(row["evidence"])
    for key in NODE_GPU_KEYS:
        value = evidence.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            return int(value)
    return node_gpus


def _day(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d")


def _split_by_day(start: float, end: float) -> Iterable[tuple[str, float]]:
    """``[start, end)`` cut at UTC midnights: (day, seconds in it)."""
    t = start
    while t < end:
        midnight = (math.floor(t / DAY_S) + 1) * DAY_S
        upto = min(end, midnight)
        yield _day(t), upto - t
        t = upto


def build(archive: store.Archive, opts: Options) -> dict[str, Any]:
    """The report for ``[opts.start, opts.end]``."""
    rows = [
        dict(r)
        for r in archive.rows(
            "SELECT * FROM incidents WHERE opened_at < ? AND (resolved_at IS NULL OR resolved_at > ?)"
            " ORDER BY opened_at, incident_id",
            (opts.end, opts.start),
        )
    ]
    opened = [r for r in rows if r["opened_at"] >= opts.start]
    faults = [r for r in opened if r["rule_id"] not in NOT_FAULTS]
    lost = _gpu_hours(rows, opts)
    fleet_gpus, fleet_source = _fleet(archive, opts)
    window_gpu_h = fleet_gpus * opts.since_s / 3600
    weighted = sum(SEVERITY_WEIGHT[r["severity"]] * h for r, h in lost["per_incident"])
    total_lost = sum(h for _, h in lost["per_incident"])
    precision, by_component = _precision(archive, opts)
    kinds = breakdown.containing_kinds(archive, {r["incident_id"] for r, _ in lost["per_incident"]})
    resolved = [r for r in faults if r["resolved_at"] is not None and r["rule_id"] not in FOLLOW_UPS]
    offenders, groups = _repeat_offenders(archive, opts)
    return {
        "schema": SCHEMA,
        "window": {"start": opts.start, "end": opts.end, "seconds": opts.since_s},
        "assumptions": {
            "node_gpus": opts.node_gpus,
            "fleet_gpus": fleet_gpus,
            "fleet_gpus_source": fleet_source,
            "percentile": "nearest rank",
        },
        "totals": {
            "incidents": sum(1 for r in faults if r["rule_id"] not in FOLLOW_UPS),
            "gpu_hours_lost": total_lost,
        },
        "by_rule": _by_rule(faults),
        "gpu_hours_lost": {
            "by_cause": lost["by_cause"],
            "by_day": lost["by_day"],
            "by_state": breakdown.by_state(lost["pieces"], kinds),
            "by_label": breakdown.by_label(lost["pieces"], opts.group_by),
        },
        "repair": breakdown.repair_by(archive, resolved),
        "between_failures": breakdown.between_failures(
            [r for r in faults if r["rule_id"] not in FOLLOW_UPS], fleet_gpus, opts.since_s / 3600
        ),
        "repair_times_s": [
            r["resolved_at"] - r["opened_at"]
            for r in faults
            if r["resolved_at"] is not None and r["rule_id"] not in FOLLOW_UPS
        ],
        "repeat_offenders": offenders,
        "repeat_map": breakdown.repeat_map(groups, [o["node"] for o in offenders]),
        "breaker_trips": [
            {"incident_id": r["incident_id"], "opened_at": r["opened_at"], "resolved_at": r["resolved_at"]}
            for r in opened
            if r["rule_id"] == BREAKER_RULE
        ],
        "shared_cause": breakdown.shared_causes(
            archive, [r for r in opened if r["rule_id"] == SHARED_CAUSE_RULE]
        ),
        "power_budgets": breakdown.power_budgets(
            archive, [r for r in rows if r["rule_id"] == breakdown.POWER_RULE], opts.end
        ),
        "precision": precision,
        "precision_by_component": by_component,
        "fleet": {
            "availability": (1 - total_lost / window_gpu_h) if window_gpu_h else None,
            "health_score": max(0.0, 100 * (1 - weighted / window_gpu_h)) if window_gpu_h else None,
        },
    }


def _by_rule(faults: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, str], list[dict[str, Any]]] = collections.defaultdict(list)
    for r in faults:
        groups[(r["rule_id"], r["scope"])].append(r)
    out = []
    for (rule, scope), members in sorted(groups.items()):
        contain = [r["contained_at"] - r["opened_at"] for r in members if r["contained_at"] is not None]
        resolve = [r["resolved_at"] - r["opened_at"] for r in members if r["resolved_at"] is not None]
        outcomes = collections.Counter(r["outcome"] for r in members if r["outcome"] is not None)
        out.append(
            {
                "rule_id": rule,
                "kind": scope,
                "incidents": len(members),
                "escalated": sum(1 for r in members if r["escalated_at"] is not None),
                "open": sum(1 for r in members if r["resolved_at"] is None),
                "waiting_for_a_person": sum(
                    1 for r in members if r["escalated_at"] is not None and r["resolved_at"] is None
                ),
                "to_containment": _spread(contain),
                "to_resolution": _spread(resolve),
                "ladder_outcomes": dict(sorted(outcomes.items())),
            }
        )
    return out


def _keys(row: Mapping[str, Any], node_gpus: int) -> list[tuple[str, str]]:
    """The GPUs an incident takes out of service, as (node, GPU) keys: every GPU of its node for a node
    incident, its own GPU for a GPU incident; a port incident is a GPU of its own (keyed by the incident)."""
    gpus = gpus_of(row, node_gpus)
    if not gpus:
        return []
    if row["scope"] == "node":
        return [(row["node"], str(g)) for g in range(gpus)]
    if row["scope"] == "gpu":
        return [(row["node"], str(row["gpu_index"]))]
    return [(row["node"], f"port:{row['incident_id']}")]


def _gpu_hours(rows: list[dict[str, Any]], opts: Options) -> dict[str, Any]:
    """GPU-hours out of service: per GPU, the union of the time its incidents cover in the window; a stretch
    two incidents cover (a node incident over a GPU's, a replacement over its fault) counts once, for the
    one opened first."""
    intervals: dict[tuple[str, str], list[tuple[float, float, int]]] = collections.defaultdict(list)
    for i, r in enumerate(rows):  # rows come ordered by open time, then id
        start = max(r["opened_at"], opts.start)
        end = min(r["resolved_at"] if r["resolved_at"] is not None else opts.end, opts.end)
        if end > start:
            for key in _keys(r, opts.node_gpus):
                intervals[key].append((start, end, i))
    seconds: dict[int, float] = collections.defaultdict(float)
    pieces: list[tuple[dict[str, Any], float, float, int]] = []
    by_day: dict[str, dict[str, float]] = collections.defaultdict(lambda: collections.defaultdict(float))
    for spans in intervals.values():
        covered = -math.inf
        for start, end, i in sorted(spans, key=lambda s: (rows[s[2]]["opened_at"], s[2])):
            piece = max(start, covered)
            if end > piece:
                seconds[i] += end - piece
                pieces.append((rows[i], piece, end, 1))
                for day, part in _split_by_day(piece, end):
                    by_day[day][rows[i]["rule_id"]] += part / 3600
            covered = max(covered, end)
    per_incident = [(rows[i], seconds[i] / 3600) for i in sorted(seconds)]
    by_cause: dict[tuple[str, str], float] = collections.defaultdict(float)
    for r, hours in per_incident:
        by_cause[(r["rule_id"], r["scope"])] += hours
    return {
        "per_incident": per_incident,
        "pieces": pieces,
        "by_cause": [
            {"rule_id": rule, "kind": kind, "gpu_hours": h} for (rule, kind), h in sorted(by_cause.items())
        ],
        "by_day": {day: dict(sorted(causes.items())) for day, causes in sorted(by_day.items())},
    }


def nodes_seen(archive: store.Archive) -> int:
    """Nodes with a fault incident in the archive (any time)."""
    placeholders = ",".join("?" * len(NOT_FAULTS))
    (nodes,) = next(
        archive.rows(
            f"SELECT count(DISTINCT node) FROM incidents WHERE rule_id NOT IN ({placeholders})",
            tuple(sorted(NOT_FAULTS)),
        )
    )
    return int(nodes)


def _fleet(archive: store.Archive, opts: Options) -> tuple[int, str]:
    if opts.fleet_gpus is not None:
        return opts.fleet_gpus, opts.fleet_source
    return nodes_seen(archive) * opts.node_gpus, f"nodes seen in the archive x {opts.node_gpus}"


def _repeat_offenders(
    archive: store.Archive, opts: Options
) -> tuple[list[dict[str, Any]], dict[tuple[str, int | None], list[dict[str, Any]]]]:
    """The repeat offenders, and every GPU's fault incidents in the repeat window (for the map)."""
    since = opts.end - opts.repeat_window_s
    groups: dict[tuple[str, int | None], list[dict[str, Any]]] = collections.defaultdict(list)
    for r in archive.rows(
        "SELECT incident_id, rule_id, node, gpu_index, gpu_uuid, opened_at FROM incidents"
        " WHERE opened_at >= ? AND opened_at < ? ORDER BY opened_at, incident_id",
        (since, opts.end),
    ):
        if r["rule_id"] not in NOT_FAULTS | FOLLOW_UPS:
            groups[(r["node"], r["gpu_index"])].append(dict(r))
    out = []
    for (node, gpu), members in sorted(
        groups.items(), key=lambda kv: (-len(kv[1]), kv[0][0], kv[0][1] or -1)
    ):
        if len(members) < opts.repeat_threshold:
            continue
        out.append(
            {
                "node": node,
                "gpu_index": gpu,
                "gpu_uuid": next((m["gpu_uuid"] for m in reversed(members) if m["gpu_uuid"]), None),
                "incidents": len(members),
                "mean_time_between_s": (members[-1]["opened_at"] - members[0]["opened_at"])
                / (len(members) - 1),
                "rules": sorted({m["rule_id"] for m in members}),
                "incident_ids": [m["incident_id"] for m in members],
            }
        )
    return out, groups


ANOMALY_COMPONENT_KEY: Final = "anomaly.component"
"""The evidence of an incident the anomaly model raised: the component that drove its score (the
controller's ``anomaly.`` evidence, docs/anomaly.md)."""


def _latest_verdicts(archive: store.Archive, opts: Options) -> Iterator[sqlite3.Row]:
    """The incidents opened in the window that have a verdict, each with its latest verdict."""
    return archive.rows(
        "SELECT i.rule_id, i.evidence, v.verdict FROM incidents i"
        " JOIN verdicts v ON v.incident_id = i.incident_id"
        " WHERE i.opened_at >= ? AND i.opened_at < ?"
        " AND v.id = (SELECT id FROM verdicts w WHERE w.incident_id = i.incident_id"
        " ORDER BY w.time DESC, w.id DESC LIMIT 1) ORDER BY i.rule_id",
        (opts.start, opts.end),
    )


def _precision_rows(key: str, counts: Mapping[str, collections.Counter[str]]) -> list[dict[str, Any]]:
    out = []
    for name, c in sorted(counts.items()):
        confirmed, false_alarms = c[verdicts.Verdict.CONFIRMED], c[verdicts.Verdict.FALSE_ALARM]
        out.append(
            {
                key: name,
                "confirmed": confirmed,
                "false_alarms": false_alarms,
                "precision": confirmed / (confirmed + false_alarms),
            }
        )
    return out


def _precision(archive: store.Archive, opts: Options) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Per rule, and per anomaly component (the one that drove an anomaly incident's score), over the
    incidents opened in the window with a verdict: the latest verdict of each counts."""
    by_rule: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    by_component: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for r in _latest_verdicts(archive, opts):
        by_rule[r["rule_id"]][r["verdict"]] += 1
        component = orjson.loads(r["evidence"]).get(ANOMALY_COMPONENT_KEY)
        if isinstance(component, str):
            by_component[component][r["verdict"]] += 1
    return _precision_rows("rule_id", by_rule), _precision_rows("component", by_component)
