"""The status page's picture of the fleet's telemetry: latest readings, a short ring and an hour's history
per GPU.

Columnar on purpose: 10,000 nodes x 8 GPUs is 80,000 cells, so the latest readings live in numpy arrays
(one row per node, in order of first sight) and a change set for the browser is a vectorised comparison,
not a loop over GPUs. The ring keeps ``ring_len`` recent readings of ``RING_FIELDS`` per GPU as float16
(0.06 C, 0.5 W resolution: plenty for a chart, half the memory of float32; 58 MB at 10,000 x 8 x 90).
The history keeps ``history_len`` buckets of ``history_step_s`` each (default 125 x 30 s: just over an
hour), each the mean of the frames that arrived in it (83 MB at 10,000 x 8 x 125): the charts' reach
back, downsampled, so an hour costs no more than 125 points.

A node can be on the map before its first frame (``declare``: the admitted fleet, a node with an
incident): it is drawn silent until it reports.

Node identity comes from the subject (the caller passes it), never from the frame's body. Times are the
receiving process's clock. Nothing here does I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from healer.schemas import telemetry

RING_FIELDS: tuple[str, ...] = ("temp_c", "power_w", "util_gpu_pct", "sm_clock_mhz")
"""The readings each GPU's ring keeps, in this order."""

LATEST_FIELDS: tuple[str, ...] = (*RING_FIELDS, "power_limit_w", "slowdown_temp_c")
"""The latest readings kept per GPU (the ring's, then two references for the charts)."""

NO_TEMP = 255
"""``temps_u8``'s value for a GPU with no temperature (missing, never seen, or not reported)."""


F32 = npt.NDArray[np.float32]


def _grown(src: npt.NDArray[Any] | None, n: int, shape: tuple[int, ...], fill: Any, dtype: Any) -> Any:
    """A new array of ``shape`` filled with ``fill``, holding ``src``'s first ``n`` rows (the columns that
    fit)."""
    arr = np.full(shape, fill, dtype=dtype)
    if src is not None and n:
        arr[(slice(0, n), *(slice(0, min(a, b)) for a, b in zip(src.shape[1:], shape[1:], strict=True)))] = (
            src[(slice(0, n), *(slice(0, min(a, b)) for a, b in zip(src.shape[1:], shape[1:], strict=True)))]
        )
    return arr


PORT_FIELDS: Final = (
    "device", "port", "link_layer", "state", "phys_state", "rate_gbps", "netdev", "link_downed",
    "carrier_changes", "symbol_error", "port_rcv_errors", "port_xmit_wait",
)  # fmt: skip
"""What the GPU view shows of each of the node's RDMA ports."""


