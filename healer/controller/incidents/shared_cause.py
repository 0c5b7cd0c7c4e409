"""Shared-cause domain incidents (#27): several nodes of one failure domain faulting together are one
fault of the domain (a leaf switch, a PDU, a CDU), not N node faults.

Built on correlation (``correlation.correlate`` joins one node's firings into one incident); this joins
nodes. ``findings`` looks at the open node incidents opened within their rule's window: where at least
the rule's minimum count of nodes of one domain (``shared_cause_keys``, or every topology key) have
incidents of the same rule (the same kind of signal: silent, IB link down, inlet rise, power loss),
that domain is suspected. The window and the count are ``shared_cause_window_s`` and
``shared_cause_min_nodes``, or the rule's entry in ``shared_cause_rules`` (``terms``). Of the domains
that explain the same nodes the smallest is named (a leaf switch rather than its spine); a domain that
explains more of them (two leaves' worth under one spine) wins over those it covers.

A ``shared-cause`` incident (node ``<key>.<value>``) names the domain, the suspected component, the rule
and its members (evidence ``members``, ``member_incidents``); its opening is on the feed like every
incident, so it notifies. While it is open, its members' repairs that presume the node itself is broken
(the action catalogue's ``held_by_shared_cause`` kinds: GPU reset, port link reset, reboot, hardware
replacement) wait; containment (cordon, drain, migrate, notify) and the return to service still run. A
member that recovers on its own (its signals stop firing) is returned without its held repair:
``needless`` skips it, and a recovery ladder goes straight to the return to service
(``ladder.Outcome.RECOVERED``); every member incident names its domain incident (``held_by_incident``)
from the moment it joins, so a repair planned after the domain recovered is known as needless too. A
member faulting later with the same rule joins it. It resolves when no member's signal fires any more
(the domain recovered). Pure: the incident shell applies what these functions return.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from collections.abc import Iterable, Sequence

from healer import actions, config
from healer.controller.incidents import book
from healer.controller.inventory import topology
from healer.schemas import incidents

RULE_ID = "shared-cause"
RECOVERED_DETAIL = "the node recovered while its domain was suspected: returned without it"
RECOVERED_FACT = "recovered_while_held"
"""The fact a skipped held repair carries (``PlannedAction.facts``): the recovery ladder reads it."""
IGNORED_RULES: frozenset[str] = frozenset({RULE_ID, "circuit-breaker"})


@dataclasses.dataclass(frozen=True, slots=True)
class Finding:
    key: str
    value: str
    rule_id: str
    members: tuple[str, ...]
    incidents: tuple[str, ...]
    size: int
    """Nodes in the domain."""

    @property
    def domain(self) -> str:
        return f"{self.key}={self.value}"

    @property
    def node(self) -> str:
        """The incident's ``node``: ``<key>.<value>``, in the characters a node name may have."""
        return domain_node(self.key, self.value)


def domain_node(key: str, value: str) -> str:
    """A domain incident's ``node`` (shared-cause, power-budget): ``<key>.<value>``, in the characters a
    node name (and a KV key) may have."""
    name = re.sub(r"[^A-Za-z0-9._-]", "_", f"{key}.{value}")
    return name if name[0].isalnum() else "d" + name


@dataclasses.dataclass(frozen=True, slots=True)
class Terms:
    """One rule's shared-cause window and minimum count (``controller.shared_cause_rules``)."""

    window_s: float
    min_nodes: int


def terms(rule_id: str, settings: config.ControllerSettings) -> Terms:
    """``rule_id``'s terms: an exact ``shared_cause_rules`` entry, else the longest matching glob, else
    the fleet-wide ``shared_cause_window_s`` / ``shared_cause_min_nodes``; a field left unset in the
    entry is the fleet-wide value. With ``shared_cause_window_s`` 0, nothing is a shared cause."""
    rules = settings.shared_cause_rules
    entry = rules.get(rule_id)
    if entry is None:
        globs = [g for g in rules if fnmatch.fnmatchcase(rule_id, g)]
        entry = rules[max(globs, key=lambda g: (len(g), g))] if globs else None
    window = settings.shared_cause_window_s
    if window and entry is not None and entry.window_s is not None:
        window = entry.window_s
    count = entry.min_nodes if entry is not None and entry.min_nodes is not None else None
    return Terms(window, count or settings.shared_cause_min_nodes)


def longest_window_s(settings: config.ControllerSettings) -> float:
    """The longest window of any rule (the shell's cheap "anything recent?" check)."""
    if not settings.shared_cause_window_s:
        return 0.0
    windows = [r.window_s for r in settings.shared_cause_rules.values() if r.window_s is not None]
    return max([settings.shared_cause_window_s, *windows])


def findings(
    open_incidents: Iterable[book.Incident],
    believed: topology.Topology,
    now: float,
    settings: config.ControllerSettings,
) -> list[Finding]:
    """The suspected domains now (see the module docstring), most specific first."""
    if not settings.shared_cause_window_s:
        return []
    recent: dict[str, dict[str, str]] = {}  # rule -> node -> incident id
    for inc in open_incidents:
        if inc.rule_id in IGNORED_RULES or inc.state == incidents.IncidentState.RESOLVED:
            continue
        window = terms(inc.rule_id, settings).window_s
        if not window or now - inc.opened_at > window:
            continue
        recent.setdefault(inc.rule_id, {}).setdefault(inc.node, inc.id)
    keys = settings.shared_cause_keys or believed.keys()
    found: list[Finding] = []
    for rule_id, nodes in sorted(recent.items()):
        least = terms(rule_id, settings).min_nodes
        candidates: list[Finding] = []
        for key in keys:
            for value, members in believed.groups(key).items():
                hit = sorted(n for n in members if n in nodes)
                if len(hit) >= least:
                    ids = tuple(nodes[n] for n in hit)
                    candidates.append(Finding(key, value, rule_id, tuple(hit), ids, len(members)))
        found.extend(_most_specific(candidates))
    return found


