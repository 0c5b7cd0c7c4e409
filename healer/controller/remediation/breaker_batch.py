"""The circuit breaker's decision for many nodes at once: a burst admitted in one compare-and-set (#43).

A thousand nodes faulting together each ask the breaker whether they may be taken out of service. One
compare-and-set per node on the one breaker document makes them conflict with each other and re-read a
document that grows with every entry (quadratic work, and ``too much contention`` once 20 writers race).
``admit_all`` answers a batch of asks in order, exactly as ``gates.breaker_admission`` would answer each
against the document the one before it wrote: the same per-node verdicts (already counted, open, a
failure domain at its limit, the fleet-wide limit reached and the breaker tripped by that one ask), the
domain limits applied per node, the document's entries parsed once. ``policy.Breaker.admit`` gathers the
asks that arrive while a batch is being written and writes the next batch in one compare-and-set.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from healer import config
from healer.controller.incidents import gates
from healer.controller.inventory import blast


@dataclasses.dataclass(frozen=True, slots=True)
class Ask:
    """One node's request to be taken out of service."""

    node: str
    fleet_size: int
    incident_id: str
    domains: blast.View | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Known:
    """The breaker document at a revision, its entries parsed once (``Breaker`` keeps the one it wrote)."""

    value: dict[str, Any]
    revision: int
    entries: tuple[gates.BreakerEntry, ...]

    @classmethod
    def of(cls, value: dict[str, Any], revision: int) -> Known:
        return cls(value, revision, tuple(map(gates.BreakerEntry.of, value.get("entries") or [])))


class Decided(typing.NamedTuple):
    """What ``admit_all`` decided: each ask's admission in order, the document to write (None: nothing
    changes) and that document's entries, parsed (for the next batch's ``Known``)."""

    admissions: list[gates.BreakerAdmission]
    doc: dict[str, Any] | None
    entries: tuple[gates.BreakerEntry, ...]


def admit_all(
    state: Mapping[str, Any],
    asks: Sequence[Ask],
    now: float,
    settings: config.ControllerSettings,
    parsed: Sequence[gates.BreakerEntry] | None = None,
) -> Decided:
    """Each ask's admission, in order, and the document to write. The tripping ask's admission carries
    the document (its ``state``: the counted entries, for the breaker incident); the others carry none
    (the caller writes the one document). ``parsed``: ``state``'s entries already parsed (``Known``);
    None: parsed here."""
    window = settings.breaker_window_s
    raw = list(state.get("entries", []))
    if parsed is None:
        parsed = [gates.BreakerEntry.of(e) for e in raw]
    kept = [(e, r) for e, r in zip(parsed, raw, strict=True) if now - e.at < window]
    entries = [e for e, _ in kept]
    dumped = [r for _, r in kept]
    out = [e.node for e in entries]
    counted = set(out)
    doc: dict[str, Any] | None = None
    if state.get("open"):
        opened = f"circuit breaker open since {state.get('opened_at')}: {state.get('reason')}"
    else:
        opened = ""
    results: list[gates.BreakerAdmission] = []
    for ask in asks:
        if ask.node in counted:
            results.append(gates.BreakerAdmission(True, "node already counted in the breaker window"))
            continue
        if opened:
            results.append(gates.BreakerAdmission(False, opened))
            continue
        if ask.domains is not None and settings.domain_limits:
            hold = blast.domain_hold(out, ask.node, ask.domains, settings.domain_limits)
            if hold is not None:
                results.append(gates.BreakerAdmission(False, hold.reason, held=hold))
                continue
        limit = gates.limit_of(ask.fleet_size, settings)
        if len(entries) + 1 > limit:
            reason = (
                f"{len(entries) + 1} nodes in {window:g}s would exceed "
                f"the limit of {limit} (fleet of {ask.fleet_size})"
            )
            doc = {
                "open": True,
                "opened_at": now,
                "reason": reason,
                "entries": list(dumped),
                "refused": [ask.node, ask.incident_id],
            }
            opened = f"circuit breaker open since {now}: {reason}"
            results.append(gates.BreakerAdmission(False, reason, tripped=True, state=doc))
            continue
        entry = gates.BreakerEntry(ask.node, now, ask.incident_id)
        entries.append(entry)
        dumped.append(entry.dump())
        out.append(ask.node)
        counted.add(ask.node)
        doc = {"open": False, "entries": dumped}
        results.append(gates.BreakerAdmission(True, f"{len(entries)} of {limit} in the window"))
    return Decided(results, doc, tuple(entries))
