"""The status page's picture of what the controller decided: incidents, their timelines, the breaker,
the exclusions and the recent feed, built only from what the controller publishes.

The incident feed is the source of truth for incidents: every CloudEvent carries the whole incident
(evidence, every action so far), so the latest event of an incident is its state and the events
themselves are its timeline. Incidents opened before the feed window the page replays are seeded once
from the controller's KV documents (``seed``); a seed never overrides what the feed said. The breaker
and exclusions are the KV documents as they are (``healer breaker status`` shows the same). Pure state,
no I/O: the sources in ``healer.ui.sources`` feed it.

Per node it also keeps what the per-node view shows: the last ``HISTORY_MAX`` incidents (open and
resolved), the last ``XIDS_MAX`` XID-like events from the events stream, the driver and VBIOS versions a
validation reported (incident evidence and action facts), and whether healer holds the node cordoned or
drained: the latest scheduler action that completed in each incident, read through the action catalogue
(``healer.actions``: which kinds take a node out of service, which lift the cordon).
"""

from __future__ import annotations

import collections
import dataclasses
from datetime import UTC, datetime
from typing import Any

from healer import actions as actions_catalog
from healer.schemas import events, incidents, verdicts

SEVERITY_CODE = {"info": 1, "warning": 2, "major": 3, "critical": 4}
"""Health codes of a GPU with an open incident; the page's legend uses the same numbers."""

SEEN_MAX = 100_000
"""Event ids remembered for deduplication (a replayed window is far smaller)."""

TIMELINE_MAX = 50
"""Events kept per incident (the first one, opened, is always kept)."""

FLEET_NODE = "fleet"
"""The node of fleet-wide incidents (the circuit breaker's): listed, never drawn as a node of the map."""

HISTORY_MAX = 30
"""Incidents remembered per node for the per-node view."""

XIDS_MAX = 50
"""XID-like events remembered per node."""

NODES_MAX = 100_000
"""Nodes with remembered history, at most (the oldest node's history is dropped first)."""

DONE = incidents.TOOK_EFFECT
"""Action statuses after which the node is in the state the action asked for."""

XID_KINDS = ("xid", "sxid", "gpu_lost")
"""Event kinds the per-node view lists as its XID history."""

VERDICTS_MAX = 10_000
"""Incidents whose latest verdict the page remembers (the oldest dropped first)."""

VERSION_KEYS = {"driver_version": "driver", "vbios_version": "vbios"}
"""Evidence or fact keys (or their ``*.driver_version`` flattened forms) naming versions."""


def node_mark(actions: list[incidents.ActionRecord]) -> str | None:
    """``cordoned`` or ``drained`` when the incident's last completed scheduler action left the node out of
    service (``drain`` and ``migrate`` drain it; another out-of-service kind cordons it), ``None`` when the
    last one lifted the cordon (``uncordon``, ``return_to_service``) or there was none."""
    mark: str | None = None
    for a in sorted(actions, key=lambda a: a.at):
        kind = actions_catalog.CATALOG.get(a.kind)
        if kind is None or a.status not in DONE or kind.scheduler_verb is None:
            continue
        if kind.undoes_cordon:
            mark = None
        elif kind.drains:
            mark = "drained"
        elif kind.takes_out_of_service and mark != "drained":
            mark = "cordoned"
    return mark


