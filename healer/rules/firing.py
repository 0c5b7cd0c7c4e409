"""What the rule engine reports: a ``Firing`` (a transition or an ongoing firing of one rule on one target)
with its ``Status``, ``Key`` and ``Evidence``, and what forgetting silent nodes resolved (``Forgotten``).
``rules.engine`` produces them and re-exports these names (``engine.Firing`` ...), which the controller
reads."""

from __future__ import annotations

import dataclasses
import enum

from healer.rules import ruleset


class Status(enum.StrEnum):
    """Where a firing is in its life, declared once: code compares with the members, never the words."""

    FIRED = "fired"
    """Started firing at this evaluation (a new incident, or an event on an open one)."""
    FIRING = "firing"
    """Still firing (reported by every evaluation while it lasts)."""
    RESOLVED = "resolved"
    """Stopped firing (or its node was forgotten)."""


Evidence = dict[str, float | int | str | bool | None]
Key = tuple[str, str, int | None, str | None]
"""A firing's target: (rule id, node, GPU index or None, port name such as ``mlx5_0/1`` or None)."""
FORGOTTEN = "node forgotten: silent longer than its retention"
"""The evidence ``reason`` of a firing resolved because its node was forgotten (``forget_silent``)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Firing:
    """One transition or ongoing firing of a rule on one target: a GPU, a node (``gpu`` and ``port``
    None) or an RDMA port of a port-scope rule (``port``: ``mlx5_0/1``)."""

    rule: ruleset.Rule
    node: str
    gpu: int | None
    status: Status
    since: float
    """When it fired (for ``resolved``: when the firing started)."""
    at: float
    evidence: Evidence
    gpu_uuid: str | None = None
    port: str | None = None

    @property
    def rule_id(self) -> str:
        return self.rule.id

    @property
    def key(self) -> Key:
        return (self.rule.id, self.node, self.gpu, self.port)


@dataclasses.dataclass(frozen=True, slots=True)
class Forgotten:
    """What ``forget_silent`` did: the nodes forgotten, and their firings, now resolved."""

    nodes: list[str]
    resolved: list[Firing]
