"""The simulated nodes' RDMA ports: P InfiniBand NDR ports per node (ConnectX-7, 400 Gb/s), as the agent's
sysfs reader reports them (schemas/fabric.py), and what the port faults (faults.py) do to them.

State per (node, port): PortState and PortPhysicalState, the rate, whether the HCA is on the bus, and
the PortCounters the fabric rules read. A healthy port is ACTIVE / LinkUp at full rate; its data
counters grow with the node's GPU load (a training job keeps its rails busy), its wait counter a little;
its error counters stay at 0. A node reboot brings every HCA back, retrains every link at full rate and
zeroes the counters (a driver load), as on a real node. Arrays, not objects, like the rest of the fleet.
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np
import numpy.typing as npt

from healer.schemas import fabric

RATE_GBPS: Final = 400.0
WAIT_PER_S: Final = 2_000.0
"""port_xmit_wait ticks a second on a healthy busy port (the congestion rule's threshold is 1e7)."""
BYTES_PER_S_AT_FULL_LOAD: Final = RATE_GBPS * 1e9 / 8 * 0.3
"""Bytes a second each way at 100 % GPU utilisation (a third of the line rate: collectives are bursty)."""
COUNTERS: Final = (
    "symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors", "port_xmit_wait",
    "port_xmit_data_bytes", "port_rcv_data_bytes",
)  # fmt: skip
"""The counters simulated; every other PortSample counter reads 0."""


class Ports:
    def __init__(self, nodes: int, ports: int, rng: np.random.Generator) -> None:
        self.nodes, self.ports = nodes, ports
        shape = (nodes, ports)
        self._rng = rng
        self.state = np.full(shape, fabric.ACTIVE, dtype=np.int64)
        self.phys = np.full(shape, fabric.LINK_UP, dtype=np.int64)
        self.rate = np.full(shape, RATE_GBPS)
        self.present = np.ones(shape, dtype=np.bool_)
        """The HCA is on the bus (a missing one has no sysfs entry, so no entry in the frame)."""
        self.up_at = np.full(shape, -np.inf)
        """When a link that went down trains up again (a flap)."""
        self.symbol_rate = np.zeros(shape)
        self.counters: dict[str, npt.NDArray[np.int64]] = {
            name: np.zeros(shape, dtype=np.int64) for name in COUNTERS
        }
        self.wait_rate = np.full(shape, WAIT_PER_S)

    def step(self, t: float, dt: float, util_pct: npt.NDArray[np.float64]) -> None:
        """Advance every port by ``dt`` at clock ``t``; ``util_pct``: the nodes' GPU utilisation."""
        back = (self.state != fabric.ACTIVE) & (self.up_at <= t) & np.isfinite(self.up_at)
        if back.any():
            self.state[back], self.phys[back], self.up_at[back] = fabric.ACTIVE, fabric.LINK_UP, -np.inf
        live = self.present & (self.state == fabric.ACTIVE)
        load = np.clip(util_pct.mean(axis=1, keepdims=True) / 100.0, 0.0, 1.0)
        data = np.where(live, np.rint(BYTES_PER_S_AT_FULL_LOAD * load * dt / 4) * 4, 0).astype(np.int64)
        self.counters["port_xmit_data_bytes"] += data
        self.counters["port_rcv_data_bytes"] += data
        self.counters["port_xmit_wait"] += np.where(live, np.rint(self.wait_rate * dt), 0).astype(np.int64)
        if self.symbol_rate.any():
            self.counters["symbol_error"] += self._rng.poisson(self.symbol_rate * dt).astype(np.int64)

    # -- what the faults do
    def flap(self, node: int, port: int, t: float, down_s: float) -> None:
        """The link fails its error recovery and goes down for ``down_s``, then trains up again."""
        self.counters["link_error_recovery"][node, port] += 3
        self.counters["link_downed"][node, port] += 1
        self.state[node, port], self.phys[node, port] = 1, 2  # DOWN, Polling
        self.up_at[node, port] = t + down_s

    def downtrain(self, node: int, port: int, rate_gbps: float) -> None:
        self.rate[node, port] = rate_gbps

    def symbol_burst(self, node: int, port: int, rate_per_s: float) -> None:
        self.symbol_rate[node, port] = rate_per_s

    def hca_missing(self, node: int, port: int) -> None:
        self.present[node, port] = False

    def reboot(self, node: int) -> None:
        """Every HCA back, every link retrained at full rate, counters zeroed (the driver loads)."""
        self.present[node] = True
        self.state[node], self.phys[node] = fabric.ACTIVE, fabric.LINK_UP
        self.rate[node] = RATE_GBPS
        self.up_at[node] = -np.inf
        self.symbol_rate[node] = 0.0
        for arr in self.counters.values():
            arr[node] = 0

    # -- the frame
    def docs(self, node: int) -> list[dict[str, Any]]:
        """The node's ports as PortSample dicts (wire form), HCAs on the bus only."""
        out = []
        for p in np.flatnonzero(self.present[node]).tolist():
            doc: dict[str, Any] = {
                "device": f"mlx5_{p}",
                "port": 1,
                "link_layer": "InfiniBand",
                "state": int(self.state[node, p]),
                "phys_state": int(self.phys[node, p]),
                "rate_gbps": float(self.rate[node, p]) if self.state[node, p] == fabric.ACTIVE else 10.0,
            }
            for name in fabric.COUNTERS:
                arr = self.counters.get(name)
                doc[name] = 0 if arr is None else int(arr[node, p])
            out.append(doc)
        return out