def versions(values: dict[str, Any]) -> dict[str, str]:
    """``{"driver": ..., "vbios": ...}`` from evidence or facts (keys as ``VERSION_KEYS``, flattened or
    not); only what is there."""
    out: dict[str, str] = {}
    for key, value in values.items():
        leaf = str(key).rsplit(".", 1)[-1]
        if leaf in VERSION_KEYS and value not in (None, ""):
            out[VERSION_KEYS[leaf]] = str(value)[:64]
    return out


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
            "port": incidents.port_of(d),
            "state": d.state,
            "summary": d.summary,
            "evidence": d.evidence,
            "actions": [a.model_dump() for a in d.actions],
            "labels": d.labels,
            "mode": d.mode,
            "domain": d.domain.model_dump() if d.domain is not None else None,
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
        self.power: dict[str, dict[str, Any]] = {}
        """Power budgets' states by KV key suffix (``rack.r7``), from the controller's KV (#30)."""
        self.node_labels: dict[str, dict[str, str]] = {}
        self.rejected_rules: dict[str, Any] | None = None
        self.history: collections.OrderedDict[str, collections.OrderedDict[str, dict[str, Any]]] = (
            collections.OrderedDict()
        )
        """node -> incident id -> what the per-node view lists (bounded: ``HISTORY_MAX``, ``NODES_MAX``)."""
        self.marks: dict[str, dict[str, str]] = {}
        """node -> incident id -> ``cordoned`` / ``drained`` (``node_mark``), while healer holds it so."""
        self.xids: dict[str, collections.deque[dict[str, Any]]] = {}
        self.versions: dict[str, dict[str, str]] = {}
        """node -> {"driver": ..., "vbios": ...} as a validation last reported them."""
        self.verdicts: collections.OrderedDict[str, dict[str, Any]] = collections.OrderedDict()
        """incident id -> its latest operator's verdict seen on the feed (bounded: ``VERDICTS_MAX``)."""
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
            "port": incidents.port_of(d),
            "rule": d.rule_id,
            "summary": d.summary,
            "incident": d.incident_id,
            "actions": [f"{a.kind}:{a.status}" for a in d.actions],
        }
        self.recent.append(line)
        node_labels = {k: v for k, v in d.labels.items() if k != incidents.PORT_LABEL}  # the incident's own
        if node_labels:
            self.node_labels[d.node] = {**self.node_labels.get(d.node, {}), **node_labels}
        self._label_members(d)
        self._remember(d, at, ev.change)
        step = {"time": at, "change": ev.change, "summary": d.summary, "actions": len(d.actions)}
        if d.state == incidents.IncidentState.RESOLVED:
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

    def _remember(
        self, d: incidents.IncidentData, at: float, change: str, facts: dict[str, Any] | None = None
    ) -> None:
        """The per-node view's memory of one incident event: its history line, the node's mark, versions."""
        hist = self.history.get(d.node)
        if hist is None:
            hist = self.history[d.node] = collections.OrderedDict()
            while len(self.history) > NODES_MAX:
                old, _ = self.history.popitem(last=False)
                self.marks.pop(old, None)
                self.versions.pop(old, None)
        entry = hist.get(d.incident_id)
        if entry is None:
            entry = hist[d.incident_id] = {
                "id": d.incident_id, "rule": d.rule_id, "gpu": d.gpu_index, "port": incidents.port_of(d),
                "opened": at, "resolved": None,
            }  # fmt: skip
            while len(hist) > HISTORY_MAX:
                hist.popitem(last=False)
        entry.update(severity=d.severity, state=d.state, updated=at, change=change, summary=d.summary[:200])
        if d.state == incidents.IncidentState.RESOLVED:
            entry["resolved"] = at
        mark = node_mark(list(d.actions)) if d.mode.acts else None
        marks = self.marks.setdefault(d.node, {})
        if mark is None:
            marks.pop(d.incident_id, None)
        else:
            marks[d.incident_id] = mark
        if not marks:
            self.marks.pop(d.node, None)
        found = {**versions(d.evidence), **versions(facts or {})}
        if found:
            self.versions[d.node] = {**self.versions.get(d.node, {}), **found}

    def node_marks(self) -> dict[str, list[str]]:
        """node -> its marks for the map: ``drained`` / ``cordoned`` (healer's own), ``excluded``."""
        out: dict[str, list[str]] = {}
        for node, by_incident in self.marks.items():
            held = set(by_incident.values())
            out[node] = ["drained"] if "drained" in held else ["cordoned"]
        for node in self.exclusions:
            out.setdefault(node, []).append("excluded")
        return out

    def xid(self, ev: events.NodeEvent, node: str) -> dict[str, Any] | None:
        """An event from the events stream (``node`` from its subject): kept when it is XID-like."""
        if ev.kind not in XID_KINDS:
            return None
        ring = self.xids.get(node)
        if ring is None:
            if len(self.xids) >= NODES_MAX:
                self.xids.pop(next(iter(self.xids)))
            ring = self.xids[node] = collections.deque(maxlen=XIDS_MAX)
        if any(x["id"] == ev.id for x in ring):
            return None
        item = {
            "id": ev.id, "time": ev.ts, "kind": ev.kind, "xid": ev.xid, "gpu": ev.gpu_index,
            "message": ev.message[:160],
        }  # fmt: skip
        ring.append(item)
        self.version += 1
        return item

    def node_history(self, node: str) -> list[dict[str, Any]]:
        """The node's remembered incidents, newest first, each with its latest verdict (or None)."""
        entries = sorted((self.history.get(node) or {}).values(), key=lambda e: e["opened"], reverse=True)
        return [{**e, "verdict": self.verdicts.get(e["id"])} for e in entries]

    def other(self, env_type: str, ev_id: str, at: float, subject: str | None) -> dict[str, Any]:
        """A CloudEvent of a type this page does not know: a feed line all the same (a later controller's
        events are shown, not dropped). A rules-rejected event in another shape counts as one."""
        short = env_type.removeprefix("io.healer.")
        line = {
            "id": ev_id, "time": at, "change": short.split(".v")[0][:24], "severity": "info", "node": None,
            "gpu": None, "rule": "", "summary": f"{env_type}{f' ({subject})' if subject else ''}"[:200],
            "incident": None, "actions": [],
        }  # fmt: skip
        if "rules.rejected" in env_type:
            line["severity"] = "major"
            self.rejected_rules = {"time": at, "dir": subject or "", "errors": None, "problems": []}
        self.recent.append(line)
        self.version += 1
        return line

    def verdict(self, ev: verdicts.VerdictEvent) -> dict[str, Any] | None:
        """An operator's verdict from the feed: remembered as the incident's latest unless an older one
        (by time); returns its feed line, or ``None`` for an event already applied."""
        if ev.id in self.seen:
            return None
        self.seen[ev.id] = None
        d, at = ev.data, _ts(ev.time)
        kept = self.verdicts.get(d.incident_id)
        if kept is None or kept["time"] <= at:
            self.verdicts[d.incident_id] = {
                "incident": d.incident_id, "verdict": str(d.verdict), "by": d.by, "note": d.note, "time": at,
            }  # fmt: skip
            self.verdicts.move_to_end(d.incident_id)
            while len(self.verdicts) > VERDICTS_MAX:
                self.verdicts.popitem(last=False)
        said = f"{d.verdict} on {d.incident_id} by {d.by}{f': {d.note}' if d.note else ''}"
        line = {
            "id": ev.id, "time": at, "change": "verdict", "severity": "info", "node": None, "gpu": None,
            "rule": "", "summary": said[:200],
            "incident": d.incident_id, "actions": [],
        }  # fmt: skip
        self.recent.append(line)
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
                state=doc.get("state", incidents.IncidentState.OPEN),
                summary=str(doc.get("summary", ""))[:4096],
                evidence=doc.get("evidence") or {},
                actions=[
                    incidents.ActionRecord(
                        kind=a["kind"], status=a["status"], detail=str(a.get("detail", ""))[:4096], at=a["at"]
                    )
                    for a in doc.get("actions") or []
                    if a.get("status") is not None
                ],
                labels={
                    **(doc.get("labels") or {}),
                    **({incidents.PORT_LABEL: doc["port"]} if doc.get("port") else {}),
                },
                mode=doc["mode"],
                domain=doc.get("domain"),
                schema=incidents.SCHEMA_V2 if doc.get("domain") else incidents.SCHEMA,
            )
        except (KeyError, TypeError, ValueError):
            return False
        if (
            data.incident_id in self.open
            or data.incident_id in self.closed
            or data.state == incidents.IncidentState.RESOLVED
        ):
            return False
        opened = float(doc.get("opened_at") or 0.0)
        updated = float(doc.get("updated_at") or opened)
        facts: dict[str, Any] = {}
        for a in doc.get("actions") or []:
            if isinstance(a, dict) and isinstance(a.get("facts"), dict):
                facts.update(a["facts"])
        self._remember(data, opened, "opened", facts)
        step = {"time": opened, "change": "opened", "summary": data.summary, "actions": len(data.actions)}
        self.open[data.incident_id] = Shown(data, opened=opened, updated=updated, timeline=[step])
        if data.labels:
            self.node_labels[data.node] = {**self.node_labels.get(data.node, {}), **data.labels}
        self._label_members(data)
        self.version += 1
        return True

    def _label_members(self, d: incidents.IncidentData) -> None:
        """A domain incident's members carry its domain as a label (``switch: leaf-07``), so the map can
        group by it (``ui.group_by``) even where the page has no topology of its own (#27)."""
        if d.domain is None:
            return
        for node in d.domain.members:
            self.node_labels[node] = {**self.node_labels.get(node, {}), d.domain.key: d.domain.value}

    def rules_rejected(self, ev: incidents.RulesRejectedEvent) -> dict[str, Any]:
        d = ev.data
        problems = [f"{e.path}:{e.line}:{e.col}: {e.message}"[:200] for e in d.errors[:5]]
        self.rejected_rules = {
            "time": _ts(ev.time), "dir": d.rules_dir, "errors": len(d.errors), "problems": problems,
            "kept_rules": d.kept_rules,
        }  # fmt: skip
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

    def set_power(self, key: str, doc: dict[str, Any] | None) -> None:
        """A power budget's state from KV (``power.<key>.<value>``, #30): what healer holds down, a shed."""
        if doc is None:
            self.power.pop(key, None)
        else:
            self.power[key] = doc
        self.version += 1

    def power_rows(self) -> list[dict[str, Any]]:
        """Each budget as the leader keeps it in KV: the GPUs it holds down, a shed, and (``live``, from
        its last step) the domain's draw against its budget and the budget in force, its phase."""
        rows = []
        for key, doc in sorted(self.power.items()):
            capped = doc.get("capped_w")
            raw = doc.get("live")
            live: dict[str, Any] = raw if isinstance(raw, dict) else {}
            rows.append({
                "domain": str(doc.get("domain") or key),
                "capped_gpus": len(capped) if isinstance(capped, dict) else 0,
                "shed_to_w": doc.get("shed_to_w"), "shed_until": doc.get("shed_until"),
                "cycles": len(doc.get("cycles") or []),
                **{k: _num(live.get(k)) for k in ("draw_w", "budget_w", "budget_in_force_w", "at")},
                "phase": live.get("phase") if live.get("phase") in ("under", "over", "capped") else None,
                "gpus": live.get("gpus") if isinstance(live.get("gpus"), int) else None,
                "incident_id": str(live["incident_id"]) if live.get("incident_id") else None,
            })  # fmt: skip
        return rows

    def safety(self) -> dict[str, Any]:
        b = self.breaker
        return {
            "power": self.power_rows(),
            "breaker": {
                "open": bool(b.get("open")),
                "reason": b.get("reason"),
                "opened_at": b.get("opened_at"),
                "in_window": len(b.get("entries") or []),
                "nodes": [str(e[0]) for e in b.get("entries") or [] if isinstance(e, list | tuple) and e][
                    :200
                ],
                "reset_by": b.get("reset_by"),
                "reset_at": b.get("reset_at"),
            },
            "exclusions": [{"node": n, **v} for n, v in sorted(self.exclusions.items())],
            "rules_rejected": self.rejected_rules,
        }


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None
