"""Node-wide groups of firings: most of a node's GPUs firing rules of one ``node_wide`` group are one
fault of the node, not one per GPU.

The controller makes the incidents (``controller.decide``: a GPU's incident that the node's other GPUs
join, and that becomes the node's incident once ``NodeWide.threshold`` of them fired). This module is
the same grouping over a set of firings at one instant, with no history, for ``healer rules test``'s
``incidents:`` expectations and for tools that want to show what is node-wide now.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from healer.rules import engine, ruleset
from healer.schemas import fields


@dataclasses.dataclass(frozen=True, slots=True)
class NodeGroup:
    """Firings of one node-wide group on enough of one node's GPUs: one node incident."""

    rule: ruleset.Rule
    """The rule of the group's earliest firing (the incident's rule)."""
    node: str
    gpus: tuple[int, ...]
    node_gpus: int
    firings: tuple[engine.Firing, ...]

    @property
    def rule_id(self) -> str:
        return self.rule.id


def collapse(
    firings: Iterable[engine.Firing], gpu_count: Callable[[str], int]
) -> list[engine.Firing | NodeGroup]:
    """``firings`` with every node-wide group that reached its threshold on a node (``gpu_count``: the
    GPUs the node has) replaced by one ``NodeGroup``; every other firing as it is, in order."""
    items = list(firings)
    groups: dict[tuple[str, str], list[engine.Firing]] = {}
    for f in items:
        nw = f.rule.node_wide
        if (
            nw is not None
            and f.gpu is not None
            and f.rule.scope == fields.Scope.GPU
            and f.status != engine.Status.RESOLVED
        ):
            groups.setdefault((f.node, nw.group), []).append(f)
    out: list[engine.Firing | NodeGroup] = []
    done: set[tuple[str, str]] = set()
    for f in items:
        nw = f.rule.node_wide
        key = (f.node, nw.group) if nw is not None else None
        members = groups.get(key) if key is not None else None
        if key is None or members is None:
            out.append(f)
            continue
        gpus = tuple(sorted({m.gpu for m in members if m.gpu is not None}))
        first = min(members, key=lambda m: (m.since, m.gpu if m.gpu is not None else -1))
        assert first.rule.node_wide is not None
        total = max(gpu_count(f.node), len(gpus))
        if not first.rule.node_wide.reached(len(gpus), total):
            out.append(f)
        elif key not in done:
            done.add(key)
            out.append(NodeGroup(first.rule, f.node, gpus, total, tuple(members)))
    return out
