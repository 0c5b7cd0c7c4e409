"""Fail-slow through the fabric (#28): the node whose RDMA port is congested or erroring, against its job's
other nodes' ports.

A congested or erroring port slows a multi-node job as a whole: the node's ranks communicate slower and
every other rank waits for them, so no GPU's clock lags and the GPU tests name nobody. The port counters
do tell (frames v2, schemas/fabric.py): ``PortWatch`` keeps each node's newest counters, and at each of
the scorer's windows ``PortTest`` compares, per job on ``min_nodes`` (2) or more nodes, each node's
worst port with the job's *other* nodes' (their median, leave-one-out, so a two-node job compares with
the other node):

- congested: ``port_xmit_wait`` rising by ``CONGESTED_WAIT_PER_S`` (the default pack's
  ``rdma-port-congested`` threshold) or more and ``ratio`` (10) times the others' rate;
- erroring: the error counters (``PORT_ERRORS``) rising in the window while the others' do not.

A node lagging so in ``persist`` (3) windows in a row is a straggler (test ``port``), named as a node
(all its GPUs, one node incident). A node's ports are shared by its jobs, so a 4+4 node is judged in each
of its multi-node jobs. Traffic the job makes itself can congest a port too (an incast on one rank's
node), which is why the others' rate is the reference, not a fixed line; a fabric-wide congestion slows
every node's ports and names nobody. A port on a single-node job's node is not compared (the job's
collectives stay inside the node; the fabric rules still see it). All numpy per window, no Python loop
per job; ``PortWatch.observe`` runs on the frames the scorer folds (every ``sample_every_s``).

``PortWatch.evidence`` also explains a straggler the GPU tests found: a port of its node trained down,
erroring or congested in the last 10 minutes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Final

import numpy as np

from healer.schemas import telemetry

PORT_ERRORS: Final = (
    "symbol_error", "link_downed", "port_rcv_errors", "port_xmit_discards", "local_link_integrity_errors",
)  # fmt: skip
PORT_CONGESTION: Final = "port_xmit_wait"
CONGESTED_WAIT_PER_S: Final = 1e7
"""A port is congested when its ``port_xmit_wait`` rises this fast (ticks a second, the default pack's
``rdma-port-congested`` threshold): a healthy busy port's counter rises too, far slower."""
FORGET_WINDOWS: Final = 30
"""A (job, node) the port test has not seen with load for this many windows is forgotten."""
PORT_BASE_S: Final = 600.0
"""A node's port counters are compared with what they were up to this long ago (then the base moves)."""


@dataclasses.dataclass(frozen=True)
class Settings:
    persist: int = 3
    """Windows in a row a node's port must lag its job's other nodes' before it is named."""
    min_nodes: int = 2
    ratio: float = 10.0
    """A congested port's wait rate is at least this many times the job's other nodes' (median)."""
    wait_floor_per_s: float = 1e4
    """The others' wait rate counts as at least this (ticks a second): idle ports wait almost never."""
    errors_min: float = 1.0
    """Error counter increments in a window that make a port erroring (the others' median must be 0)."""


@dataclasses.dataclass(frozen=True)
class NodePorts:
    """One node's worst port in one window."""

    wait_per_s: float
    wait_port: str
    errors: float
    error_port: str


