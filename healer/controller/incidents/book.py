"""Incidents: what the controller knows is wrong, keyed by (rule, node, gpu, port), kept in KV
``healer-state``.

One fault often fires several rules at once (a double-bit ECC error: the DBE counter and XID 48). The
controller joins such firings into one incident (``correlation.correlate``): each rule's firing is a
``Signal`` of the incident, the first one the signal that opened it. The book finds an incident by any
of its signals' keys, and the signals are stored with the incident, so a restarted or newly elected
controller keeps the join and resolves the incident only when every signal has resolved.

A port-scope rule's firing names its RDMA port (``mlx5_0/1``), the key's fourth part: a port fault is
one incident for its node and port, and two faulty ports of one node are two incidents. An incident
stored before ports existed has no ``port`` and loads as a node or GPU incident (``port`` None).

An incident is written to KV before anything is published or done about it, and every change bumps its
``seq``; feed event ids are ``<incident id>.<seq>``, so a controller that crashes between writing and
publishing publishes the same id again and JetStream drops the duplicate. A restarted (or newly elected)
controller loads the open incidents and carries on: actions already recorded as done are never redone.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pydantic
import structlog

from healer.controller.store import kv
from healer.schemas import incidents

log = structlog.get_logger(__name__)

PREFIX = "incident."

Key = tuple[str, str, int | None, str | None]
"""(rule id, node, GPU index or None, RDMA port or None): ``engine.Firing.key``."""


class PlannedAction(pydantic.BaseModel):
    """One action of an incident, in the order the rule lists them."""

    kind: str
    params: dict[str, Any] = pydantic.Field(default_factory=dict)
    status: incidents.ActionStatus | None = None
    """None: not tried yet."""
    detail: str = ""
    attempts: int = 0
    at: float = 0.0
    on_resolve: bool = False
    ladder: bool = False
    """A recovery-ladder step (healer.controller.remediation.healing): its failure leads to the next rung
    instead of stopping the incident's actions."""
    facts: dict[str, str | None] = pydantic.Field(default_factory=dict)
    """What the actuator read on the way (validate: the GPU's serial, board part, VBIOS, driver)."""
    gpu_index: int | None = None
    """The GPU this action acts on when it is not the incident's own: a per-GPU action (a power cap) of
    a node-wide incident, one for each GPU that fired (None: the incident's GPU, or the whole node)."""
    node: str | None = None
    """The node this action acts on when it is not the incident's own: a power-budget domain incident's
    per-GPU limit changes (#30) act on the domain's member nodes (None: the incident's node)."""


class Signal(pydantic.BaseModel):
    """One rule's firing that is part of an incident: the first opened it, the others joined it."""

    rule_id: str
    gpu_index: int | None = None
    """The firing's GPU (None for a node-scope rule)."""
    gpu_uuid: str | None = None
    port: str | None = None
    """The firing's RDMA port (``mlx5_0/1``; a port-scope rule), None otherwise."""
    since: float = 0.0
    """When it opened or joined the incident."""
    last_seen_firing: float = 0.0
    resolved_at: float | None = None
    """When this firing resolved; None while it fires."""
    holds: bool = True
    """The incident stays open until this signal resolves. False for a rule that never resolves (an
    event rule without ``resolve``): its signal is evidence only."""
    evidence: dict[str, float | int | str | bool | None] = pydantic.Field(default_factory=dict)

    def key(self, node: str) -> Key:
        return (self.rule_id, node, self.gpu_index, self.port)

    @property
    def open(self) -> bool:
        """Still holds the incident open."""
        return self.holds and self.resolved_at is None