def _most_specific(candidates: Sequence[Finding]) -> list[Finding]:
    def beaten(x: Finding) -> bool:
        mx = set(x.members)
        for y in candidates:
            if y is x:
                continue
            my = set(y.members)
            if my > mx or (my == mx and (y.size, y.key, y.value) < (x.size, x.key, x.value)):
                return True
        return False

    return sorted((c for c in candidates if not beaten(c)), key=lambda c: (c.size, c.key, c.value))


def members_of(inc: book.Incident) -> list[str]:
    if inc.domain is not None and inc.domain.member_count == len(inc.domain.members):
        return list(inc.domain.members)
    return [n for n in str(inc.evidence.get("members") or "").split(",") if n]


def member_incidents(inc: book.Incident) -> list[str]:
    return [i for i in str(inc.evidence.get("member_incidents") or "").split(",") if i]


def open_domain_incidents(open_incidents: Iterable[book.Incident]) -> list[book.Incident]:
    return [i for i in open_incidents if i.rule_id == RULE_ID and i.state != incidents.IncidentState.RESOLVED]


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    """What to do this tick: open these findings, add members to these incidents, resolve these."""

    open: list[Finding]
    grow: list[tuple[book.Incident, Finding]]
    resolve: list[book.Incident]


def plan(found: Sequence[Finding], open_incidents: Sequence[book.Incident], firing: set[str]) -> Plan:
    """``found`` against the open domain incidents. ``firing``: ids of the node incidents whose signals
    still fire; a domain incident none of whose members still fires resolves (the domain recovered)."""
    existing = open_domain_incidents(open_incidents)
    by_domain = {(str(i.evidence.get("domain")), str(i.evidence.get("signal_rule"))): i for i in existing}
    to_open: list[Finding] = []
    grow: list[tuple[book.Incident, Finding]] = []
    for f in found:
        inc = by_domain.get((f.domain, f.rule_id))
        if inc is not None:
            if set(f.members) - set(members_of(inc)):
                grow.append((inc, f))
            continue
        covered = any(
            str(i.evidence.get("signal_rule")) == f.rule_id and set(f.members) <= set(members_of(i))
            for i in existing
        )
        if not covered:
            to_open.append(f)
    resolve = [i for i in existing if not any(m in firing for m in member_incidents(i))]
    return Plan(to_open, grow, resolve)


def new_incident(
    f: Finding, incident_id: str, now: float, settings: config.ControllerSettings
) -> book.Incident:
    return book.Incident(
        id=incident_id,
        rule_id=RULE_ID,
        severity="critical",
        node=f.node,
        summary=(
            f"{f.key} {f.value} suspected: {len(f.members)} of its {f.size} nodes fired {f.rule_id} within "
            f"{terms(f.rule_id, settings).window_s:g}s ({', '.join(f.members)[:400]}). Their GPU resets and "
            "reboots wait while this is open; containment still runs."
        ),
        evidence=evidence(f),
        domain=domain(f),
        mode=settings.mode,
        opened_at=now,
        updated_at=now,
    )


def evidence(f: Finding, before: Sequence[str] = (), before_ids: Sequence[str] = ()) -> dict[str, str | int]:
    members = list(dict.fromkeys([*before, *f.members]))
    ids = list(dict.fromkeys([*before_ids, *f.incidents]))
    return {
        "domain": f.domain,
        "domain_key": f.key,
        "domain_value": f.value,
        "suspected": f"{f.key} {f.value}",
        "signal_rule": f.rule_id,
        "members": ",".join(members)[:4000],
        "member_incidents": ",".join(ids)[:4000],
        "member_count": len(members),
        "domain_size": f.size,
    }


def domain(f: Finding, before: Sequence[str] = (), before_ids: Sequence[str] = ()) -> incidents.Domain:
    """The structured domain the feed carries (``data.domain``, v2), beside the flat ``evidence``."""
    members = list(dict.fromkeys([*before, *f.members]))
    ids = list(dict.fromkeys([*before_ids, *f.incidents]))
    cap = incidents.DOMAIN_MEMBERS_MAX
    return incidents.Domain(
        key=f.key[:128], value=f.value[:253], suspected=f"{f.key} {f.value}"[:512],
        signal_rule=f.rule_id[:128], members=members[:cap], member_incidents=ids[:cap],
        member_count=len(members), size=f.size,
    )  # fmt: skip


def holding(node: str, kind: str, open_incidents: Iterable[book.Incident]) -> book.Incident | None:
    """The open shared-cause incident that holds ``kind`` on ``node``, or None."""
    if not actions.spec(kind).held_by_shared_cause:
        return None
    return next((i for i in open_domain_incidents(open_incidents) if node in members_of(i)), None)


def recovered(inc: book.Incident) -> bool:
    """The node incident resolved, or none of its signals fires any more (a recovery ladder keeps the
    incident open after its rule resolved, until the ladder ends)."""
    return inc.state == incidents.IncidentState.RESOLVED or not any(s.open for s in inc.signals)


def needless(inc: book.Incident, kind: str, on_resolve: bool) -> bool:
    """A repair a shared-cause incident held on ``inc``, whose node has recovered on its own since (while
    the domain was suspected, or after): never run it; the node is returned without it."""
    return (
        actions.spec(kind).held_by_shared_cause
        and not on_resolve
        and bool(inc.evidence.get("held_by_incident"))
        and recovered(inc)
    )
