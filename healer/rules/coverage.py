"""Which catalogued XIDs a rule set leaves unhandled.

A rule set that handles XIDs at all (it has an ``on_event`` rule of kind ``xid``) should match every
XID whose immediate action in NVIDIA's catalog is a reset, a reboot, support or a hardware check
(``xids.NEEDS_RULE``); otherwise that XID reaches the controller and is dropped without a word.
A burst rule (``repeat``) or one that needs decoded log fields (``details``) does not count: a single
XID, or one NVML reported without a log line, would still go unmatched. Rule sets
without XID rules (a thermal-only file being linted) are not asked to cover anything.
"""

from __future__ import annotations

from healer.rules import ruleset
from healer.schemas import xids


def uncovered(rules: ruleset.RuleSet, catalog: xids.Catalog | None = None) -> list[xids.Xid]:
    """Catalogued XIDs that need action and match no single-event XID rule (empty without XID rules)."""
    catalog = catalog or xids.load()
    xid_rules = [r.on_event for r in rules.event_rules if r.on_event is not None and r.on_event.kind == "xid"]
    if not xid_rules:
        return []
    single = [m for m in xid_rules if m.repeat is None and not m.details]
    if any(m.xids is None for m in single):
        return []
    matched = set().union(*(m.xids or frozenset() for m in single))
    return [x for x in catalog.needing_rules if x.code not in matched]


def warnings(rules: ruleset.RuleSet, catalog: xids.Catalog | None = None) -> list[ruleset.Diagnostic]:
    """One warning per uncovered XID for ``healer rules check``, placed at the set's first XID rule."""
    gaps = uncovered(rules, catalog)
    if not gaps:
        return []
    first = next(r for r in rules.event_rules if r.on_event is not None and r.on_event.kind == "xid")
    return [
        ruleset.Diagnostic(
            first.path,
            first.line,
            5,
            f"XID {x.code} ({x.name}; NVIDIA's immediate action: {x.action}) matches no rule of this set:"
            " add it to an on_event xid rule",
            "warning",
        )
        for x in gaps
    ]
