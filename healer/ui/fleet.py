"""The status page's picture of the fleet's telemetry: latest readings and a short ring per GPU.

Columnar on purpose: 10,000 nodes x 8 GPUs is 80,000 cells, so the latest readings live in numpy arrays
(one row per node, in order of first sight) and a change set for the browser is a vectorised comparison,
not a loop over GPUs. The ring keeps ``ring_len`` recent readings of ``RING_FIELDS`` per GPU as float16
(0.06 C, 0.5 W resolution: plenty for a chart, half the memory of float32; 58 MB at 10,000 x 8 x 90).

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

    def __init__(
        self, gpus_per_node: int = 8, ring_len: int = 90, capacity: int = 64, max_nodes: int = 100_000
    ) -> None:
        self.gpus = gpus_per_node
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
        if kept:
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
        """The ring of one GPU, oldest first, plus its latest readings; ``None`` if unknown."""
        row = self.index.get(node)
        if row is None or not 0 <= gpu < self.gpus:
            return None
        order = np.roll(np.arange(self.ring_len), -int(self.ring_pos[row]))
        ts = self.ring_ts[row, order]
        keep = ~np.isnan(ts)
        values = self.ring[row, order][:, gpu][keep].astype(np.float64)
        return {
            "node": node,
            "gpu": gpu,
            "uuid": self.uuids[row][gpu],
            "model": self.models[row] or None,
            "present": bool(self.present[row, gpu]),
            "seen_at": _num(float(self.seen_at[row])),
            "ts": [round(float(x), 3) for x in ts[keep]],
            "series": {f: _nums(values[:, k]) for k, f in enumerate(RING_FIELDS)},
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


def _num(x: float) -> float | None:
    return None if not math.isfinite(x) else round(x, 2)


def _nums(xs: Sequence[float] | npt.NDArray[np.float64]) -> list[float | None]:
    return [_num(float(x)) for x in xs]
