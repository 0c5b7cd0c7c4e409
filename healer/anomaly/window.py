"""FleetWindow: the controller's cheap ingest path for the anomaly model.

``observe(frame)`` only copies the frame's numbers into a Python list (a few microseconds per 8-GPU
frame). All numpy work happens once per scoring batch, in ``flush``: the queued rows become one array,
counter increases are taken per node (resets handled), and the rows are summed into per-node ring
buffers of ``bucket_s``-second buckets. A window is the last ``window_s / bucket_s`` buckets, so memory
is nodes x GPUs x (buckets + 2) x channels float64 (108 MB for 10,000 nodes x 8 GPUs, 300 s of 30 s
buckets, up to twice that while the node capacity has doubled past the fleet) whatever the frame rate.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from healer.anomaly import features
from healer.schemas import telemetry

_NAN = math.nan
RING_SPARE = 2
"""Ring slots beyond the window's buckets (``FleetWindow.slots``)."""


_FIELDS = features.RAW[:-1]
"""The GpuSample fields read per GPU (``RAW`` but the frame's time, which ``flush`` adds per row)."""
_index = operator.attrgetter("index")
_MISSING: tuple[float, ...] = (_NAN,) * len(_FIELDS)
Reader = Callable[[telemetry.GpuView], tuple[float | int | None, ...]]


def _fields(g: telemetry.GpuView) -> tuple[float | int | None, ...]:
    """Any GPU view's ``_FIELDS`` (``energy_j`` is not in the GpuView protocol: None where it lacks it)."""
    return tuple(getattr(g, name, None) for name in _FIELDS)


def _reader(cls: type) -> Reader:
    """The cheapest way to read ``_FIELDS`` from a GPU view of class ``cls``: a pydantic model's fields
    straight from its ``__dict__`` (half the cost of attribute lookups), any class declaring every field
    (the strict decoder's struct) by ``attrgetter``, anything else by ``_fields``. Each raises
    AttributeError or KeyError on a view without them; ``observe`` then reads that frame by ``_fields``."""
    declared = getattr(cls, "model_fields", None)
    if isinstance(declared, dict) and all(f in declared for f in _FIELDS):
        by_key = operator.itemgetter(*_FIELDS)
        return lambda g: by_key(g.__dict__)
    if all(hasattr(cls, f) for f in _FIELDS):
        return operator.attrgetter(*_FIELDS)
    return _fields


