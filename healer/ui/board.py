"""The status page's picture of what the controller decided: incidents, their timelines, the breaker,
the exclusions and the recent feed, built only from what the controller publishes.

The incident feed is the source of truth for incidents: every CloudEvent carries the whole incident
(evidence, every action so far), so the latest event of an incident is its state and the events
themselves are its timeline. Incidents opened before the feed window the page replays are seeded once
from the controller's KV documents (``seed``); a seed never overrides what the feed said. The breaker
and exclusions are the KV documents as they are (``healer breaker status`` shows the same). Pure state,
no I/O: the sources in ``healer.ui.sources`` feed it.
"""

from __future__ import annotations

import collections
import dataclasses
from datetime import UTC, datetime
from typing import Any

from healer.schemas import incidents

SEVERITY_CODE = {"info": 1, "warning": 2, "major": 3, "critical": 4}
"""Health codes of a GPU with an open incident; the page's legend uses the same numbers."""

SEEN_MAX = 100_000
"""Event ids remembered for deduplication (a replayed window is far smaller)."""

TIMELINE_MAX = 50
"""Events kept per incident (the first one, opened, is always kept)."""


@dataclasses.dataclass
class Shown:
    """One open (or escalated) incident as the page shows it."""

    data: incidents.IncidentData
    opened: float
    updated: float
    timeline: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        d = self.data
        return {
            "id": d.incident_id,
            "rule": d.rule_id,
            "severity": d.severity,
            "node": d.node,
            "gpu": d.gpu_index,
            "gpu_uuid": d.gpu_uuid,
            "state": d.state,
            "summary": d.summary,
            "evidence": d.evidence,
            "actions": [a.model_dump() for a in d.actions],
            "labels": d.labels,
            "mode": d.mode,
            "opened": self.opened,
            "updated": self.updated,
            "timeline": self.timeline,
        }


def _ts(t: datetime) -> float:
    return t.astimezone(UTC).timestamp()


class Board:
    def __init__(self, recent_max: int = 200) -> None:
        self.open: dict[str, Shown] = {}
        self.recent: collections.deque[dict[str, Any]] = collections.deque(maxlen=recent_max)
        self.seen: collections.OrderedDict[str, None] = collections.OrderedDict()
        """Event ids applied (bounded)."""
        self.closed: collections.OrderedDict[str, None] = collections.OrderedDict()
        """Ids of incidents the feed has resolved (bounded), so that a late KV seed cannot revive them."""
        self.breaker: dict[str, Any] = {"open": False, "entries": []}
        self.exclusions: dict[str, dict[str, Any]] = {}
        self.node_labels: dict[str, dict[str, str]] = {}
        self.rejected_rules: dict[str, Any] | None = None
        self.version = 0
        """Bumped on every change the page must hear about."""

    def apply(self, ev: incidents.IncidentEvent) -> dict[str, Any] | None:
        """One incident event from the feed; returns the feed line the page appends, or ``None`` for an
        event already applied (the feed is replayed again after a reconnect; ids are stable)."""
        if ev.id in self.seen:
            return None
        self.seen[ev.id] = None
        while len(self.seen) > SEEN_MAX:
            self.seen.popitem(last=False)
        d = ev.data
        at = _ts(ev.time)
        line = {
            "id": ev.id,
            "time": at,
            "change": ev.change,
            "severity": d.severity,
            "node": d.node,
            "gpu": d.gpu_index,
            "rule": d.rule_id,
            "summary": d.summary,
            "incident": d.incident_id,
            "actions": [f"{a.kind}:{a.status}" for a in d.actions],
        }
        self.recent.append(line)
        if d.labels:
            self.node_labels[d.node] = {**self.node_labels.get(d.node, {}), **d.labels}
        step = {"time": at, "change": ev.change, "summary": d.summary, "actions": len(d.actions)}
        if d.state == "resolved":
            self.open.pop(d.incident_id, None)
            self.closed[d.incident_id] = None
            while len(self.closed) > 10_000:
                self.closed.popitem(last=False)
        else:
            shown = self.open.get(d.incident_id)
            if shown is None:
                shown = self.open[d.incident_id] = Shown(d, opened=at, updated=at)
            shown.data, shown.updated = d, at
            if not shown.timeline or shown.timeline[-1]["time"] <= at:
                shown.timeline.append(step)
            if len(shown.timeline) > TIMELINE_MAX:
                del shown.timeline[1 : len(shown.timeline) - TIMELINE_MAX + 1]
        self.version += 1
        return line

    def seed(self, doc: dict[str, Any]) -> bool:
        """An open incident from the controller's KV document, unless the feed already knows it."""
        try:
            data = incidents.IncidentData(
                incident_id=doc["id"],
                rule_id=doc["rule_id"],
                severity=doc["severity"],
                node=doc["node"],
                gpu_index=doc.get("gpu_index"),
                gpu_uuid=doc.get("gpu_uuid"),
                state=doc.get("state", "open"),
                summary=str(doc.get("summary", ""))[:4096],
                evidence=doc.get("evidence") or {},
                actions=[
                    incidents.ActionRecord(
                        kind=a["kind"], status=a["status"], detail=str(a.get("detail", ""))[:4096], at=a["at"]
                    )
                    for a in doc.get("actions") or []
                    if a.get("status") is not None
                ],
                labels=doc.get("labels") or {},
                mode=doc["mode"],
            )
        except (KeyError, TypeError, ValueError):
            return False
        if data.incident_id in self.open or data.incident_id in self.closed or data.state == "resolved":
            return False
        opened = float(doc.get("opened_at") or 0.0)
        updated = float(doc.get("updated_at") or opened)
        step = {"time": opened, "change": "opened", "summary": data.summary, "actions": len(data.actions)}
        self.open[data.incident_id] = Shown(data, opened=opened, updated=updated, timeline=[step])
        if data.labels:
            self.node_labels[data.node] = {**self.node_labels.get(data.node, {}), **data.labels}
        self.version += 1
        return True

    def rules_rejected(self, ev: incidents.RulesRejectedEvent) -> dict[str, Any]:
        d = ev.data
        self.rejected_rules = {"time": _ts(ev.time), "dir": d.rules_dir, "errors": len(d.errors)}
        line = {
            "id": ev.id,
            "time": _ts(ev.time),
            "change": "rules-rejected",
            "severity": "major",
            "node": None,
            "gpu": None,
            "rule": "",
            "summary": f"rule files in {d.rules_dir} rejected: {len(d.errors)} errors, "
            f"{d.kept_rules} rules kept",
            "incident": None,
            "actions": [],
        }
        self.recent.append(line)
        self.version += 1
        return line

    def set_breaker(self, doc: dict[str, Any] | None) -> None:
        self.breaker = doc if doc is not None else {"open": False, "entries": []}
        self.version += 1

    def set_exclusion(self, node: str, doc: dict[str, Any] | None) -> None:
        if doc is None:
            self.exclusions.pop(node, None)
        else:
            self.exclusions[node] = doc
        self.version += 1

    def safety(self) -> dict[str, Any]:
        b = self.breaker
        return {
            "breaker": {
                "open": bool(b.get("open")),
                "reason": b.get("reason"),
                "opened_at": b.get("opened_at"),
                "in_window": len(b.get("entries") or []),
                "reset_by": b.get("reset_by"),
                "reset_at": b.get("reset_at"),
            },
            "exclusions": [{"node": n, **v} for n, v in sorted(self.exclusions.items())],
            "rules_rejected": self.rejected_rules,
        }
