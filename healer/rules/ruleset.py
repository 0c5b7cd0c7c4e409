"""Loaded rules: what the engine evaluates and the controller reads (ids, severities, actions).

A ``RuleSet`` is immutable; hot reload builds a new one and swaps it in only when it loaded without
errors. ``Diagnostic`` is one error or warning with its file:line:column.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
from collections.abc import Mapping
from typing import Literal

from healer import actions as catalog
from healer.rules import recovery, tree
from healer.schemas import events, fields, incidents


@dataclasses.dataclass(frozen=True, slots=True)
class Diagnostic:
    path: str
    line: int
    col: int
    message: str
    severity: Literal["error", "warning"] = "error"

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.col}: {self.severity}: {self.message}"


@dataclasses.dataclass(frozen=True, slots=True)
class Match:
    model: str | None = None
    node: str | None = None
    labels: tuple[tuple[str, str], ...] = ()

    @property
    def everything(self) -> bool:
        return self.model is None and self.node is None and not self.labels

    def node_ok(self, node: str, labels: Mapping[str, str]) -> bool:
        if self.node is not None and not fnmatch.fnmatchcase(node, self.node):
            return False
        return all(k in labels and fnmatch.fnmatchcase(labels[k], v) for k, v in self.labels)

    def model_ok(self, model: str | None) -> bool:
        return self.model is None or (model is not None and fnmatch.fnmatchcase(model, self.model))


@dataclasses.dataclass(frozen=True, slots=True)
class Repeat:
    """A burst: ``count`` matching events on one target within ``within_s``, from ``pids`` processes."""

    count: int
    within_s: float
    pids: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class EventMatch:
    kind: events.EventKind
    xids: frozenset[int] | None = None
    repeat: Repeat | None = None
    details: tuple[tuple[str, events.DetailValue], ...] = ()
    """Decoded kernel-log fields the event must carry with these values (``{fatal: true}``)."""

    def matches(self, event: events.NodeEvent) -> bool:
        if event.kind != self.kind:
            return False
        if self.details and not all(
            k in event.details and event.details[k] == v and type(event.details[k]) is type(v)
            for k, v in self.details
        ):
            return False
        return self.xids is None or (event.xid is not None and event.xid in self.xids)


NODE_WIDE_WITHIN_S = 120.0
"""The default ``node_wide.within``."""


@dataclasses.dataclass(frozen=True, slots=True)
class NodeWide:
    """A GPU rule's node-wide grouping (``node_wide:``): firings of rules of one ``group`` on at least
    ``threshold(gpus)`` of a node's GPUs are one node incident (decided by the controller,
    ``controller.decide``; ``healer rules test`` shows it as ``incidents:``)."""

    group: str
    min_gpus: int = 2
    fraction: float = 0.5
    within_s: float = NODE_WIDE_WITHIN_S
    """A GPU firing this long after the group's incident opened joins it only once it is node-wide."""
    joins: tuple[str, ...] = ()
    """Other groups whose node-wide incident on the node explains this rule's firing: it joins that
    incident rather than opening its own (a straggler on a node whose power brake is one incident)."""

    def threshold(self, gpus: int) -> int:
        """GPUs that must fire for a node of ``gpus`` GPUs to be node-wide (never fewer than 2)."""
        return max(self.min_gpus, math.ceil(self.fraction * gpus - 1e-9))

    def reached(self, firing: int, gpus: int) -> bool:
        """``firing`` GPUs of a node of ``gpus`` (at least ``firing``) make it node-wide."""
        return firing >= self.threshold(max(gpus, firing))


@dataclasses.dataclass(frozen=True, slots=True)
class Rule:
    id: str
    severity: incidents.Severity
    scope: fields.Scope
    description: str = ""
    match: Match = Match()
    when: tree.Node | None = None
    when_text: str = ""
    on_event: EventMatch | None = None
    for_s: float = 0.0
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    actions: tuple[catalog.Action, ...] = ()
    resolve_when: tree.Node | None = None
    resolve_text: str = ""
    resolve_for_s: float = 0.0
    has_resolve: bool = False
    on_resolve: tuple[catalog.Action, ...] = ()
    cooldown_s: float = 0.0
    node_wide: NodeWide | None = None
    path: str = "<string>"
    line: int = 0

    @property
    def action_kinds(self) -> list[str]:
        return [a.kind for a in self.actions]


@dataclasses.dataclass(frozen=True, slots=True)
class RuleSet:
    rules: tuple[Rule, ...] = ()
    files: tuple[str, ...] = ()
    ladders: tuple[recovery.Ladder, ...] = ()
    """Recovery ladders (top-level ``ladders:`` in rule files); see healer.rules.recovery."""

    def ladder_for(self, rule_id: str) -> recovery.Ladder | None:
        """The ladder that takes over ``rule_id``'s incidents, if one does."""
        return next((lad for lad in self.ladders if rule_id in lad.rules), None)

    def by_id(self, rule_id: str) -> Rule | None:
        return next((r for r in self.rules if r.id == rule_id), None)

    @property
    def condition_rules(self) -> tuple[Rule, ...]:
        return tuple(r for r in self.rules if r.when is not None)

    @property
    def prompt_rules(self) -> tuple[Rule, ...]:
        """Condition rules that fire as soon as their condition holds (no ``for``): what an arrival
        evaluation (``Engine.evaluate_frames``) reads as frames come in, between ticks."""
        return tuple(r for r in self.rules if r.when is not None and r.for_s == 0)

    @property
    def event_rules(self) -> tuple[Rule, ...]:
        return tuple(r for r in self.rules if r.on_event is not None)


@dataclasses.dataclass(frozen=True, slots=True)
class LoadResult:
    """Either a RuleSet (``ok``) or the errors that kept it from loading; warnings in both cases."""

    ruleset: RuleSet | None
    diagnostics: tuple[Diagnostic, ...]

    @property
    def ok(self) -> bool:
        return self.ruleset is not None

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity == "error"]

    @property
    def warnings(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity == "warning"]
