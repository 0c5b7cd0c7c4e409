"""FleetState: what the rule engine remembers about the fleet, as numpy arrays, bounded in size.

Layout: node ``n`` and GPU index ``g`` address slot ``[n, g]``. ``latest`` holds the newest value of
every metric the rules read, shaped (columns, nodes, gpus) so each metric is one contiguous plane; NaN
is "missing" (a null reading, a GPU absent from the frame, or a node gone stale). Range functions read
per-metric *bucketed windows* (windows.py): instead of every sample, a ring of time buckets (a window is
resolved to 1/20 of its length) keeps the sum of counter increases (resets handled as Prometheus does:
a drop means the counter restarted from 0), signed differences, change counts, sums, counts, maxima
and minima, only for the metric/function pairs the loaded rules use. Memory is therefore O(slots x
buckets) per referenced pair, whatever the sample rate, and one evaluation reduces a few dozen
(slots,) planes per window.

``decode`` + ``ingest`` is the controller's hot path: ``decode`` writes a frame's GPU readings straight into
this state's staging plane (schemas/framecols.py: every numeric GPU field, no Python object per value) and
``ingest`` keeps those rows; once the plane is nearly full its rows become one float block of the columns
the rules read (``_stage``). A frame ingested without ``decode`` (a NodeFrame: tests, backtests, the
simulator) has its referenced fields pulled out of each GPU reading with one ``attrgetter`` call and
queued as a row; every ``STAGE_ROWS`` rows become one float block the same way, so a tick's worth of
Python numbers is never kept alive until the tick (measured: converting 32 frames at a time costs a third
of what converting a flood's tick at once did, docs/performance.md). The rest of the numpy work happens
once per batch in ``flush`` (``evaluate`` flushes first), vectorized over every frame received since the
last tick.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import structlog

from healer.rules import metric_catalog, port_state, ruleset, windows
from healer.schemas import fields, framecols, telemetry

log = structlog.get_logger(__name__)
KEPT: Final = ("power_limit_w",)
"""GPU fields kept from every frame whatever the rules read (``power_limit``), staged after theirs."""
STAGE_ROWS = 256
"""GPU rows queued as Python values before they are converted into a float plane (``_stage``)."""
PLANE_ROWS = 512
"""GPU rows the staging plane fills before ``_stage`` (it has ``framecols.ROWS_MAX`` more, for a frame)."""
F64 = npt.NDArray[np.float64]
Rows = windows.Rows
_Item = tuple[int, float, float, int, int | None, Any]
"""A queued frame: node index, frame ts, accounted-at time, its number of GPU rows (index first, then the
raw columns; staged in order), gpus_expected, and its (RDMA ports, fabric_manager_up) (None when no rule
reads them; rules/port_state.py).
Frames are ordered by the accounted-at time (the controller's receive time), never by the node's ``ts``:
one frame with a clock ten years ahead must not make every later frame look old."""


class FleetState:
    def __init__(
        self,
        rules: ruleset.RuleSet | None = None,
        *,
        gpus_per_node: int = 8,
        capacity: int = 64,
        stale_after_s: float = 300.0,
        buckets_per_window: int = 20,
        max_buckets: int = 240,
    ) -> None:
        self.stale_after_s = stale_after_s
        self.buckets_per_window = buckets_per_window
        self.max_buckets = max_buckets
        self.names: list[str] = []
        self.labels: list[dict[str, str]] = []
        self.gpu_info: list[dict[int, tuple[str | None, str | None]]] = []
        """Per node: GPU index → (model, uuid), as last reported."""
        self.version = 0
        """Bumped when nodes, GPU models or labels change (rule match masks depend on them)."""
        self.dropped_frames = 0
        self._index: dict[str, int] = {}
        self._boot: list[str | None] = []
        self._count: list[int] = []
        self._free: list[int] = []
        """Rows of forgotten nodes, reused before the fleet grows."""
        self._pending: list[_Item] = []
        """Frames whose GPU rows are staged (``_staged``, in the same order)."""
        self._frames: list[_Item] = []
        self._rows: list[tuple[Any, ...]] = []
        """The GPU rows of ``_frames``, not converted yet (``_stage``)."""
        self._staged: list[F64] = []
        self._plane: F64 = np.empty((PLANE_ROWS + framecols.ROWS_MAX, framecols.WIDTH))
        """Where ``decode`` writes the next frame's GPU rows (``framecols.COLUMNS``), at row ``_used``."""
        self._used = 0
        self._decoded: framecols.Frame | None = None
        """The frame ``decode`` wrote last, until ingested: the only one whose rows ``ingest`` keeps."""
        self._lent: framecols.Frame | None = None
        """The frame ``decode`` wrote last: its rows are overwritten by the next (``Frame.exact``)."""
        self._arrived: list[npt.NDArray[np.intp]] = []
        """The node rows each ``_apply`` batch wrote since ``take_arrived`` last ran."""
        self._take = np.zeros(1, dtype=np.intp)
        """The plane's columns the rules read (index first), in the order of ``_raw``."""
        self.cap, self.gpus = capacity, gpus_per_node
        self.last_ts = np.full(self.cap, -np.inf)
        """When each node's newest frame counted (its ``at``), on the evaluator's clock; a frame that
        counts earlier than this is dropped as out of order."""
        self.frame_ts = np.full(self.cap, -np.inf)
        """The newest frame's own ``ts`` per node (data only: never used for ordering)."""
        self.present = np.full(self.cap, np.nan)
        self.expected = np.full(self.cap, np.nan)
        self.seen = np.zeros((self.cap, self.gpus), dtype=bool)
        self.anomaly = np.zeros((self.cap, self.gpus))
        self.straggler = np.zeros((self.cap, self.gpus))
        self.power_limit = np.full((self.cap, self.gpus), np.nan)
        """Each GPU's ``power_limit_w`` in its node's newest frame, whatever the rules read (the power
        actuator's reading, ``latest_power_limit``); NaN: not reported."""
        self.needs = windows.Needs((), {})
        self.ports = port_state.PortState(
            self.cap, buckets_per_window=buckets_per_window, max_buckets=max_buckets
        )
        """The nodes' RDMA ports, for rules that read port metrics (rows are this state's node rows)."""
        self.latest = np.full((0, self.cap, self.gpus), np.nan)
        self.col: dict[str, int] = {}
        self.history: dict[str, windows.History] = {}
        self._raw: list[str] = []
        self._getter: Callable[[telemetry.GpuView], tuple[Any, ...]] = operator.attrgetter("index", *KEPT)
        self._dict_getter: Callable[[dict[str, Any]], tuple[Any, ...]] = operator.itemgetter("index", *KEPT)
        self.set_rules(rules or ruleset.RuleSet())

    @property
    def n(self) -> int:
        return len(self.names)

    # -- configuration
    def set_rules(self, rules: ruleset.RuleSet) -> None:
        """Keep exactly what ``rules`` read; columns and windows that survive a reload keep their data."""
        self.flush()
        needs = windows.needs_of(rules)
        old_latest, old_col = self.latest, self.col
        self.col = {name: i for i, name in enumerate(needs.columns)}
        self.latest = np.full((len(needs.columns), self.cap, self.gpus), np.nan)
        for name, i in self.col.items():
            if name in old_col:
                self.latest[i] = old_latest[old_col[name]]
        self._raw = [c for c in needs.columns if metric_catalog.ALL[c].source == "sample"]
        # All three read the same fields: attributes of the strict msgspec structs, (faster than
        # attribute lookup on a pydantic model) the __dict__ of a GpuSample, or the plane's columns.
        staged = ("index", *self._raw, *KEPT)
        self._getter = operator.attrgetter(*staged)
        self._dict_getter = operator.itemgetter(*staged)
        self._take = np.array([framecols.COLUMN[c] for c in staged], dtype=np.intp)
        self.history = windows.histories(
            needs.windows, self.col, self.history, (self.cap, self.gpus),
            buckets_per_window=self.buckets_per_window, max_buckets=self.max_buckets,
        )  # fmt: skip
        self.needs = needs
        self.ports.set_needs(needs.port_columns, needs.port_windows)

    def set_labels(self, node: str, labels: Mapping[str, str]) -> None:
        """Node labels for ``match: {labels: ...}`` (the controller learns them from the scheduler)."""
        n = self._node(node)
        if self.labels[n] != labels:
            self.labels[n] = dict(labels)
            self.version += 1

    def set_anomaly_scores(self, node: str, scores: Mapping[int, float]) -> None:
        """The anomaly model's latest score per GPU index of a node (0..1)."""
        n = self._node(node)
        for g, score in scores.items():
            if 0 <= g < self.gpus:
                self.anomaly[n, g] = score

    def set_straggler_scores(self, node: str, scores: Mapping[int, float]) -> None:
        """The fail-slow scorer's verdict per GPU index of a node (controller/failslow/stragglers.py): 1 for a
        confirmed straggler, 0 otherwise."""
        n = self._node(node)
        for g, score in scores.items():
            if 0 <= g < self.gpus:
                self.straggler[n, g] = score

    # -- ingest
    def decode(self, data: bytes) -> framecols.Frame:
        """Decode a frame's bytes with its GPU readings written straight into the staging plane
        (``framecols.decode_into``; ``errors.DecodeError`` as ``codec.decode_frame_view`` raises it).
        ``ingest`` keeps those rows if it is given this frame before the next ``decode``; a frame never
        ingested costs nothing (the next one overwrites its rows)."""
        if self._lent is not None:
            self._lent.exact = False  # its rows are about to be written over
        frame = self._decoded = self._lent = framecols.decode_into(data, self._plane, self._used)
        return frame

    def ingest(self, frame: telemetry.FrameView, at: float | None = None) -> None:
        """Queue one frame. ``at``: when it counts on the evaluator's clock (the controller passes its
        receive time, so a node's clock skew cannot make it look silent); default ``frame.ts``."""
        n = self._index.get(frame.node)
        if n is None:
            n = self._node(frame.node)
        decoded = self._decoded
        in_plane = decoded is not None and frame is decoded and decoded.row == self._used
        count = frame.gpu_count if isinstance(frame, framecols.Frame) else len(frame.gpus)
        if frame.boot_id != self._boot[n] or count != self._count[n]:
            # GPUs only change across an agent restart (or when one falls off): refresh models/UUIDs.
            self._boot[n], self._count[n] = frame.boot_id, count
            info = {g.index: (g.model, g.uuid) for g in frame.gpus}
            if info.items() - self.gpu_info[n].items():
                self.gpu_info[n].update(info)
                self.version += 1
        if in_plane:
            self._decoded = None
            if self._rows:  # rows queued as Python values go first, in the order frames came
                self._stage()
            self._used += count
        else:
            if self._used:
                self._stage()
            gpus = frame.gpus
            if isinstance(frame, telemetry.NodeFrame):
                self._rows.extend([self._dict_getter(g.__dict__) for g in gpus])
            else:
                self._rows.extend(map(self._getter, gpus))
        fabric = (
            (getattr(frame, "ports", None), getattr(frame, "fabric_manager_up", None))
            if self.needs.reads_ports
            else None
        )
        ts = frame.ts
        self._frames.append((n, ts, ts if at is None else at, count, frame.gpus_expected, fabric))
        if len(self._rows) >= STAGE_ROWS or self._used > PLANE_ROWS:
            self._stage()

    def _stage(self) -> None:
        """The queued GPU rows into one float block of the columns the rules read, now: the staging
        plane's (then free again for ``decode``), or the rows queued as Python values, while their
        numbers are fresh in the cache and can be freed (a tick's worth of Python floats kept until
        ``flush`` costs more than converting). Only one of the two holds rows at a time."""
        if self._used:
            self._staged.append(self._plane[: self._used, self._take])
            self._used = 0
            self._decoded = None
        if self._rows:
            self._staged.append(np.array(self._rows, dtype=np.float64).reshape(len(self._rows), -1))
            self._rows = []
        self._pending.extend(self._frames)
        self._frames = []

    def ingest_many(self, frames: Iterable[telemetry.FrameView], at: float | None = None) -> None:
        for frame in frames:
            self.ingest(frame, at)

    def flush(self) -> None:
        self._stage()
        pending, self._pending = self._pending, []
        staged, self._staged = self._staged, []
        if not pending:
            return
        width = 1 + len(self._raw) + len(KEPT)
        values = np.concatenate(staged) if len(staged) > 1 else staged[0] if staged else np.empty((0, width))
        counts = [it[3] for it in pending]
        starts = np.zeros(len(pending), dtype=np.intp)
        np.cumsum(counts[:-1], out=starts[1:])
        order = sorted(range(len(pending)), key=lambda i: pending[i][2])
        # Batch k holds every node's k-th frame (in time order), so no batch holds a node twice.
        batches: list[list[int]] = []
        nth: dict[int, int] = {}
        for i in order:
            node = pending[i][0]
            k = nth.get(node, 0)
            nth[node] = k + 1
            if k == len(batches):
                batches.append([])
            batches[k].append(i)
        for k, batch in enumerate(batches):
            items = [pending[i] for i in batch]
            # a node's newest frame here is in the last batch that holds it
            newest = None if k == len(batches) - 1 else [nth[it[0]] == k + 1 for it in items]
            self._apply(items, values, starts[batch], newest)

    def _apply(
        self, items: list[_Item], values_all: F64, starts: npt.NDArray[np.intp], newest: list[bool] | None
    ) -> None:
        """One batch: ``items`` (no node twice), their GPU rows at ``starts`` in ``values_all``;
        ``newest``: which are their node's newest frame of the flush (None: all), the only ones whose
        readings ``latest`` keeps (the others' count in the windows)."""
        nodes = np.fromiter((it[0] for it in items), dtype=np.intp, count=len(items))
        frame_ts = np.fromiter((it[1] for it in items), dtype=np.float64, count=len(items))
        ts = np.fromiter((it[2] for it in items), dtype=np.float64, count=len(items))
        counts = np.fromiter((it[3] for it in items), dtype=np.intp, count=len(items))
        fresh = ts > self.last_ts[nodes]
        if not fresh.all():
            dropped = int((~fresh).sum())
            self.dropped_frames += dropped
            late = [self.names[it[0]] for it, ok in zip(items, fresh.tolist(), strict=True) if not ok]
            log.warning("frames_out_of_order_dropped", count=dropped, nodes=late[:10])
            items = [it for it, ok in zip(items, fresh.tolist(), strict=True) if ok]
            if newest is not None:
                newest = [last for last, ok in zip(newest, fresh.tolist(), strict=True) if ok]
            nodes, frame_ts, ts = nodes[fresh], frame_ts[fresh], ts[fresh]
            counts, starts = counts[fresh], starts[fresh]
            if not items:
                return
        self._arrived.append(nodes)
        frame_of = np.repeat(np.arange(len(items)), counts)
        # the rows of each frame: its start, plus 0 .. count-1
        first = np.repeat(starts - np.concatenate(([0], np.cumsum(counts)[:-1])), counts)
        values = values_all[first + np.arange(len(first))]
        nraw = len(self._raw)
        gidx = values[:, 0].astype(np.intp)
        if len(gidx) and gidx.max() >= self.gpus:
            self._grow(self.cap, int(gidx.max()) + 1)
        grid = np.full((len(self.col), len(items), self.gpus), np.nan)
        grid[:nraw, frame_of, gidx] = values[:, 1 : 1 + nraw].T
        limits = np.full((len(items), self.gpus), np.nan)
        limits[frame_of, gidx] = values[:, 1 + nraw]
        with np.errstate(invalid="ignore"):
            for name, i in self.col.items():
                if name in fields.CLOCK_BITS:
                    bits = grid[self.col["clocks_event_reasons"]]
                    flag = (np.nan_to_num(bits).astype(np.int64) & int(fields.CLOCK_BITS[name][0])) != 0
                    grid[i] = np.where(np.isnan(bits), np.nan, flag)
            if newest is None:
                self.latest[:, nodes] = grid
                self.power_limit[nodes] = limits
            elif any(newest):  # (a flood's earlier frames: only their windows count)
                keep = np.array(newest)
                self.latest[:, nodes[keep]] = grid[:, keep]
                self.power_limit[nodes[keep]] = limits[keep]
            self.last_ts[nodes] = ts
            self.frame_ts[nodes] = frame_ts
            self.present[nodes] = counts
            self.expected[nodes] = [np.nan if it[4] is None else it[4] for it in items]
            self.seen[nodes[frame_of], gidx] = True
            for hist in self.history.values():
                self._accumulate(hist, grid[hist.column], nodes, ts)
        if self.needs.reads_ports:
            self.ports.apply([(it[0], it[2], *it[5]) for it in items if it[5] is not None])

    def take_arrived(self) -> npt.NDArray[np.intp]:
        """The node rows that took a frame since the last call (``flush`` first), each once, ascending:
        the rows an arrival evaluation reads (``Engine.evaluate_frames``)."""
        got, self._arrived = self._arrived, []
        if not got:
            return np.empty(0, dtype=np.intp)
        return np.unique(np.concatenate(got)) if len(got) > 1 else np.unique(got[0])

    def clear_arrived(self) -> None:
        """Every row is being read (a tick): what arrived before is not news to the next arrival."""
        self._arrived.clear()

    @staticmethod
    def _accumulate(hist: windows.History, cur: F64, nodes: npt.NDArray[np.intp], ts: F64) -> None:
        windows.accumulate(hist, cur, nodes, ts)

    # -- reading (evaluate.py)
    def rows(self, rows: Rows | None = None) -> Rows:
        """What the readers below select: ``rows`` as given, or every node row (``slice(0, n)``)."""
        return slice(0, self.n) if rows is None else rows

    def fresh(self, now: float, rows: Rows | None = None) -> npt.NDArray[np.bool_]:
        """(rows, 1): the node's newest frame is recent enough for instant values to count."""
        return (now - self.last_ts[self.rows(rows)] <= self.stale_after_s)[:, None]

    def _all_fresh(self, now: float, rows: Rows) -> bool:
        """Every node fresh (the common case): instant reads can skip the staleness mask."""
        last = self.last_ts[rows]
        return bool(len(last) == 0 or now - last.min() <= self.stale_after_s)

    def instant(self, name: str, now: float, rows: Rows | None = None) -> F64:
        """The newest value of ``name`` (NaN where stale or missing), for every node row or ``rows``."""
        sel = self.rows(rows)
        fresh = self.fresh(now, sel)
        metric = metric_catalog.ALL[name]
        if metric.source == "node":
            if name == "gpus_expected":
                v = self.expected[sel]
            elif name == "gpus_present":
                v = self.present[sel]
            elif name == "ports_present":
                v = self.ports.present[sel]
            elif name == "fabric_manager_up":
                v = self.ports.fabric_manager[sel]
            else:
                v = np.maximum(self.expected[sel] - self.present[sel], 0.0)
            return np.where(fresh, v[:, None], np.nan)
        if metric.source == "external":
            external = self.anomaly if name == "anomaly_score" else self.straggler
            return np.where(fresh & self.seen[sel], external[sel], np.nan)
        if metric.source == "port":
            return self.ports.instant(name, sel, fresh)
        plane = self.latest[self.col[name]][sel]
        return plane if self._all_fresh(now, sel) else np.where(fresh, plane, np.nan)

    def window(self, func: str, name: str, window_s: float, now: float, rows: Rows | None = None) -> F64:
        """A range function of ``name`` over ``window_s`` ending at ``now``, for every node row or
        ``rows``."""
        sel = self.rows(rows)
        seen = self.seen[sel]
        if name == metric_catalog.TELEMETRY:
            last = self.last_ts[sel]  # a node that never sent a frame is unknown, not silent
            return np.where(np.isfinite(last), (now - last > window_s).astype(np.float64), np.nan)[:, None]
        if metric_catalog.ALL[name].source == "port":
            return self.ports.window(func, name, window_s, now, sel)
        return windows.read(self.history[name], func, window_s, now, sel, seen)

    # -- bookkeeping
    def nbytes(self) -> int:
        arrays = [
            self.last_ts,
            self.frame_ts,
            self.present,
            self.expected,
            self.seen,
            self.anomaly,
            self.straggler,
            self.power_limit,
            self.latest,
        ]
        for hist in self.history.values():
            arrays += [hist.last_value, hist.last_valid_ts]
            arrays += [a for r in hist.rings.values() for a in (r.ids, r.data)]
        return sum(a.nbytes for a in arrays) + self.ports.nbytes()

    def node_index(self, node: str) -> int | None:
        return self._index.get(node)

    def _node(self, node: str) -> int:
        n = self._index.get(node)
        if n is None:
            if self._free:
                n = self._free.pop()
                self._index[node] = n
                self.names[n] = node
                self.version += 1
                return n
            n = self.n
            if n >= self.cap:
                self._grow(self.cap * 2, self.gpus)
            self._index[node] = n
            self.names.append(node)
            self.labels.append({})
            self.gpu_info.append({})
            self._boot.append(None)
            self._count.append(-1)
            self.version += 1
        return n

    def silent_since(self, before: float) -> list[str]:
        """Nodes whose newest frame counted before ``before`` (nodes that never sent one are left out)."""
        self.flush()
        last = self.last_ts[: self.n]
        rows = np.nonzero(np.isfinite(last) & (last < before))[0]
        return [self.names[i] for i in rows.tolist()]

    def forget(self, node: str) -> int | None:
        """Reclaim a node's row: every reading and window of it is cleared and the row is reused by the
        next new node (the fleet never grows for nodes that left). Returns the row, None if unknown."""
        self.flush()
        n = self._index.pop(node, None)
        if n is None:
            return None
        self.names[n] = ""
        self.labels[n], self.gpu_info[n] = {}, {}
        self._boot[n], self._count[n] = None, -1
        self.last_ts[n] = self.frame_ts[n] = -np.inf
        self.present[n] = self.expected[n] = np.nan
        self.seen[n] = False
        self.anomaly[n] = self.straggler[n] = 0.0
        self.power_limit[n] = np.nan
        self.latest[:, n] = np.nan
        self.ports.forget(n)
        for hist in self.history.values():
            hist.last_value[n] = np.nan
            hist.last_valid_ts[n] = -np.inf
            for ring in hist.rings.values():
                ring.data[:, n] = ring.init
        self._free.append(n)
        self.version += 1
        return n

    def _grow(self, cap: int, gpus: int) -> None:
        def pad(a: Any, node_axis: int, gpu_axis: int | None, fill: Any) -> Any:
            shape = list(a.shape)
            shape[node_axis] = cap
            if gpu_axis is not None:
                shape[gpu_axis] = gpus
            out = np.full(shape, fill, dtype=a.dtype)
            out[tuple(slice(0, s) for s in a.shape)] = a
            return out

        self.last_ts = pad(self.last_ts, 0, None, -np.inf)
        self.frame_ts = pad(self.frame_ts, 0, None, -np.inf)
        self.present = pad(self.present, 0, None, np.nan)
        self.expected = pad(self.expected, 0, None, np.nan)
        self.seen = pad(self.seen, 0, 1, False)
        self.anomaly = pad(self.anomaly, 0, 1, 0.0)
        self.straggler = pad(self.straggler, 0, 1, 0.0)
        self.power_limit = pad(self.power_limit, 0, 1, np.nan)
        self.latest = pad(self.latest, 1, 2, np.nan)
        for hist in self.history.values():
            hist.last_value = pad(hist.last_value, 0, 1, np.nan)
            hist.last_valid_ts = pad(hist.last_valid_ts, 0, 1, -np.inf)
            for ring in hist.rings.values():
                ring.data = pad(ring.data, 1, 2, ring.init)
        self.cap, self.gpus = cap, gpus
        self.ports.grow(cap, self.ports.slots)
        self.version += 1
