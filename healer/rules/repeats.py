"""Repeat patterns for event rules: count matching events per target over a sliding window.

An event rule with ``on_event.repeat`` fires only once ``count`` matching events have reached one
target (a GPU for ``scope: gpu``, a node for ``scope: node``) within ``within`` seconds, and, with
``pids``, only when at least that many different processes are among them (an XID that names no
process, as NVML's events do, adds none). That is how a burst of application XIDs across jobs, which
points at the GPU rather than at one program, escalates while a single one only notifies. Windows run
on the events' own timestamps (one node's clock per target). Memory: one short deque per target that
saw a matching event, pruned to the window on every new event.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable

from healer.rules import ruleset
from healer.schemas import events

Key = tuple[str, str, int | None]
Evidence = dict[str, float | int | str | bool | None]


class Counter:
    def __init__(self) -> None:
        self._seen: dict[Key, collections.deque[tuple[float, int | None, str]]] = {}

    def observe(self, rule: ruleset.Rule, event: events.NodeEvent, gpu: int | None) -> Evidence | None:
        """Record a matching event (an event delivered again counts once, by its id); the burst's evidence
        once the rule's repeat pattern holds, else None."""
        assert rule.on_event is not None
        repeat = rule.on_event.repeat
        assert repeat is not None
        key = (rule.id, event.node, gpu)
        seen = self._seen.setdefault(key, collections.deque())
        if all(seen_id != event.id for _, _, seen_id in seen):  # delivered again (a failed step): once
            seen.append((event.ts, event.pid, event.id))
        newest = max(ts for ts, _, _ in seen)
        while seen and seen[0][0] <= newest - repeat.within_s:
            seen.popleft()
        pids = sorted({pid for _, pid, _ in seen if pid is not None})
        if len(seen) < repeat.count or len(pids) < repeat.pids:
            return None
        return {"count": len(seen), "within_s": repeat.within_s, "pids": ",".join(map(str, pids))}

    def retain(self, rule_ids: Iterable[str]) -> None:
        """Forget the counts of rules no longer loaded (a reload)."""
        keep = set(rule_ids)
        self._seen = {k: v for k, v in self._seen.items() if k[0] in keep}

    def __len__(self) -> int:
        return len(self._seen)