class FleetWindow:
    """Per-node ring buffers of bucketed channel sums, fed frame by frame, read as window features."""

    def __init__(
        self,
        *,
        gpus_per_node: int = 8,
        window_s: float = 300.0,
        bucket_s: float = 30.0,
        min_interval_s: float = 0.0,
    ) -> None:
        if window_s < bucket_s or bucket_s <= 0:
            raise ValueError("window_s must be at least bucket_s, and bucket_s positive")
        self.gpus = gpus_per_node
        self.window_s = window_s
        self.bucket_s = bucket_s
        self.width = round(window_s / bucket_s)
        self.slots = self.width + RING_SPARE
        """Ring slots per node: the window's buckets, the one filling now and one more, so a window of
        complete buckets is whole while the next bucket fills (and after one missed scoring)."""
        self.node_names: list[str] = []
        self.models: list[list[str | None]] = []
        self._index: dict[str, int] = {}
        self._q_node: list[int] = []
        self._q_ts: list[float] = []
        self._vals: list[float | int | None] = []
        """Per queued frame, its GPUs' fields (``_FIELDS``) in index order, flat."""
        self._readers: dict[type, Reader] = {}
        self._gaps: list[tuple[int, list[int]]] = []
        """Queued frames with GPUs missing: (queue position, the missing indices), whose time is NaN."""
        self._order = list(range(gpus_per_node))
        self._kept: list[float] = []
        self.min_interval_s = min_interval_s
        self.frames_seen: list[int] = []
        """Per node, frames observed (kept or skipped), with the first and latest one's time: the
        node's frame interval (``interval_s``)."""
        self.first_ts: list[float] = []
        self.latest_ts: list[float] = []
        self.skipped = 0
        """Frames skipped because they came sooner than ``min_interval_s`` after the node's last one."""
        self._rows = len(features.RAW)
        cap = 16
        self._sums = np.zeros((cap, self.slots, self.gpus, len(features.CHANNELS)), dtype=np.float64)
        self._ids = np.full((cap, self.slots), -1, dtype=np.int64)
        self._last = np.full((cap, self.gpus, len(features.RAW_COUNTERS)), np.nan)
        self.dropped = 0
        """Rows ignored: older than the window by the time they were flushed (or than the ring's slots
        within one flush), or GPU index too high."""

    def __len__(self) -> int:
        return len(self.node_names)

    def _node(self, name: str) -> int:
        i = self._index.get(name)
        if i is None:
            i = len(self.node_names)
            self._index[name] = i
            self.node_names.append(name)
            self.models.append([None] * self.gpus)
            self._kept.append(-math.inf)
            self.frames_seen.append(0)
            self.first_ts.append(math.nan)
            self.latest_ts.append(math.nan)
            if i == len(self._ids):
                grow = len(self._ids)
                self._sums = np.concatenate([self._sums, np.zeros_like(self._sums[:grow])])
                self._ids = np.concatenate([self._ids, np.full_like(self._ids[:grow], -1)])
                self._last = np.concatenate([self._last, np.full_like(self._last[:grow], np.nan)])
        return i

    def observe(self, frame: telemetry.FrameView, at: float | None = None) -> None:
        """Queue one frame (hot path: no numpy). ``at`` defaults to ``frame.ts``. Frames closer than
        ``min_interval_s`` to the node's last kept frame are skipped (counted in ``skipped``): counters
        are cumulative, so nothing is lost but resolution the 30 s buckets do not need."""
        i = self._index.get(frame.node)
        if i is None:
            i = self._node(frame.node)
        ts = frame.ts if at is None else at
        if not self.frames_seen[i]:
            self.first_ts[i] = ts
        self.frames_seen[i] += 1
        self.latest_ts[i] = ts
        if ts - self._kept[i] < self.min_interval_s:
            self.skipped += 1
            return
        self._kept[i] = ts
        gpus = frame.gpus
        models = self.models[i]
        if len(gpus) == self.gpus and list(map(_index, gpus)) == self._order:
            cls = type(gpus[0])
            read = self._readers.get(cls)
            if read is None:
                read = self._readers[cls] = _reader(cls)
            vals = self._vals
            start = len(vals)
            extend = vals.extend
            try:
                for g in gpus:
                    extend(read(g))
            except (AttributeError, KeyError):  # a view of another class among them
                del vals[start:]
                for g in gpus:
                    extend(_fields(g))
            if models[0] is None or models[0] != gpus[0].model:
                self.models[i] = [g.model for g in gpus]
        else:  # lost GPUs or odd numbering: place each by its index
            self._place(gpus, models)
        self._q_node.append(i)
        self._q_ts.append(ts)

    def _place(self, gpus: Sequence[telemetry.GpuView], models: list[str | None]) -> None:
        row: list[Sequence[float | int | None]] = [_MISSING] * self.gpus
        seen = [False] * self.gpus
        for g in gpus:
            k = g.index
            if k >= self.gpus:
                self.dropped += 1
                continue
            models[k] = g.model
            row[k] = _fields(g)
            seen[k] = True
        missing = [k for k in range(self.gpus) if not seen[k]]
        if missing:
            self._gaps.append((len(self._q_node), missing))
        for values in row:
            self._vals.extend(values)

    def interval_s(self, i: int, *, min_span_s: float = 120.0) -> float | None:
        """Node ``i``'s mean frame interval, once it has reported for ``min_span_s``; else None."""
        span = self.latest_ts[i] - self.first_ts[i]
        if not span >= min_span_s or self.frames_seen[i] < 2:
            return None
        return span / (self.frames_seen[i] - 1)

    def flush(self) -> None:
        """Fold the queued rows into the bucket rings (one batch of numpy work)."""
        if not self._q_node:
            return
        m = len(self._q_node)
        node = np.array(self._q_node, dtype=np.int64)
        ts = np.array(self._q_ts, dtype=np.float64)
        raw = np.empty((m, self.gpus, self._rows))
        raw[..., :-1] = np.array(self._vals, dtype=np.float64).reshape(m, self.gpus, self._rows - 1)
        raw[..., -1] = ts[:, None]
        for q, missing in self._gaps:
            raw[q, missing, -1] = _NAN
        self._q_node, self._q_ts, self._vals, self._gaps = [], [], [], []
        order = np.lexsort((ts, node))
        node, ts, raw = node[order], ts[order], raw[order]
        counters = raw[..., 7:]
        starts = np.flatnonzero(np.r_[True, node[1:] != node[:-1]])
        blocks = node[starts]
        inc, self._last[blocks] = features.grouped_counter_increase(counters, starts, self._last[blocks])
        ch = features.channels(raw, inc)
        bucket = np.floor(ts / self.bucket_s).astype(np.int64)
        slot = bucket % self.slots
        current = self._ids[node, slot]
        # a batch spanning more buckets than the ring holds: its node's older rows have no slot left
        newest = np.repeat(bucket[np.r_[starts[1:], len(node)] - 1], np.diff(np.r_[starts, len(node)]))
        too_old = (bucket < current) | (bucket <= newest - self.slots)
        self.dropped += int(too_old.sum())
        keep = ~too_old
        node, bucket, slot, ch = node[keep], bucket[keep], slot[keep], ch[keep]
        if not len(node):
            return
        stale = bucket > self._ids[node, slot]
        self._sums[node[stale], slot[stale]] = 0.0
        self._ids[node[stale], slot[stale]] = bucket[stale]
        key = node * self.slots + slot
        brk = np.flatnonzero(np.r_[True, (key[1:] != key[:-1]) | (bucket[1:] != bucket[:-1])])
        grouped = np.add.reduceat(ch, brk, axis=0)
        np.add.at(self._sums, (node[brk], slot[brk]), grouped)

    def window_sums(self, now: float) -> npt.NDArray[np.float64]:
        """Channel sums over the window ending at ``now`` (nodes, gpus, CHANNELS), after a flush."""
        self.flush()
        n = len(self.node_names)
        end = math.floor(now / self.bucket_s)
        ok = (self._ids[:n] > end - self.width) & (self._ids[:n] <= end)
        out: npt.NDArray[np.float64] = np.einsum(
            "nb,nbgc->ngc", ok.astype(np.float64), self._sums[:n], dtype=np.float64
        )
        return out

    def features(self, now: float) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
        """Base window features (nodes, gpus, BASE_FEATURES) and the valid-GPU mask at ``now``."""
        return features.window_features(self.window_sums(now), self.window_s)
