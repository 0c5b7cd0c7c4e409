"""Evaluate expression trees over FleetState for the whole fleet at once.

Values are float arrays: (nodes, gpus) at GPU level, (nodes, 1) at node level, plain floats for
constants; numpy broadcasting does the rest. Conditions use three-valued logic: 1 true, 0 false, NaN
unknown (a null reading, a missing GPU, a stale node). A comparison with NaN is unknown, ``and``/``or``
follow Kleene logic (``false and unknown`` is false), and a rule fires only where its condition is
definitely true, so an unsupported reading never fires anything and never raises.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any, Final

import numpy as np

from healer.rules import state as fleet_state
from healer.rules import tree
from healer.schemas import fields

Value = Any  # numpy array or float
PORT_HITS: Final = "@ports"
"""Evidence key of the (nodes, port slots) mask of the ports that made a port aggregation what it is
(the slots ``count`` counted, the slots holding ``max``/``min``, the non-zero ones of ``sum``/``avg``);
the engine turns it into the port names (rules/port_state.py), never a value of its own."""
_CMP: Final[dict[str, Callable[[Any, Any], Any]]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
_ARITH: Final[dict[str, Callable[[Any, Any], Any]]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.truediv,
    "%": np.fmod,
}


class Evaluator:
    """One evaluation: caches metric reads and window reductions shared between rules. Over every node
    row (a tick), or only ``rows`` (the nodes whose frames just arrived): values then have one row per
    entry of ``rows``, in its order."""

    def __init__(
        self, state: fleet_state.FleetState, now: float, rows: fleet_state.Rows | None = None
    ) -> None:
        self.state = state
        self.now = now
        self.rows = state.rows(rows)
        self.n = state.n if rows is None or isinstance(rows, slice) else len(rows)
        self._cache: dict[tuple[Any, ...], Value] = {}

    def condition(self, root: tree.Node, text: str) -> tuple[Value, dict[str, Value]]:
        """The 0/1/NaN value of a condition, and the operands of its comparisons (the evidence)."""
        evidence: dict[str, Value] = {}
        with np.errstate(all="ignore"):
            value = self._eval(root, text, evidence)
        return value, evidence

    def _eval(self, node: tree.Node, text: str, evidence: dict[str, Value]) -> Value:
        if isinstance(node, tree.Num):
            return node.value
        if isinstance(node, tree.Ref):
            return self._read(("ref", node.name), lambda: self.state.instant(node.name, self.now, self.rows))
        if isinstance(node, tree.Unary):
            arg = self._eval(node.arg, text, evidence)
            return -arg if node.op == "-" else 1.0 - arg
        if isinstance(node, tree.Binary):
            left = self._eval(node.left, text, evidence)
            right = self._eval(node.right, text, evidence)
            if node.op in _CMP:
                for side, value in ((node.left, left), (node.right, right)):
                    if not isinstance(side, tree.Num):
                        evidence[text[side.pos : side.end]] = value
                return _compare(node.op, left, right)
            if node.op == "and":
                return np.where(
                    (np.asarray(left) == 0) | (np.asarray(right) == 0), 0.0, np.minimum(left, right)
                )
            if node.op == "or":
                return np.where(
                    (np.asarray(left) == 1) | (np.asarray(right) == 1), 1.0, np.maximum(left, right)
                )
            return _ARITH[node.op](np.asarray(left, dtype=np.float64), right)
        if isinstance(node, tree.Call):
            return self._call(node, text, evidence)
        raise TypeError(f"cannot evaluate {node!r}")  # pragma: no cover - parser never builds one

    def _call(self, node: tree.Call, text: str, evidence: dict[str, Value]) -> Value:
        arg = node.args[0]
        if isinstance(arg, tree.Range):
            key = ("win", node.func, arg.name, arg.window_s)
            func, name, window_s = node.func, arg.name, arg.window_s
            value = self._read(key, lambda: self.state.window(func, name, window_s, self.now, self.rows))
            if node.func != "absent":
                evidence[text[node.pos : node.end]] = value
            return value
        inner = np.asarray(self._eval(arg, text, evidence), dtype=np.float64)
        if node.func == "abs":
            return np.abs(inner)
        if (
            arg.level == fields.Scope.PORT
        ):  # a node whose frames carry no ports: its port aggregations are unknown
            unread = np.isnan(self.state.ports.present[self.rows][:, None])
            return np.where(unread, np.nan, self._aggregate(node, arg, inner, evidence))
        return self._aggregate(node, arg, inner, evidence)

    def _aggregate(self, node: tree.Call, arg: tree.Node, inner: Any, evidence: dict[str, Value]) -> Value:
        if inner.ndim < 2:  # the parser allows only GPU-level arguments; be safe with constants
            inner = np.broadcast_to(inner, (self.n, self.state.gpus))
        valid = ~np.isnan(inner)
        any_valid = valid.any(axis=1, keepdims=True)
        if arg.level == fields.Scope.PORT and inner.shape[1]:
            _port_hits(node.func, inner, evidence)
        if node.func == "count":
            return (inner == 1).sum(axis=1, keepdims=True).astype(np.float64)
        if node.func == "max":
            return np.fmax.reduce(inner, axis=1, keepdims=True)
        if node.func == "min":
            return np.fmin.reduce(inner, axis=1, keepdims=True)
        total = np.where(valid, inner, 0.0).sum(axis=1, keepdims=True)
        if node.func == "sum":
            return np.where(any_valid, total, np.nan)
        count = valid.sum(axis=1, keepdims=True)
        return np.where(any_valid, total / np.maximum(count, 1), np.nan)

    def _read(self, key: tuple[Any, ...], compute: Callable[[], Value]) -> Value:
        value = self._cache.get(key)
        if value is None:
            value = self._cache[key] = compute()
        return value


def _port_hits(func: str, inner: Any, evidence: dict[str, Value]) -> None:
    if func == "count":
        hit = inner == 1
    elif func in ("max", "min"):
        best = (np.fmax if func == "max" else np.fmin).reduce(inner, axis=1, keepdims=True)
        hit = inner == best
    else:
        hit = ~np.isnan(inner) & (inner != 0)
    before = evidence.get(PORT_HITS)
    evidence[PORT_HITS] = hit if before is None or before.shape != hit.shape else before | hit


def _compare(op: str, left: Value, right: Value) -> Value:
    result = _CMP[op](left, right)
    unknown = np.isnan(left) | np.isnan(right)
    return np.where(unknown, np.nan, np.asarray(result, dtype=np.float64))
