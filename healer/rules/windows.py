"""Window rings: how FleetState answers ``rate(x[5m])`` and friends without keeping raw samples.

A ring holds time buckets of one (metric, accumulator kind) pair: counter increases (resets handled as
Prometheus does), signed differences, change counts, sums, counts, maxima or minima, each a (nodes, GPUs)
plane. A bucket is 1/20 of the shortest window that reads the pair, so a window is resolved to 1/20 of
its length, and ``needs_of`` lists exactly the pairs and instant columns a RuleSet reads.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Final

import numpy as np
import numpy.typing as npt

from healer.rules import metric_catalog, ruleset, tree
from healer.schemas import fields

F64 = npt.NDArray[np.float64]
Rows = slice | npt.NDArray[np.intp]
"""Which node rows a reader selects: ``slice(0, n)`` (every node: views, no copy) or an index array (the
nodes whose frames arrived since the last evaluation, ``FleetState.take_arrived``)."""
KIND_OF: Final = {
    "rate": ("inc",),
    "increase": ("inc",),
    "delta": ("diff",),
    "changes": ("chg",),
    "avg_over_time": ("sum", "cnt"),
    "max_over_time": ("max",),
    "min_over_time": ("min",),
    "absent": (),
}
NAN_INIT: Final = frozenset({"max", "min"})


@dataclasses.dataclass(slots=True)
class Ring:
    """Time buckets of one (metric, accumulator kind): data[bucket position, node, gpu]."""

    kind: str
    width_s: float
    ids: npt.NDArray[np.int64]
    data: F64

    @property
    def init(self) -> float:
        return math.nan if self.kind in NAN_INIT else 0.0

    def add(self, ts: F64, nodes: npt.NDArray[np.intp], values: F64) -> None:
        b = np.floor(ts / self.width_s).astype(np.int64)
        pos = b % len(self.ids)
        for bb in np.unique(b).tolist():
            p = bb % len(self.ids)
            if bb > self.ids[p]:
                self.ids[p] = bb
                self.data[p] = self.init
        ok = self.ids[pos] == b
        if not ok.all():
            pos, nodes, values = pos[ok], nodes[ok], values[ok]
        if self.kind == "max":
            self.data[pos, nodes] = np.fmax(self.data[pos, nodes], values)
        elif self.kind == "min":
            self.data[pos, nodes] = np.fmin(self.data[pos, nodes], values)
        else:
            self.data[pos, nodes] += values

    def reduce(self, now: float, window_s: float, rows: Rows) -> F64:
        bnow = math.floor(now / self.width_s)
        k = max(1, math.ceil(window_s / self.width_s - 1e-9))
        sel = np.flatnonzero((self.ids > bnow - k) & (self.ids <= bnow))
        if len(sel) == 0:
            return np.full(self.data[0][rows].shape, self.init)
        op = np.fmax if self.kind == "max" else np.fmin if self.kind == "min" else np.add
        if not isinstance(rows, slice):  # a few rows: one gather of (buckets x rows x slots), one reduce
            reduced: F64 = op.reduce(self.data[np.ix_(sel, rows)], axis=0)
            return reduced
        # Every row: in-place accumulation over the selected planes, no (buckets x slots) temporary.
        out: F64 = self.data[sel[0]][rows].copy()
        for p in sel[1:].tolist():
            op(out, self.data[p][rows], out=out)
        return out


@dataclasses.dataclass(slots=True)
class History:
    column: int
    last_value: F64
    last_valid_ts: F64
    rings: dict[str, Ring]


def histories(
    wins: Mapping[str, Mapping[str, tuple[float, ...]]],
    col: Mapping[str, int],
    old: Mapping[str, History],
    shape: tuple[int, int],
    *,
    buckets_per_window: int,
    max_buckets: int,
) -> dict[str, History]:
    """The windows the rules read (metric -> kind -> spans), as ``History`` over ``shape`` (rows x
    slots: GPUs or ports): a metric's last value and every ring whose bucket width and size are unchanged
    are kept from ``old``, so a rule reload loses no history it can still use."""
    out: dict[str, History] = {}
    for metric, kinds in wins.items():
        prev = old.get(metric)
        hist = History(
            col[metric],
            prev.last_value if prev else np.full(shape, np.nan),
            prev.last_valid_ts if prev else np.full(shape, -np.inf),
            {},
        )
        for kind, spans in kinds.items():
            width = max(min(spans) / buckets_per_window, max(spans) / max_buckets)
            size = math.ceil(max(spans) / width) + 1
            ring = prev.rings.get(kind) if prev else None
            if ring is not None and ring.width_s == width and len(ring.ids) == size:
                hist.rings[kind] = ring
            else:
                init = math.nan if kind in NAN_INIT else 0.0
                data = np.full((size, *shape), init)
                hist.rings[kind] = Ring(kind, width, np.full(size, -(2**62), dtype=np.int64), data)
        out[metric] = hist
    return out


@dataclasses.dataclass(frozen=True, slots=True)
class Needs:
    """What the loaded rules read: instant columns and (metric → kind → windows)."""

    columns: tuple[str, ...]
    windows: Mapping[str, Mapping[str, tuple[float, ...]]]
    port_columns: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Port metrics read (rules/port_state.py): metric → PortSample field."""
    port_windows: Mapping[str, Mapping[str, tuple[float, ...]]] = dataclasses.field(default_factory=dict)
    reads_ports: bool = False
    """Some rule reads a port metric or ``ports_present``, or has scope port: FleetState keeps the
    frames' ports."""


