"""The typed expression tree a ``when`` string parses into.

Every node knows its value type (``num`` or ``bool``, booleans being 0/1) and its level: ``const``
(the same everywhere), ``node`` (one value per node), ``gpu`` (one per GPU) or ``port`` (one per RDMA
port of the node; rules/port_state.py). The parser fills both in
and refuses mixtures that cannot mean anything, so evaluation never meets a type error at run time.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from healer.schemas import fields

ValueType = Literal["num", "bool"]
Level = Literal["const"] | fields.Scope
"""What a value is per: a constant, or a metric's scope (``schemas.fields.Scope``)."""

RANGE_FUNCTIONS = {
    "rate": "per-second increase of a counter over the window, counter resets handled",
    "increase": "increase of a counter over the window, counter resets handled",
    "delta": "last value minus first value of a gauge over the window",
    "changes": "number of times the value changed within the window",
    "avg_over_time": "average of the samples in the window",
    "max_over_time": "largest sample in the window",
    "min_over_time": "smallest sample in the window",
    "absent": "1 when there is no sample in the window (absent(telemetry[2m]): no frame from the node)",
}
AGGREGATIONS = {
    "count": "number of the node's GPUs (or RDMA ports) for which a condition holds",
    "max": "largest value over the node's GPUs (or ports)",
    "min": "smallest value over the node's GPUs (or ports)",
    "avg": "average over the node's GPUs (or ports)",
    "sum": "sum over the node's GPUs (or ports)",
}
SCALAR_FUNCTIONS = {"abs": "absolute value"}

_LEVEL_RANK = {"const": 0, "node": 1, "gpu": 2, "port": 3}
"""GPU and port values never meet in one operation (the parser refuses it); ranks order the rest."""


def widest(*levels: Level) -> Level:
    return max(levels, key=_LEVEL_RANK.__getitem__)


@dataclasses.dataclass(frozen=True, slots=True)
class Node:
    pos: int
    end: int
    type: ValueType
    level: Level


@dataclasses.dataclass(frozen=True, slots=True)
class Num(Node):
    value: float


@dataclasses.dataclass(frozen=True, slots=True)
class Ref(Node):
    """An instant metric reference; ``name`` is the canonical healer name."""

    name: str


@dataclasses.dataclass(frozen=True, slots=True)
class Range(Node):
    """``metric[window]``: only valid as the argument of a range function."""

    name: str
    window_s: float


@dataclasses.dataclass(frozen=True, slots=True)
class Unary(Node):
    op: Literal["-", "not"]
    arg: Node


@dataclasses.dataclass(frozen=True, slots=True)
class Binary(Node):
    op: str
    left: Node
    right: Node


@dataclasses.dataclass(frozen=True, slots=True)
class Call(Node):
    func: str
    args: tuple[Node, ...]


COMPARISONS = frozenset({"==", "!=", "<", "<=", ">", ">="})
ARITHMETIC = frozenset({"+", "-", "*", "/", "%"})
LOGICAL = frozenset({"and", "or"})


def walk(node: Node) -> list[Node]:
    """Every node of the tree, depth first."""
    out = [node]
    if isinstance(node, Unary):
        out += walk(node.arg)
    elif isinstance(node, Binary):
        out += walk(node.left) + walk(node.right)
    elif isinstance(node, Call):
        for arg in node.args:
            out += walk(arg)
    return out
