"""PortState: what the rule engine remembers of the nodes' RDMA ports, beside FleetState's GPUs.

Rules read ports at *port level*: one value per (node, port slot), the slot being the place a port
name (``mlx5_0/1``) took when the node first reported it. A port-scope rule (``scope: port``) reads
them one port at a time (``port_state != 4``) and fires per (node, port): a port fault is one incident
for that node and port, its firing naming the port (``Firing.port``). Elsewhere, like GPU metrics in a
node-scope rule, port metrics are aggregated over the node's ports (``count(port_state != 4)``,
``max(port_rate_gbps)``), and the evidence names the ports that made it fire (``ports``:
``mlx5_3/1``). Rows are FleetState's node rows (FleetState feeds and grows this state), so port-level
and node-level values line up without a lookup.

Instant values and range functions work as for GPUs: the newest value per slot (NaN when the port is
absent from the node's newest frame: an HCA that vanished reads as unknown, and ``ports_present``
falls), and per-metric bucketed windows (windows.py) with counter resets handled as for GPU counters.
Only what the loaded rules read is kept.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from healer.rules import windows

F64 = npt.NDArray[np.float64]
Rows = windows.Rows


class PortState:
    def __init__(self, cap: int, *, buckets_per_window: int = 20, max_buckets: int = 240) -> None:
        self.cap, self.slots = cap, 1
        self.buckets_per_window = buckets_per_window
        self.max_buckets = max_buckets
        self.slot_of: list[dict[str, int]] = [{} for _ in range(cap)]
        """Per node row: port name → slot."""
        self.name_of: list[list[str]] = [[] for _ in range(cap)]
        """Per node row: slot → port name (the reverse of ``slot_of``)."""
        self.known = np.zeros((cap, 1), dtype=bool)
        """The slots a port of the node took (ever reported since the node was first seen): the
        targets of a port-scope rule, which holds a port that vanished from sysfs as unknown."""
        self.present = np.full(cap, np.nan)
        """Ports in the node's newest frame; NaN: its frames carry no ports (an agent not reading them)."""
        self.fabric_manager = np.full(cap, np.nan)
        """The newest frame's ``fabric_manager_up`` as 1/0; NaN where not checked."""
        self.seen = np.zeros((cap, 1), dtype=bool)
        self.col: dict[str, int] = {}
        self.fields: list[str] = []
        """PortSample field of each column."""
        self.latest = np.full((0, cap, 1), np.nan)
        self.history: dict[str, windows.History] = {}
        self._getter: Any = None

    # -- configuration
    def set_needs(
        self, columns: Mapping[str, str], wins: Mapping[str, Mapping[str, tuple[float, ...]]]
    ) -> None:
        """``columns``: rule metric → PortSample field; ``wins``: metric → kind → windows."""
        old_latest, old_col = self.latest, self.col
        self.col = {name: i for i, name in enumerate(columns)}
        self.fields = list(columns.values())
        self.latest = np.full((len(columns), self.cap, self.slots), np.nan)
        for name, i in self.col.items():
            if name in old_col:
                self.latest[i] = old_latest[old_col[name]]
        self._getter = operator.attrgetter(*self.fields) if self.fields else None
        self.history = windows.histories(
            wins, self.col, self.history, (self.cap, self.slots),
            buckets_per_window=self.buckets_per_window, max_buckets=self.max_buckets,
        )  # fmt: skip

    # -- ingest (FleetState hands over the ports of the frames it accepted, in its own order)
    def apply(self, items: list[tuple[int, float, Sequence[Any] | None, bool | None]]) -> None:
        """One batch (no node twice): node row, the frame's accounted-at time, its ports (None: the
        frame carries none, so the node's ports are unknown, not absent), its ``fabric_manager_up``."""
        if items:
            rows = [it[0] for it in items]
            self.fabric_manager[rows] = [np.nan if it[3] is None else float(it[3]) for it in items]
        unread = [it[0] for it in items if it[2] is None]
        if unread:
            self.present[unread] = np.nan
            self.seen[unread] = False
            self.latest[:, unread] = np.nan
        items = [it for it in items if it[2] is not None]
        if not items:
            return
        for n, _, ports, _ in items:
            slots = self.slot_of[n]
            for p in ports or ():
                if f"{p.device}/{p.port}" not in slots:
                    slots[f"{p.device}/{p.port}"] = len(slots)
                    self.name_of[n].append(f"{p.device}/{p.port}")
            if len(slots) > self.slots:
                self.grow(self.cap, len(slots))
            self.known[n, : len(slots)] = True
        nodes = np.fromiter((it[0] for it in items), dtype=np.intp, count=len(items))
        ts = np.fromiter((it[1] for it in items), dtype=np.float64, count=len(items))
        grid = np.full((len(items), self.slots, len(self.col)), np.nan)
        self.seen[nodes] = False
        getter = self._getter
        for k, (n, _, ports, _) in enumerate(items):
            slots = self.slot_of[n]
            for p in ports or ():
                j = slots[f"{p.device}/{p.port}"]
                self.seen[n, j] = True
                if getter is not None:
                    row = getter(p)
                    grid[k, j] = [_number(v) for v in (row if len(self.fields) > 1 else (row,))]
        self.present[nodes] = [len(it[2] or ()) for it in items]
        with np.errstate(invalid="ignore"):
            self.latest[:, nodes] = grid.transpose(2, 0, 1)
            for hist in self.history.values():
                windows.accumulate(hist, grid[:, :, hist.column], nodes, ts)

    # -- reading
    def instant(self, name: str, rows: Rows, fresh: npt.NDArray[np.bool_]) -> F64:
        plane = self.latest[self.col[name]][rows]
        return np.where(fresh & self.seen[rows], plane, np.nan)

    def window(self, func: str, name: str, window_s: float, now: float, rows: Rows) -> F64:
        return windows.read(self.history[name], func, window_s, now, rows, self.seen[rows])

    def name(self, n: int, slot: int) -> str | None:
        """The port of node row ``n`` in ``slot`` (``mlx5_0/1``); None for a slot it never used."""
        names = self.name_of[n]
        return names[slot] if slot < len(names) else None

    def slot(self, n: int, name: str) -> int | None:
        return self.slot_of[n].get(name)

    def names(self, n: int, hit: npt.NDArray[np.bool_]) -> str:
        """The ports of node row ``n`` whose slots are set in ``hit`` (evidence), in slot order."""
        by_slot = {j: name for name, j in self.slot_of[n].items()}
        return ", ".join(by_slot[j] for j in np.flatnonzero(hit).tolist() if j in by_slot)

    # -- bookkeeping
    def forget(self, n: int) -> None:
        self.slot_of[n] = {}
        self.name_of[n] = []
        self.known[n] = False
        self.present[n] = np.nan
        self.fabric_manager[n] = np.nan
        self.seen[n] = False
        self.latest[:, n] = np.nan
        for hist in self.history.values():
            hist.last_value[n] = np.nan
            hist.last_valid_ts[n] = -np.inf
            for ring in hist.rings.values():
                ring.data[:, n] = ring.init

    def nbytes(self) -> int:
        arrays = [self.present, self.fabric_manager, self.seen, self.known, self.latest]
        for hist in self.history.values():
            arrays += [hist.last_value, hist.last_valid_ts]
            arrays += [a for r in hist.rings.values() for a in (r.ids, r.data)]
        return sum(a.nbytes for a in arrays)

    def grow(self, cap: int, slots: int) -> None:
        def pad(a: Any, node_axis: int, slot_axis: int | None, fill: Any) -> Any:
            shape = list(a.shape)
            shape[node_axis] = cap
            if slot_axis is not None:
                shape[slot_axis] = slots
            out = np.full(shape, fill, dtype=a.dtype)
            out[tuple(slice(0, s) for s in a.shape)] = a
            return out

        self.slot_of += [{} for _ in range(cap - self.cap)]
        self.name_of += [[] for _ in range(cap - self.cap)]
        self.known = pad(self.known, 0, 1, False)
        self.present = pad(self.present, 0, None, np.nan)
        self.fabric_manager = pad(self.fabric_manager, 0, None, np.nan)
        self.seen = pad(self.seen, 0, 1, False)
        self.latest = pad(self.latest, 1, 2, np.nan)
        for hist in self.history.values():
            hist.last_value = pad(hist.last_value, 0, 1, np.nan)
            hist.last_valid_ts = pad(hist.last_valid_ts, 0, 1, -np.inf)
            for ring in hist.rings.values():
                ring.data = pad(ring.data, 1, 2, ring.init)
        self.cap, self.slots = cap, slots


def _number(value: Any) -> float:
    """A PortSample value as a float: None is NaN; ``link_layer`` (the one string) is 1 for InfiniBand."""
    if value is None:
        return math.nan
    if isinstance(value, str):
        return 1.0 if value == "InfiniBand" else 0.0
    return float(value)