class Fleet:
    """Latest readings and rings, one row per node. ``layout`` changes whenever a node is added."""

    latest: F32
    """Latest readings (rows x gpus x ``LATEST_FIELDS``); NaN where not reported."""
    present: npt.NDArray[np.bool_]
    expected: npt.NDArray[np.int16]
    seen_at: npt.NDArray[np.float64]
    ring: npt.NDArray[np.float16]
    ring_ts: npt.NDArray[np.float64]
    ring_pos: npt.NDArray[np.int32]
    hist: npt.NDArray[np.float16]
    """Per-bucket means (rows x ``history_len`` x gpus x ``RING_FIELDS``), a ring like ``ring``."""
    hist_ts: npt.NDArray[np.float64]
    hist_pos: npt.NDArray[np.int32]
    acc_sum: F32
    """The bucket being filled: sums and counts of the readings in it (NaN readings not counted)."""
    acc_n: npt.NDArray[np.int32]
    acc_bucket: npt.NDArray[np.int64]

    def __init__(
        self,
        gpus_per_node: int = 8,
        ring_len: int = 90,
        capacity: int = 64,
        max_nodes: int = 100_000,
        *,
        history_len: int = 125,
        history_step_s: float = 30.0,
    ) -> None:
        self.gpus = gpus_per_node
        self.history_len = history_len
        self.history_step_s = history_step_s
        self.max_nodes = max_nodes
        self.refused = 0
        """Frames dropped because they named a new node past ``max_nodes``."""
        self.ring_len = ring_len
        self.names: list[str] = []
        self.index: dict[str, int] = {}
        self.models: list[str] = []
        self.uuids: list[list[str | None]] = []
        self.ports: list[Sequence[Any] | None] = []
        """Per row: the newest frame's RDMA ports as decoded (None: its frames carry none)."""
        self.layout = 0
        self.frames = 0
        self.capacity = 0
        self._resize(max(1, capacity), gpus_per_node)

    def _resize(self, cap: int, gpus: int) -> None:
        n, r, first = len(self.names), self.ring_len, self.capacity == 0
        old = {} if first else dict(vars(self))
        self.latest = _grown(old.get("latest"), n, (cap, gpus, len(LATEST_FIELDS)), np.nan, np.float32)
        self.present = _grown(old.get("present"), n, (cap, gpus), False, np.bool_)
        self.expected = _grown(old.get("expected"), n, (cap,), 0, np.int16)
        self.seen_at = _grown(old.get("seen_at"), n, (cap,), -math.inf, np.float64)
        self.ring = _grown(old.get("ring"), n, (cap, r, gpus, len(RING_FIELDS)), np.nan, np.float16)
        self.ring_ts = _grown(old.get("ring_ts"), n, (cap, r), np.nan, np.float64)
        self.ring_pos = _grown(old.get("ring_pos"), n, (cap,), 0, np.int32)
        h, k = self.history_len, len(RING_FIELDS)
        self.hist = _grown(old.get("hist"), n, (cap, h, gpus, k), np.nan, np.float16)
        self.hist_ts = _grown(old.get("hist_ts"), n, (cap, h), np.nan, np.float64)
        self.hist_pos = _grown(old.get("hist_pos"), n, (cap,), 0, np.int32)
        self.acc_sum = _grown(old.get("acc_sum"), n, (cap, gpus, k), 0.0, np.float32)
        self.acc_n = _grown(old.get("acc_n"), n, (cap, gpus, k), 0, np.int32)
        self.acc_bucket = _grown(old.get("acc_bucket"), n, (cap,), -1, np.int64)
        if gpus > self.gpus:
            self.uuids = [u + [None] * (gpus - self.gpus) for u in self.uuids]
            self.layout += 1
        self.gpus, self.capacity = gpus, cap

    def _row(self, node: str) -> int:
        row = self.index.get(node)
        if row is not None:
            return row
        row = len(self.names)
        if row >= self.capacity:
            self._resize(self.capacity * 2, self.gpus)
        self.names.append(node)
        self.index[node] = row
        self.models.append("")
        self.uuids.append([None] * self.gpus)
        self.ports.append(None)
        self.layout += 1
        return row

    def declare(self, nodes: Sequence[str] | set[str]) -> int:
        """Put nodes on the map before they report (drawn silent until their first frame); returns how
        many were new. Bounded by ``max_nodes`` as frames are."""
        added = 0
        for node in sorted(n for n in nodes if n not in self.index):
            if len(self.names) >= self.max_nodes:
                self.refused += 1
                break
            self._row(node)
            added += 1
        return added

    def _bucket(self, row: int, now: float, values: F32 | None, idx: list[int]) -> None:
        """Add this frame's readings to the row's history bucket, closing the previous one first."""
        bucket = int(now // self.history_step_s)
        if bucket != self.acc_bucket[row]:
            if self.acc_bucket[row] >= 0:
                n = self.acc_n[row]
                with np.errstate(invalid="ignore", divide="ignore"):
                    mean = np.where(n > 0, self.acc_sum[row] / np.maximum(n, 1), np.nan)
                pos = int(self.hist_pos[row])
                self.hist[row, pos] = mean
                self.hist_ts[row, pos] = (float(self.acc_bucket[row]) + 0.5) * self.history_step_s
                self.hist_pos[row] = (pos + 1) % self.history_len
            self.acc_bucket[row] = bucket
            self.acc_sum[row] = 0.0
            self.acc_n[row] = 0
        if values is None or not idx:
            return
        ring_values = values[:, : len(RING_FIELDS)]
        ok = ~np.isnan(ring_values)
        self.acc_sum[row, idx] += np.where(ok, ring_values, 0.0)
        self.acc_n[row, idx] += ok

    def ingest(self, node: str, frame: telemetry.FrameView, now: float) -> bool:
        """One frame from ``node`` (the subject's node), received at ``now``; ``False`` when refused (a
        new node past ``max_nodes``). One vectorised write per array, not one per reading: this runs for
        every frame of the fleet."""
        if node not in self.index and len(self.names) >= self.max_nodes:
            self.refused += 1
            return False
        gpus = frame.gpus
        widest = max((g.index for g in gpus), default=-1) + 1
        if self.gpus < widest <= 256:
            self._resize(self.capacity, widest)  # a frame with more GPUs than expected: more columns
        row = self._row(node)
        self.frames += 1
        self.seen_at[row] = now
        expected = frame.gpus_expected if frame.gpus_expected is not None else len(gpus)
        self.expected[row] = min(expected, self.gpus)
        pos = int(self.ring_pos[row])
        self.ring_pos[row] = (pos + 1) % self.ring_len
        self.ring_ts[row, pos] = now
        self.ports[row] = getattr(frame, "ports", None)  # kept as decoded: read only by the GPU view
        self.latest[row] = np.nan
        self.present[row] = False
        self.ring[row, pos] = np.nan
        kept = [g for g in gpus if 0 <= g.index < self.gpus]
        if not kept:
            self._bucket(row, now, None, [])
        else:
            # None (not supported) becomes NaN in a float array
            values = np.array(
                [
                    (g.temp_c, g.power_w, g.util_gpu_pct, g.sm_clock_mhz, g.power_limit_w,
                     getattr(g, "slowdown_temp_c", None))
                    for g in kept
                ],
                dtype=np.float32,
            )  # fmt: skip
            idx = [g.index for g in kept]
            self.latest[row, idx] = values
            self.present[row, idx] = True
            self.ring[row, pos, idx] = values[:, : len(RING_FIELDS)]
            self._bucket(row, now, values, idx)
            uuids = self.uuids[row]
            for g in kept:
                if g.uuid is not None:
                    uuids[g.index] = g.uuid
            if kept[0].model:
                self.models[row] = kept[0].model or ""
        return True

    @property
    def temp(self) -> F32:
        """Latest temperature per cell (a view: writing it sets the readings)."""
        return self.latest[:, :, 0]

    def temps_u8(self) -> npt.NDArray[np.uint8]:
        """Latest temperature per cell (rows x gpus), whole degrees 0..254, ``NO_TEMP`` when unknown."""
        n = len(self.names)
        t = self.temp[:n]
        out = np.full(t.shape, NO_TEMP, dtype=np.uint8)
        ok = ~np.isnan(t) & self.present[:n]
        out[ok] = np.clip(np.rint(t[ok]), 0, NO_TEMP - 1).astype(np.uint8)
        return out

    def series(self, node: str, gpu: int) -> dict[str, object] | None:
        """One GPU's readings for its charts, oldest first: the history's bucket means older than the
        ring, then the ring's every frame (``ts`` and ``series``, ``step_s`` the history's bucket), plus
        its latest readings; ``None`` if unknown."""
        row = self.index.get(node)
        if row is None or not 0 <= gpu < self.gpus:
            return None
        order = np.roll(np.arange(self.ring_len), -int(self.ring_pos[row]))
        ts = self.ring_ts[row, order]
        keep = ~np.isnan(ts)
        values = self.ring[row, order][:, gpu][keep].astype(np.float64)
        ring_ts = ts[keep]
        horder = np.roll(np.arange(self.history_len), -int(self.hist_pos[row]))
        hts = self.hist_ts[row, horder]
        oldest = float(ring_ts[0]) if ring_ts.size else math.inf
        hkeep = ~np.isnan(hts) & (hts + self.history_step_s / 2 <= oldest)
        hvalues = self.hist[row, horder][:, gpu][hkeep].astype(np.float64)
        all_ts = np.concatenate([hts[hkeep], ring_ts])
        all_values = np.concatenate([hvalues, values]) if hvalues.size else values
        return {
            "node": node,
            "gpu": gpu,
            "uuid": self.uuids[row][gpu],
            "model": self.models[row] or None,
            "present": bool(self.present[row, gpu]),
            "seen_at": _num(float(self.seen_at[row])),
            "ts": [round(float(x), 3) for x in all_ts],
            "series": {f: _nums(all_values[:, k]) for k, f in enumerate(RING_FIELDS)},
            "history_points": int(hkeep.sum()),
            "step_s": self.history_step_s,
            "latest": {f: _num(float(self.latest[row, gpu, k])) for k, f in enumerate(LATEST_FIELDS)},
            "ports": self.node_ports(row),
        }

    def node_ports(self, row: int) -> list[dict[str, object]] | None:
        """The node's RDMA ports in its newest frame (what a person checks first: state, rate and the
        error counters), None when its frames carry none."""
        ports = self.ports[row]
        if ports is None:
            return None
        return [{k: getattr(p, k) for k in PORT_FIELDS} for p in ports]

    def node(self, node: str) -> dict[str, Any] | None:
        """Every GPU of one node, latest readings: what the per-node view lists; ``None`` if unknown."""
        row = self.index.get(node)
        if row is None:
            return None
        seen = float(self.seen_at[row])
        gpus = []
        for g in range(self.gpus):
            if g >= int(self.expected[row]) and not self.present[row, g] and self.uuids[row][g] is None:
                continue
            gpus.append(
                {
                    "gpu": g,
                    "uuid": self.uuids[row][g],
                    "present": bool(self.present[row, g]),
                    "latest": {f: _num(float(self.latest[row, g, k])) for k, f in enumerate(LATEST_FIELDS)},
                }
            )
        return {
            "node": node,
            "model": self.models[row] or None,
            "seen_at": _num(seen),
            "expected": int(self.expected[row]),
            "gpus": gpus,
            "ports": self.node_ports(row),
        }

    def find(self, text: str, limit: int = 20) -> list[dict[str, object]]:
        """Nodes whose name contains ``text`` and GPUs whose UUID does (case-insensitive), at most
        ``limit``: the page's search. ``node/3`` or ``node gpu 3`` names one GPU of a node."""
        q = text.strip().lower()
        if not q:
            return []
        out: list[dict[str, object]] = []
        for sep in ("/gpu", "/", " gpu ", ":"):
            head, _, tail = q.rpartition(sep)
            if head and tail.isdigit() and head in {n.lower() for n in self.names}:
                name = next(n for n in self.names if n.lower() == head)
                if int(tail) < self.gpus:
                    return [{"node": name, "gpu": int(tail), "uuid": self.uuids[self.index[name]][int(tail)]}]
        exact = [n for n in self.names if n.lower() == q]
        out += [{"node": n, "gpu": None, "uuid": None} for n in exact]
        for n in self.names:
            if len(out) >= limit:
                return out
            if q in n.lower() and n not in exact:
                out.append({"node": n, "gpu": None, "uuid": None})
        for row, uuids in enumerate(self.uuids):
            for g, u in enumerate(uuids):
                if len(out) >= limit:
                    return out
                if u is not None and q in u.lower():
                    out.append({"node": self.names[row], "gpu": g, "uuid": u})
        return out


def _num(x: float) -> float | None:
    return None if not math.isfinite(x) else round(x, 2)


def _nums(xs: Sequence[float] | npt.NDArray[np.float64]) -> list[float | None]:
    return [_num(float(x)) for x in xs]