def needs_of(rules: ruleset.RuleSet) -> Needs:
    cols: dict[str, None] = {}
    wins: dict[str, dict[str, set[float]]] = {}
    for rule in rules.rules:
        for root in (rule.when, rule.resolve_when):
            for node in tree.walk(root) if root is not None else []:
                if isinstance(node, tree.Ref) and metric_catalog.ALL[node.name].source in (
                    "sample",
                    "derived",
                    "port",
                ):
                    cols[node.name] = None
                elif isinstance(node, tree.Call) and isinstance(node.args[0], tree.Range):
                    rng = node.args[0]
                    if rng.name == metric_catalog.TELEMETRY:
                        continue
                    cols[rng.name] = None
                    per_kind = wins.setdefault(rng.name, {})
                    for kind in KIND_OF[node.func]:
                        per_kind.setdefault(kind, set()).add(rng.window_s)
    if any(metric_catalog.ALL[c].source == "derived" for c in cols):
        cols.setdefault("clocks_event_reasons", None)
    ordered = [c for c in metric_catalog.SAMPLE if c in cols] + [
        c for c in metric_catalog.DERIVED if c in cols
    ]
    port_cols = {c: metric_catalog.PORT[c].field or c for c in metric_catalog.PORT if c in cols}
    gpu_wins = {
        m: {k: tuple(sorted(w)) for k, w in kw.items()} for m, kw in wins.items() if m not in port_cols
    }
    port_wins = {m: {k: tuple(sorted(w)) for k, w in kw.items()} for m, kw in wins.items() if m in port_cols}
    reads = (
        bool(port_cols)
        or any(rule.scope == fields.Scope.PORT for rule in rules.rules)
        or any(
            isinstance(node, tree.Ref) and node.name in ("ports_present", "fabric_manager_up")
            for rule in rules.rules
            for root in (rule.when, rule.resolve_when)
            if root is not None
            for node in tree.walk(root)
        )
    )
    return Needs(tuple(ordered), gpu_wins, port_cols, port_wins, reads)


def read(
    hist: History, func: str, window_s: float, now: float, rows: Rows, seen: npt.NDArray[np.bool_]
) -> F64:
    """A range function (``KIND_OF``) of one metric's history over ``window_s`` ending at ``now``, for
    ``rows``; NaN where the slot was never ``seen`` or has no valid reading inside the window."""
    recent = hist.last_valid_ts[rows] >= now - window_s
    if func == "absent":
        return np.where(seen, (~recent).astype(np.float64), np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        if func == "avg_over_time":
            total = hist.rings["sum"].reduce(now, window_s, rows)
            count = hist.rings["cnt"].reduce(now, window_s, rows)
            out = np.where(count > 0, total / np.where(count > 0, count, 1.0), np.nan)
        else:
            (kind,) = KIND_OF[func]
            out = hist.rings[kind].reduce(now, window_s, rows)
            if func == "rate":
                out = out / window_s
    return np.where(seen & recent, out, np.nan)


def accumulate(hist: History, cur: F64, nodes: npt.NDArray[np.intp], ts: F64) -> None:
    """Add one batch of values to a metric's windows (counter resets as Prometheus handles them)."""
    prev = hist.last_value[nodes]
    valid = ~np.isnan(cur)
    both = valid & ~np.isnan(prev)
    for kind, ring in hist.rings.items():
        if kind == "inc":
            d = cur - prev
            values = np.where(both, np.where(d < 0, cur, d), 0.0)
        elif kind == "diff":
            values = np.where(both, cur - prev, 0.0)
        elif kind == "chg":
            values = (both & (cur != prev)).astype(np.float64)
        elif kind == "sum":
            values = np.where(valid, cur, 0.0)
        elif kind == "cnt":
            values = valid.astype(np.float64)
        else:
            values = cur
        ring.add(ts, nodes, values)
    hist.last_value[nodes] = np.where(valid, cur, prev)
    hist.last_valid_ts[nodes] = np.where(valid, ts[:, None], hist.last_valid_ts[nodes])