class Incident(pydantic.BaseModel):
    id: str
    rule_id: str
    severity: incidents.Severity
    node: str
    gpu_index: int | None = None
    gpu_uuid: str | None = None
    port: str | None = None
    """The RDMA port this incident is about (``mlx5_0/1``): opened by a port-scope rule's firing; only
    that port's firings join it (``correlation.correlate``). None for a node or GPU incident. On the feed it
    is the label ``port`` (``incidents.PORT_LABEL``) and the subject's ``/port/<device>/<port>``."""
    state: incidents.IncidentState = incidents.IncidentState.OPEN
    summary: str = ""
    evidence: dict[str, float | int | str | bool | None] = pydantic.Field(default_factory=dict)
    labels: dict[str, str] = pydantic.Field(default_factory=dict)
    mode: incidents.Mode
    opened_at: float
    updated_at: float
    resolved_at: float | None = None
    seq: int = 0
    actions: list[PlannedAction] = pydantic.Field(default_factory=list)
    escalated: bool = False
    last_seen_firing: float = 0.0
    signals: list[Signal] = pydantic.Field(default_factory=list)
    """Every rule firing joined in this incident, the one that opened it first (never empty once
    validated: an incident stored before signals existed gets its own rule's)."""
    node_wide: str | None = None
    """The ``node_wide`` group of the GPU rule that opened it: other GPUs of the node firing rules of
    this group join it (``correlation.correlate``), and once enough did it is a node incident (``gpu_index``
    None, ``node_wide_at`` set)."""
    node_wide_at: float | None = None
    """When it became a node incident (enough GPUs of its node fired)."""
    node_gpus: int = 0
    """(node-wide) The GPUs its node reported when it became node-wide."""
    domain: incidents.Domain | None = None
    """(shared-cause) Its failure domain and members, on the feed as ``data.domain`` (v2, #27)."""
    last_change: incidents.Change | None = None
    """The change its feed event ``<id>.<seq>`` announced: a new leader builds that event again from
    this saved state and sends it (``FeedPublisher.resend``), so a change saved by a leader that died
    before publishing it still reaches the feed; the stream's duplicate window drops it when it was
    out already."""
    unpublished: list[str] = pydantic.Field(default_factory=list)
    """Its earlier feed events (encoded) still waiting in the leader's outbox when this state was saved,
    sent again by a new leader the same way; empty while the incidents stream keeps up."""

    @pydantic.model_validator(mode="after")
    def _first_signal(self) -> Incident:
        if not self.signals:
            first = Signal(
                rule_id=self.rule_id, gpu_index=self.gpu_index, gpu_uuid=self.gpu_uuid, port=self.port,
                since=self.opened_at, last_seen_firing=self.last_seen_firing, evidence=dict(self.evidence),
            )  # fmt: skip
            self.signals.append(first)
        return self

    @property
    def key(self) -> Key:
        """The key of the signal that opened it (its GPU may be taken later, see ``correlation.join``)."""
        return self.signals[0].key(self.node)

    @property
    def keys(self) -> list[Key]:
        return [s.key(self.node) for s in self.signals]

    def signal(self, key: Key) -> Signal | None:
        return next((s for s in self.signals if s.key(self.node) == key), None)

    def records(self) -> list[incidents.ActionRecord]:
        return [
            incidents.ActionRecord(kind=a.kind, status=a.status, detail=a.detail[:4096], at=a.at)
            for a in self.actions
            if a.status is not None
        ]

    def data(self) -> incidents.IncidentData:
        return incidents.IncidentData(
            incident_id=self.id,
            rule_id=self.rule_id,
            severity=self.severity,
            node=self.node,
            gpu_index=self.gpu_index,
            gpu_uuid=self.gpu_uuid,
            state=self.state,
            summary=self.summary[:4096],
            evidence=self.evidence,
            actions=self.records(),
            labels=self.labels if self.port is None else {**self.labels, incidents.PORT_LABEL: self.port},
            mode=self.mode,
            domain=self.domain,
            schema=incidents.SCHEMA if self.domain is None else incidents.SCHEMA_V2,
        )


def new_id() -> str:
    return f"inc-{time.strftime('%Y%m%d', time.gmtime())}-{uuid.uuid4().hex[:12]}"