class PortWatch:
    """Per node: its RDMA ports' rates and how their error and congestion counters moved lately, for the
    straggler incident's evidence (a port trained down, erroring or congested on the straggler's node),
    and per scorer window (``window``) each node's worst port for ``PortTest``. A frame's ports are only
    kept as they came (``observe`` is on ingest's path, every folded frame); they are read when a window
    closes, a base moves (every ``PORT_BASE_S``) or an incident asks."""

    def __init__(self) -> None:
        self._base: dict[str, tuple[float, dict[str, dict[str, int]]]] = {}
        self._last: dict[str, dict[str, dict[str, int]]] = {}
        self._rate: dict[str, dict[str, float]] = {}
        self._last_ts: dict[str, float] = {}
        self._raw: dict[str, tuple[float, Sequence[Any]]] = {}
        """Each node's newest ports, not read yet."""
        self._prev: dict[str, tuple[float, dict[str, dict[str, int]]]] = {}
        """Each node's counters at the end of the last window (``window``)."""

    def observe(self, frame: telemetry.FrameView) -> None:
        ports = getattr(frame, "ports", None)
        if not ports:
            return
        self._raw[frame.node] = (frame.ts, ports)
        base = self._base.get(frame.node)
        if base is None or frame.ts - base[0] >= PORT_BASE_S:
            self._read(frame.node)

    def _read(self, node: str) -> None:
        """The node's newest ports (kept by ``observe``) into counters and rates."""
        raw = self._raw.pop(node, None)
        if raw is None:
            return
        now: dict[str, dict[str, int]] = {}
        rates: dict[str, float] = {}
        for p in raw[1]:
            name = f"{p.device}/{p.port}"
            now[name] = {
                k: v for k in (*PORT_ERRORS, PORT_CONGESTION) if (v := getattr(p, k, None)) is not None
            }
            if p.rate_gbps is not None:
                rates[name] = float(p.rate_gbps)
        self.record(node, raw[0], now, rates)

    def record(
        self, node: str, ts: float, counters: dict[str, dict[str, int]], rates: dict[str, float]
    ) -> None:
        """One node's port counters (``observe``; benches call it with their own arrays)."""
        self._last[node], self._rate[node] = counters, rates
        self._last_ts[node] = ts
        base = self._base.get(node)
        if base is None or ts - base[0] >= PORT_BASE_S:
            self._base[node] = (ts, counters)

    def forget_node(self, node: str) -> None:
        for d in (self._base, self._last, self._rate, self._last_ts, self._prev, self._raw):
            d.pop(node, None)

    def window(self) -> dict[str, NodePorts]:
        """Each node's worst port since the last call (its wait rate and error increments; a counter that
        went back, as after a driver reload, counts from 0); the next window starts here."""
        for node in list(self._raw):
            self._read(node)
        out: dict[str, NodePorts] = {}
        for node, counters in self._last.items():
            ts = self._last_ts[node]
            prev = self._prev.get(node)
            self._prev[node] = (ts, counters)
            if prev is None or ts <= prev[0]:
                continue
            span = ts - prev[0]
            wait, wait_port, errors, error_port = 0.0, "", 0.0, ""
            for name, now in counters.items():
                before = prev[1].get(name, {})
                w = _rise(now, before, PORT_CONGESTION) / span
                e = sum(_rise(now, before, k) for k in PORT_ERRORS)
                if w > wait:
                    wait, wait_port = w, name
                if e > errors:
                    errors, error_port = e, name
            out[node] = NodePorts(wait, wait_port, errors, error_port)
        return out

    def evidence(self, node: str) -> dict[str, float | str]:
        self._read(node)
        out: dict[str, float | str] = {}
        rates = self._rate.get(node, {})
        top = max(rates.values(), default=0.0)
        slow = sorted(name for name, r in rates.items() if r < top)
        if slow:
            out["straggler.ports_down_trained"] = ",".join(f"{n}@{rates[n]:g}G/{top:g}G" for n in slow)
        base_ts, base = self._base.get(node, (0.0, {}))
        span = self._last_ts.get(node, base_ts) - base_ts
        erroring, waiting = [], []
        for name, counters in self._last.get(node, {}).items():
            before = base.get(name, {})
            rose = sum(max(0, counters.get(k, 0) - before.get(k, 0)) for k in PORT_ERRORS if k in before)
            if rose:
                erroring.append(f"{name}+{rose}")
            wait = counters.get(PORT_CONGESTION, 0) - before.get(PORT_CONGESTION, 0)
            if PORT_CONGESTION in before and span > 0 and wait >= CONGESTED_WAIT_PER_S * span:
                waiting.append(name)
        if erroring:
            out["straggler.ports_erroring"] = ",".join(sorted(erroring))
        if waiting:
            out["straggler.ports_congested"] = ",".join(sorted(waiting))
        return out


def _rise(now: Mapping[str, int], before: Mapping[str, int], key: str) -> float:
    if key not in now or key not in before:
        return 0.0
    rise = now[key] - before[key]
    return float(rise if rise >= 0 else now[key])  # reset: counts from 0


@dataclasses.dataclass(frozen=True)
class Lagging:
    """A node whose port lags its job's other nodes' in this window."""

    job: str
    node: str
    congested: bool
    ports: NodePorts
    reference_wait_per_s: float
    reference_errors: float
    nodes: int


