"""Event rules' firings, for the rule engine: the events queued for their rules, the firings active (those
with ``resolve: {for: ...}``, quiet since their last event) and the burst counter (``repeat``).

An event fires at once; with a quiet time it stays active, reported ``firing`` at each evaluation, until
no event came for that long (measured on the evaluator's clock, never the event's ``ts``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from healer.rules import repeats, ruleset
from healer.rules import state as fleet_state
from healer.rules.firing import Evidence, Firing, Key, Status
from healer.schemas import events, fields


@dataclasses.dataclass(slots=True)
class EventFiring:
    since: float
    last: float
    evidence: Evidence
    gpu_uuid: str | None


class EventFirings:
    def __init__(self) -> None:
        self.queued: list[tuple[ruleset.Rule, events.NodeEvent]] = []
        self.active: dict[Key, EventFiring] = {}
        self.repeats = repeats.Counter()

    def ingest(self, event: events.NodeEvent, event_rules: Iterable[ruleset.Rule]) -> None:
        """Queue the event for each event rule it matches."""
        for rule in event_rules:
            assert rule.on_event is not None
            if rule.on_event.matches(event):
                self.queued.append((rule, event))

    def evaluate(
        self,
        now: float,
        event_rules: Iterable[ruleset.Rule],
        events_read: bool,
        state: fleet_state.FleetState,
    ) -> list[Firing]:
        """The queued events' firings, then every active firing: resolved after its quiet time (once the
        events stream's backlog was read, ``events_read``), else still firing."""
        out = self.fire_queued(now, state)
        rules = {r.id: r for r in event_rules}
        reported = {f.key for f in out}
        for key, active in list(self.active.items()):
            rule = rules[key[0]]
            if events_read and now - active.last >= rule.resolve_for_s:
                del self.active[key]
                status: Status = Status.RESOLVED
            elif key in reported:
                continue
            else:
                status = Status.FIRING
            out.append(
                Firing(rule, key[1], key[2], status, active.since, now, active.evidence, active.gpu_uuid)
            )
        return out

    def forget(
        self, node: str, now: float, reason: Evidence, rule_of: Callable[[str], ruleset.Rule | None]
    ) -> list[Firing]:
        """Drop the node's active firings (it was forgotten): each comes back ``resolved`` with ``reason``."""
        out = []
        for key in [k for k in self.active if k[1] == node]:
            active = self.active.pop(key)
            rule = rule_of(key[0])
            if rule is not None:
                out.append(
                    Firing(
                        rule, node, key[2], Status.RESOLVED, active.since, now, dict(reason), active.gpu_uuid
                    )
                )
        return out

    def fire_queued(self, now: float, state: fleet_state.FleetState) -> list[Firing]:
        """The events queued since the last call, matched against their rules' node and model match,
        bursts counted: ``fired`` for a new firing, ``firing`` for one already active."""
        out: list[Firing] = []
        queued, self.queued = self.queued, []
        for rule, event in queued:
            n = state.node_index(event.node)
            labels = state.labels[n] if n is not None else {}
            model = None
            if n is not None and event.gpu_index is not None:
                model = state.gpu_info[n].get(event.gpu_index, (None, None))[0]
            if not rule.match.node_ok(event.node, labels):
                continue
            if rule.match.model is not None and not rule.match.model_ok(model):
                continue
            gpu = event.gpu_index if rule.scope == fields.Scope.GPU else None
            evidence: Evidence = {"kind": event.kind, "xid": event.xid, "message": event.message}
            if event.gpu_index is not None:
                evidence["gpu_index"] = event.gpu_index
            evidence.update(log_facts(event))
            if rule.on_event is not None and rule.on_event.repeat is not None:
                burst = self.repeats.observe(rule, event, gpu)
                if burst is None:
                    continue  # not a burst (yet)
                evidence.update(burst)
            key: Key = (rule.id, event.node, gpu, None)
            active = self.active.get(key)
            if active is not None:  # quiet periods run on the evaluator's clock, never the node's ts
                active.last, active.evidence = max(active.last, now), evidence
                out.append(
                    Firing(rule, event.node, gpu, Status.FIRING, active.since, now, evidence, event.gpu_uuid)
                )
                continue
            if rule.resolve_for_s > 0:
                self.active[key] = EventFiring(now, now, evidence, event.gpu_uuid)
            out.append(Firing(rule, event.node, gpu, Status.FIRED, now, now, evidence, event.gpu_uuid))
        return out


def log_facts(event: events.NodeEvent) -> Evidence:
    """What the kernel log added to an event (process, PCI address, decoded registers), for evidence."""
    facts: Evidence = {
        k: v
        for k, v in (("source", event.source), ("pid", event.pid), ("process", event.process),
                     ("pci_bus_id", event.pci_bus_id))
        if v is not None
    }  # fmt: skip
    facts.update({k: v for k, v in event.details.items() if k not in facts})
    return facts