class Book:
    """Open incidents in memory, mirrored to KV on every change."""

    def __init__(self, store: kv.Store) -> None:
        self.store = store
        self.open: dict[Key, Incident] = {}
        """Open incidents by the key of the signal that opened them."""
        self.by_signal: dict[Key, Incident] = {}
        """Open incidents by every signal's key (what ``get`` reads)."""
        self.resolving: dict[str, Incident] = {}
        """Resolved incidents whose on_resolve actions (restore, uncordon) have not all run yet."""
        self.ids: dict[str, Incident] = {}
        self.nodes: dict[str, dict[str, Incident]] = {}
        self.rules: dict[str, dict[str, Incident]] = {}
        """The open incidents by id, and by node and by rule (then id): a burst's thousand incidents are
        not searched one by one for each of them (#43)."""

    async def load(self) -> int:
        for index in (self.open, self.by_signal, self.resolving, self.ids, self.nodes, self.rules):
            index.clear()
        for key in await self.store.keys(PREFIX):
            doc = await self.store.get(key)
            if doc is None:
                continue
            try:
                inc = Incident.model_validate(doc.value)
            except pydantic.ValidationError as e:
                log.error("incidents.unreadable", key=key, error=str(e))
                continue
            if inc.state == incidents.IncidentState.RESOLVED:
                self.resolving[inc.id] = inc
            else:
                self._index(inc)
        log.info("incidents.loaded", open=len(self.open), resolving=len(self.resolving))
        return len(self.open)

    def get(self, key: Key) -> Incident | None:
        """The open incident one of whose signals has this key."""
        return self.by_signal.get(key)

    def find(self, incident_id: str) -> Incident | None:
        """The open or resolving incident with this id."""
        return self.ids.get(incident_id) or self.resolving.get(incident_id)

    def on_node(self, node: str) -> list[Incident]:
        """The open incidents of ``node``."""
        return list(self.nodes.get(node, {}).values())

    def of_rule(self, rule_id: str) -> list[Incident]:
        """The open incidents of ``rule_id``."""
        return list(self.rules.get(rule_id, {}).values())

    def _index(self, inc: Incident) -> None:
        self.open[inc.key] = inc
        for key in inc.keys:
            self.by_signal[key] = inc
        self.ids[inc.id] = inc
        self.nodes.setdefault(inc.node, {})[inc.id] = inc
        self.rules.setdefault(inc.rule_id, {})[inc.id] = inc

    def _unindex(self, inc: Incident) -> None:
        if self.open.get(inc.key) is inc:
            del self.open[inc.key]
        for key in inc.keys:
            if self.by_signal.get(key) is inc:
                del self.by_signal[key]
        if self.ids.get(inc.id) is inc:
            del self.ids[inc.id]
        for index, name in ((self.nodes, inc.node), (self.rules, inc.rule_id)):
            of = index.get(name, {})
            if of.get(inc.id) is inc:
                del of[inc.id]
                if not of:
                    del index[name]

    def all(self) -> list[Incident]:
        return [*self.open.values(), *self.resolving.values()]

    async def save(self, inc: Incident) -> None:
        """Persist. A resolved incident leaves KV once its on_resolve actions have run (the feed keeps its
        history). The caller bumps ``seq`` when the change is published."""
        if inc.state == incidents.IncidentState.RESOLVED:
            self._unindex(inc)
            if any(a.status is None for a in inc.actions):
                self.resolving[inc.id] = inc
            else:
                self.resolving.pop(inc.id, None)
                await self.store.delete(PREFIX + inc.id)
                return
        elif inc.node != "fleet":
            self._index(inc)
        await self.store.put(PREFIX + inc.id, inc.model_dump(mode="json"))

    def by_severity(self) -> dict[str, int]:
        out: dict[str, int] = {"info": 0, "warning": 0, "major": 0, "critical": 0}
        for inc in self.open.values():
            out[inc.severity] += 1
        return out