class PortTest:
    """The port test's streaks per (job, node) across windows; ``score`` gives the confirmed ones."""

    def __init__(self, settings: Settings | None = None) -> None:
        self.s = settings or Settings()
        self._streak: dict[tuple[str, str], int] = {}
        self._seen: dict[tuple[str, str], int] = {}
        """The window each (job, node) last had port data and load in."""
        self._window = 0

    def score(
        self, job_nodes: Mapping[str, Sequence[str]], ports: Mapping[str, NodePorts]
    ) -> list[tuple[Lagging, int]]:
        """One window: ``job_nodes`` each job's nodes with load in it (the scorer's), ``ports`` each
        node's worst port (``PortWatch.window``). Returns the lagging (job, node) pairs confirmed after
        ``persist`` windows, with their streak. A pair without load or port data this window (a
        checkpoint, a restart, a late frame) neither counts nor resets; one unseen for
        ``FORGET_WINDOWS`` is dropped (its job ended)."""
        self._window += 1
        lagging = port_lag(job_nodes, ports, self.s)
        now = {(lag.job, lag.node): lag for lag in lagging}
        for key in ((job, node) for job, nodes in job_nodes.items() for node in nodes if node in ports):
            self._seen[key] = self._window
            if key in now:
                self._streak[key] = self._streak.get(key, 0) + 1
            else:
                self._streak.pop(key, None)
        for key in [k for k, w in self._seen.items() if self._window - w > FORGET_WINDOWS]:
            del self._seen[key]
            self._streak.pop(key, None)
        return [(lag, self._streak[key]) for key, lag in now.items() if self._streak[key] >= self.s.persist]

    def pending(self) -> set[str]:
        """Jobs with a node whose port lags but is not yet confirmed."""
        return {job for (job, _), n in self._streak.items() if 0 < n < self.s.persist}


def port_lag(
    job_nodes: Mapping[str, Sequence[str]], ports: Mapping[str, NodePorts], s: Settings
) -> list[Lagging]:
    """The (job, node) pairs whose worst port lags the job's other nodes' (leave-one-out median), for
    every job on ``min_nodes`` or more nodes with port data, all at once."""
    jobs_l, nodes_l = [], []
    for job, nodes in job_nodes.items():
        have = [n for n in nodes if n in ports]
        if len(have) >= s.min_nodes:
            jobs_l += [job] * len(have)
            nodes_l += have
    if not nodes_l:
        return []
    names, codes = np.unique(np.array(jobs_l), return_inverse=True)
    wait = np.array([ports[n].wait_per_s for n in nodes_l])
    errors = np.array([ports[n].errors for n in nodes_l])
    ref_wait = loo_median(codes, wait)
    ref_err = loo_median(codes, errors)
    congested = (wait >= CONGESTED_WAIT_PER_S) & (wait >= s.ratio * np.maximum(ref_wait, s.wait_floor_per_s))
    erroring = (errors >= s.errors_min) & (ref_err == 0)
    size = np.bincount(codes)
    out = []
    for i in np.flatnonzero(congested | erroring).tolist():
        job, node = str(names[codes[i]]), nodes_l[i]
        out.append(
            Lagging(job, node, bool(congested[i]), ports[node], float(ref_wait[i]), float(ref_err[i]),
                    int(size[codes[i]]))
        )  # fmt: skip
    return out


def loo_median(codes: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Each element's group median without itself (leave-one-out), by one sort: NaN in a group of one."""
    out = np.full(v.size, np.nan)
    if not v.size:
        return out
    order = np.lexsort((v, codes))
    cs, vs = codes[order], v[order]
    size = np.bincount(cs)
    start = np.concatenate(([0], np.cumsum(size)[:-1]))
    n = size[cs]
    r = np.arange(v.size) - start[cs]  # each element's rank in its group
    m = n - 1  # the others
    ok = m > 0
    q1, q2 = (m - 1) // 2, m // 2
    o1, o2 = q1 + (q1 >= r), q2 + (q2 >= r)  # positions among the others -> in the group
    base = start[cs]
    med = np.full(v.size, np.nan)
    med[ok] = (vs[(base + o1)[ok]] + vs[(base + o2)[ok]]) / 2
    out[order] = med
    return out
