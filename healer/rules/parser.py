"""Parse a ``when`` expression into a typed tree (tree.py): a Pratt parser over lexer tokens.

Names are resolved against the metric catalog, function arities and argument kinds are checked, and a
rule's scope decides which levels are allowed: a node-scope rule must aggregate GPU metrics
(``max(temp_c)``), RDMA port metrics are aggregated over the node's ports (``count(port_state != 4)``)
except in a port-scope rule, which reads them one port at a time (``port_state != 4``) beside node
metrics and never GPU ones, and GPU and port values never meet in one operation. Syntax errors stop
the parse; every other problem is collected so that ``healer rules check`` reports them all at once.
Errors carry the offset inside the expression.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from healer import durations, errors
from healer.rules import lexer, metric_catalog, tree
from healer.schemas import fields

Problem = lexer.SyntaxProblem

# Binding powers, lowest first.
_INFIX: dict[str, int] = {"or": 10, "||": 10, "and": 20, "&&": 20}
_INFIX.update(dict.fromkeys(tree.COMPARISONS, 40))
_INFIX.update({"+": 50, "-": 50, "*": 60, "/": 60, "%": 60})
_NOT_BP = 30
_NEG_BP = 70
_ALIASES = {"&&": "and", "||": "or", "!": "not"}


@dataclasses.dataclass(slots=True)
class Parsed:
    root: tree.Node | None
    problems: list[Problem]


class _Parser:
    def __init__(self, src: str) -> None:
        self.src = src
        self.toks = lexer.tokenize(src)
        self.i = 0
        self.problems: list[Problem] = []

    # -- token helpers
    def at_end(self) -> bool:
        return self.toks[self.i].kind == "end"

    @property
    def tok(self) -> lexer.Token:
        return self.toks[self.i]

    def take(self) -> lexer.Token:
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def expect(self, text: str) -> lexer.Token:
        if self.tok.text != text:
            found = "end of expression" if self.tok.kind == "end" else repr(self.tok.text)
            raise Problem(f"expected {text!r}, found {found}", self.tok.pos)
        return self.take()

    def problem(self, message: str, node_or_pos: tree.Node | int) -> None:
        pos = node_or_pos if isinstance(node_or_pos, int) else node_or_pos.pos
        self.problems.append(Problem(message, pos))

    # -- Pratt loop
    def expr(self, min_bp: int = 0) -> tree.Node:
        left = self.prefix()
        while True:
            tok = self.tok
            op = _ALIASES.get(tok.text, tok.text)
            bp = _INFIX.get(tok.text) if tok.kind in ("op", "ident") else None
            if bp is None or bp <= min_bp:
                if tok.kind == "ident" and bp is None and tok.text not in ("and", "or"):
                    raise Problem(f"unexpected name {tok.text!r}: missing an operator?", tok.pos)
                return left
            self.take()
            right = self.expr(bp)
            if op in tree.COMPARISONS and self.tok.text in tree.COMPARISONS:
                raise Problem("comparisons do not chain: use 'and' (a < b and b < c)", self.tok.pos)
            left = self.binary(op, left, right)

    def prefix(self) -> tree.Node:
        tok = self.take()
        if tok.kind == "num":
            value = float(int(tok.text, 16)) if tok.text[:2].lower() == "0x" else float(tok.text)
            return tree.Num(tok.pos, tok.end, "num", "const", value)
        if tok.kind == "dur":
            raise Problem(f"a duration ({tok.text}) only goes inside [ ] after a metric", tok.pos)
        if tok.text in ("-", "+"):
            arg = self.expr(_NEG_BP)
            self.need(arg, "num", f"'{tok.text}' needs a number")
            if tok.text == "+":
                return arg
            return tree.Unary(tok.pos, arg.end, "num", arg.level, "-", arg)
        if tok.text in ("not", "!"):
            arg = self.expr(_NOT_BP)
            self.need(arg, "bool", "'not' needs a condition")
            return tree.Unary(tok.pos, arg.end, "bool", arg.level, "not", arg)
        if tok.text == "(":
            inner = self.expr()
            close = self.expect(")")
            return dataclasses.replace(inner, pos=tok.pos, end=close.end)
        if tok.kind == "ident":
            if tok.text in ("true", "false"):
                return tree.Num(tok.pos, tok.end, "bool", "const", 1.0 if tok.text == "true" else 0.0)
            if self.tok.text == "(":
                return self.call(tok)
            return self.reference(tok)
        found = "end of expression" if tok.kind == "end" else repr(tok.text)
        raise Problem(f"expected a number, metric or '(', found {found}", tok.pos)

    def need(self, node: tree.Node, want: tree.ValueType, message: str) -> None:
        if node.type != want:
            got = "a condition" if node.type == "bool" else "a number"
            self.problem(f"{message}, got {got}: {self.src[node.pos : node.end]}", node)

    # -- operands
    def reference(self, tok: lexer.Token) -> tree.Node:
        if self.tok.text == "[":
            return self.range(tok)
        if tok.text == metric_catalog.TELEMETRY:
            self.problem("'telemetry' only appears as absent(telemetry[window])", tok.pos)
            return tree.Num(tok.pos, tok.end, "num", fields.Scope.NODE, 0.0)
        metric = metric_catalog.resolve(tok.text)
        if metric is None:
            self.problem(f"unknown metric {tok.text!r}{_suggest(tok.text)}", tok.pos)
            return tree.Num(tok.pos, tok.end, "num", fields.Scope.GPU, 0.0)
        typ: tree.ValueType = "bool" if metric.kind == "bool" else "num"
        return tree.Ref(tok.pos, tok.end, typ, metric.level, metric.name)

    def range(self, tok: lexer.Token) -> tree.Node:
        self.expect("[")
        dur = self.take()
        if dur.kind != "dur":
            raise Problem(f"expected a duration such as 5m inside [ ], found {dur.text!r}", dur.pos)
        close = self.expect("]")
        try:
            window_s = durations.parse(dur.text)
        except durations.DurationError as e:
            raise Problem(str(e), dur.pos) from None
        if window_s <= 0:
            self.problem("a window must be longer than 0s", dur.pos)
        if tok.text == metric_catalog.TELEMETRY:
            return tree.Range(
                tok.pos, close.end, "num", fields.Scope.NODE, metric_catalog.TELEMETRY, window_s
            )
        metric = metric_catalog.resolve(tok.text)
        if metric is None:
            self.problem(f"unknown metric {tok.text!r}{_suggest(tok.text)}", tok.pos)
            return tree.Range(tok.pos, close.end, "num", fields.Scope.GPU, "temp_c", window_s)
        if not metric.history:
            self.problem(f"{metric.name} keeps no history: use it without [ ] (and 'for:' to hold)", tok.pos)
        return tree.Range(tok.pos, close.end, "num", metric.level, metric.name, window_s)

    def call(self, name: lexer.Token) -> tree.Node:
        self.expect("(")
        args: list[tree.Node] = []
        if self.tok.text != ")":
            args.append(self.expr())
            while self.tok.text == ",":
                self.take()
                args.append(self.expr())
        close = self.expect(")")
        func = name.text
        builder = _CALLS.get(func)
        if builder is None:
            known = ", ".join(sorted(_CALLS))
            raise Problem(f"unknown function {func!r} (known: {known})", name.pos)
        if len(args) != 1:
            raise Problem(f"{func}() takes exactly one argument, got {len(args)}", name.pos)
        return builder(self, name.pos, close.end, args[0])

    def binary(self, op: str, left: tree.Node, right: tree.Node) -> tree.Node:
        level = tree.widest(left.level, right.level)
        if {left.level, right.level} == {fields.Scope.GPU, fields.Scope.PORT}:
            self.problem(
                "a GPU value and an RDMA port value cannot meet in one operation: aggregate one of them "
                "over the node first, e.g. count(port_state != 4)",
                right if right.level == fields.Scope.PORT else left,
            )
        if op in tree.LOGICAL:
            self.need(left, "bool", f"'{op}' needs conditions on both sides")
            self.need(right, "bool", f"'{op}' needs conditions on both sides")
            return tree.Binary(left.pos, right.end, "bool", level, op, left, right)
        for side in (left, right):
            if isinstance(side, tree.Range):
                self.problem("a range (metric[window]) needs a function such as rate() around it", side)
        typ: tree.ValueType = "bool" if op in tree.COMPARISONS else "num"
        return tree.Binary(left.pos, right.end, typ, level, op, left, right)


def _range_call(p: _Parser, pos: int, end: int, func: str, arg: tree.Node) -> tree.Node:
    if not isinstance(arg, tree.Range):
        p.problem(f"{func}() takes a range such as {func}(metric[5m])", arg)
        return tree.Num(pos, end, "num", arg.level, 0.0)
    if arg.name == metric_catalog.TELEMETRY and func != "absent":
        p.problem("'telemetry' only appears as absent(telemetry[window])", arg)
    metric = metric_catalog.ALL.get(arg.name)
    if func in ("rate", "increase") and metric is not None and metric.kind != "counter":
        p.problem(
            f"{func}() is for counters; {arg.name} is a {metric.kind}: use delta() or *_over_time()", arg
        )
    typ: tree.ValueType = "bool" if func == "absent" else "num"
    return tree.Call(pos, end, typ, arg.level, func, (arg,))


def _aggregation(p: _Parser, pos: int, end: int, func: str, arg: tree.Node) -> tree.Node:
    if isinstance(arg, tree.Range):
        p.problem(f"{func}() aggregates over the node's GPUs; for a window use {func}_over_time()", arg)
    elif arg.level not in (fields.Scope.GPU, fields.Scope.PORT):
        p.problem(
            f"{func}() aggregates over the node's GPUs or ports: its argument must read a GPU or port metric",
            arg,
        )
    if func == "count":
        p.need(arg, "bool", "count() counts GPUs (or ports) for which a condition holds")
    return tree.Call(pos, end, "num", fields.Scope.NODE, func, (arg,))


def _abs(p: _Parser, pos: int, end: int, arg: tree.Node) -> tree.Node:
    p.need(arg, "num", "abs() needs a number")
    return tree.Call(pos, end, "num", arg.level, "abs", (arg,))


def _bind(kind: Callable[..., tree.Node], func: str) -> Callable[[_Parser, int, int, tree.Node], tree.Node]:
    return lambda p, pos, end, arg: kind(p, pos, end, func, arg)


_CALLS: dict[str, Callable[[_Parser, int, int, tree.Node], tree.Node]] = {
    **{f: _bind(_range_call, f) for f in tree.RANGE_FUNCTIONS},
    **{f: _bind(_aggregation, f) for f in tree.AGGREGATIONS},
    "abs": _abs,
}


def _suggest(name: str) -> str:
    import difflib

    close = difflib.get_close_matches(name, [*metric_catalog.ALL, *metric_catalog.DCGM_ALIASES], n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def parse(src: str, scope: tree.Level = fields.Scope.GPU, *, condition: bool = True) -> Parsed:
    """Parse and check one expression. ``condition``: it must be a 0/1 condition (``when``, ``resolve``)."""
    try:
        p = _Parser(src)
        if p.tok.kind == "end":
            return Parsed(None, [Problem("empty expression", 0)])
        root = p.expr()
        if not p.at_end():
            raise Problem(f"unexpected {p.tok.text!r} after the end of the expression", p.tok.pos)
    except Problem as e:
        return Parsed(None, [e])
    except errors.RuleError as e:
        return Parsed(None, [Problem(e.message, 0)])
    if isinstance(root, tree.Range):
        p.problem("a range (metric[window]) needs a function such as rate() around it", root)
    if condition and root.type != "bool":
        p.problem("this must be a condition (a comparison, and/or/not, absent(), or a 0/1 metric)", root)
    if scope == fields.Scope.NODE and root.level == fields.Scope.GPU:
        for node in tree.walk(root):
            if (
                isinstance(node, tree.Ref | tree.Range)
                and node.level == fields.Scope.GPU
                and not _inside_agg(root, node)
            ):
                p.problem(
                    f"GPU metric {src[node.pos : node.end]!r} in a node-scope rule: aggregate it, "
                    f"e.g. max({src[node.pos : node.end]})",
                    node,
                )
    if scope == fields.Scope.PORT:
        for node in tree.walk(root):
            if isinstance(node, tree.Ref | tree.Range) and node.level == fields.Scope.GPU:
                p.problem(
                    f"GPU metric {src[node.pos : node.end]!r} in a port-scope rule: a port rule reads "
                    "port and node metrics; put GPU conditions in a gpu- or node-scope rule",
                    node,
                )
    elif root.level == fields.Scope.PORT:
        for node in tree.walk(root):
            if (
                isinstance(node, tree.Ref | tree.Range)
                and node.level == fields.Scope.PORT
                and not _inside_agg(root, node)
            ):
                text = src[node.pos : node.end]
                p.problem(
                    f"port metric {text!r} is one value per RDMA port: aggregate it over the node's "
                    f"ports, e.g. count({text} ...) or max({text}), in a node-scope rule, or use scope port",
                    node,
                )
    return Parsed(root, p.problems)


def _inside_agg(root: tree.Node, target: tree.Node) -> bool:
    for node in tree.walk(root):
        is_agg = isinstance(node, tree.Call) and node.func in tree.AGGREGATIONS
        if is_agg and any(n is target for n in tree.walk(node.args[0])):  # type: ignore[attr-defined]
            return True
    return False
