"""A constant false-alarm rate: each deciding component's threshold from the watched fleet's own tail.

The model's components are normalised to edges learned elsewhere (1.0: the training fleet's healthy
edge). On another fleet a component's healthy spread can be wider (an inlet that swings faster, error
counters that tick), and a fixed edge then fires all day. ``Calibration`` learns, per **pool** of
nodes (GPU model and frame interval: nodes that are alike) and per deciding component, how often the
fleet itself goes past each level, and puts the component's threshold where the expected rate of
incidents stays under a budget SREs set (``anomaly.false_alarm_budget``, per 1,000 node-days), as a
radar's CFAR detector does with its noise floor:

- **The statistic is what opens an incident**: per node and scoring instant, the component's largest
  value over the node's GPUs (as it would decide after the forest's corroboration), held over the
  rule's ``for`` (the smallest of the last ``hold_steps`` values): a node incident needs that much.
- **Counted as incidents, not samples**: per node and level (``LEVELS``, log-spaced), an exceedance
  starts a *cluster* unless the node was above that level less than ``gap_steps`` instants ago (runs
  declustering), so one long excursion is one event, as the rule's hysteresis makes it one incident.
- **A peaks-over-threshold tail fit**: above ``u0``, the highest level with at least ``min_clusters``
  clusters, the cluster rate is fitted with a generalised Pareto survival (shape ``xi >= 0``, scale
  ``sigma``; maximum likelihood on the binned counts), and the threshold is where the fitted rate
  equals the component's share of the budget (the budget over the deciding components: their union
  then stays under it). The rate at ``u0`` is taken at its 95 % upper bound, so a pool with few
  node-days gets a higher threshold, never a lower one; and the threshold is never under a level the
  pool has reached while the budget allows less than one excursion in the node-days watched (where the
  data contradict the extrapolation).
- **Never below the model's own edge** (1.0): calibration only raises a threshold where this fleet's
  normal is wider; a quiet fleet keeps the model's sensitivity.
- **What counts as normal**: every excursion up to the instant it opens an incident (live) counts,
  at every level it has reached then: a false incident is exactly the evidence that the threshold is
  too low. What the node does after, for ``quarantine_steps`` (6 h), is not counted: a fault's course
  is no evidence of this fleet's normal, so a fault counts once, as one excursion, like a false alarm.
  Each level keeps the node-days in which it was watched. A slow fault's ramp below the threshold is
  counted too: harmless among many healthy nodes, not in a small pool where most nodes fail.
- **Shadow until calibrated**: a pool is live once it has ``min_node_days`` of scored node-days; before
  that its would-be incidents are counted (``shadow``), and its scores are capped below the anomaly
  rule's level (``SHADOW_CAP``), so it opens nothing.

Everything is plain arrays exported as a small JSON-able dict (``export`` / ``import_``), kept in KV
with the thermal baselines (``scorer_state``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from healer.anomaly import counters

F64 = npt.NDArray[np.float64]

FORMAT: Final = "healer-anomaly-cfar/2"
DECIDING: Final = ("thermal_gpu", "thermal_rise", "thermal_node", "thermal_peer", "counters")
"""The components whose thresholds are calibrated (the forest only corroborates)."""
LEVELS: Final = np.geomspace(0.1, 100.0, 61)
"""Levels at which clusters are counted, in the model's units (1.0 = scores 0.9 uncalibrated)."""
SHADOW_CAP: Final = 0.5
"""A shadow pool's scores are capped here: under the anomaly rule's level (0.9) and its resolve (0.6)."""
SHADOW_KEPT: Final = 1000
"""Would-be incidents a scorer holds for its caller (``Scorer.take_shadow``); older ones are dropped."""
INTERVALS_S: Final = (1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0)
"""Frame intervals pools are told apart by (a node's measured interval goes to the nearest, in log)."""
_XI: Final = np.linspace(0.0, 1.0, 21)


@dataclasses.dataclass(frozen=True)
class CfarSettings:
    budget_per_1000_node_days: float = 1.0
    """Expected false anomaly incidents per 1,000 node-days, all deciding components together."""
    min_node_days: float = 2.0
    """Scored node-days a pool needs before it goes live (shadow until then)."""
    hold_steps: int = 4
    """Scoring instants a node's value must hold (the anomaly rule's ``for`` over the scoring interval)."""
    gap_steps: int = 10
    """Instants below a level that end a cluster there (5 minutes at 30 s)."""
    min_clusters: int = 20
    """Clusters above the fitting threshold ``u0`` (fewer at every level: the component is quiet)."""
    refit_s: float = 600.0
    """How often (seconds of scoring time) thresholds are fitted again."""
    quarantine_steps: int = 720
    """Instants (6 h at 30 s) a node is not counted after a component went past its live threshold."""
    max_threshold: float = 50.0
    """Highest threshold a fit may set, in the model's units (a component past it is a fault anywhere)."""
    shape_nodes: int = 2
    """Distinct nodes a level needs before its clusters shape the tail fit: one node's excursions past
    every other node's cannot make the pool's tail heavy (the threshold still stays over them)."""


@dataclasses.dataclass(frozen=True)
class Fit:
    """One component's tail fit in one pool: its threshold and what it was fitted from."""

    threshold: float
    u0: float
    clusters_u0: int
    sigma: float
    xi: float


def pool_key(model: str | None, interval_s: float) -> str:
    """``"NVIDIA H200|2s"``: a node's pool from its GPU model and its measured frame interval."""
    near = min(INTERVALS_S, key=lambda v: abs(math.log(max(interval_s, 1e-3) / v)))
    return f"{model or 'unknown'}|{near:g}s"


def gpd_fit(levels: F64, counts: F64) -> tuple[float, float]:
    """(sigma, xi) of a generalised Pareto survival ``(1 + xi y / sigma) ** (-1 / xi)`` (``xi`` 0: an
    exponential) fitted by maximum likelihood to counts of clusters above ``levels`` (ascending, the
    first the fitting threshold; counts non-increasing), on a grid of ``xi`` in [0, 1] and ``sigma``
    (no finer than half the levels' spacing, which the counts cannot resolve)."""
    y = levels - levels[0]
    cells = -np.diff(counts)  # clusters whose level ended between two levels
    last = counts[-1]
    span = max(float(y[-1]), 1e-6)
    # below half the spacing of the levels the counts cannot tell one scale from another
    floor = max(0.5 * float(levels[1] - levels[0]) if len(levels) > 1 else 0.0, span * 1e-3)
    sigmas = np.geomspace(floor, max(span * 10.0, floor * 2), 80)
    best, arg = -math.inf, (span, 0.0)
    for xi in _XI:
        if xi < 1e-9:
            surv = np.exp(-y[None, :] / sigmas[:, None])
        else:
            surv = (1.0 + xi * y[None, :] / sigmas[:, None]) ** (-1.0 / xi)
        with np.errstate(divide="ignore", invalid="ignore"):
            p_cells = np.clip(-np.diff(surv, axis=1), 1e-300, None)
            ll = (cells[None, :] * np.log(p_cells)).sum(axis=1) + last * np.log(
                np.clip(surv[:, -1], 1e-300, None)
            )
        k = int(np.argmax(ll))
        if ll[k] > best:
            best, arg = float(ll[k]), (float(sigmas[k]), float(xi))
    return arg


def threshold_for(
    levels: F64,
    counts: F64,
    days: F64 | float,
    rate_per_day: float,
    s: CfarSettings,
    nodes_at: F64 | None = None,
) -> Fit:
    """The level at which the fitted cluster rate is ``rate_per_day``, from cluster counts above each
    of ``levels`` in ``days`` node-days each (a level is watched only while it is under the threshold
    of the moment, or in shadow); never below 1.0 (the model's own edge).

    Thin data give a higher threshold, never a lower one: the rate at ``u0`` is its 95 % upper bound
    (a pool with few node-days extrapolates from a higher rate), the threshold is never under a level
    the pool has reached while the budget allows less than one excursion in the node-days watched, and
    a pool with fewer than ``min_clusters`` clusters at every level is fitted from its lowest level
    with any. (It used to fall back to the model's edge, 1.0: the mixed fleet's H200 pool, which had
    shown four excursions past 3 in its 2 node-days of shadow, went live at 1.0 and opened most of the
    fifth round's false incidents in its first hours.) A component that has stayed quiet keeps a
    threshold near the model's edge.

    ``nodes_at`` (per level, distinct nodes with a cluster there; None: all count) bounds one node's
    influence: where ``u0`` itself was reached by ``s.shape_nodes`` nodes, the clusters past the
    highest level that many nodes reached do not shape the fit (the floor above keeps the threshold
    over them). A lone excursion far out (two SBE bursts in a row on one GPU, held at 4 where the
    pool's bulk was at 0.3, tuning seed 101 of the mixed fleet) otherwise fitted a shape of 0.8 from
    three clusters, and the extrapolation over four decades of rate went to the cap (50)."""
    counts = np.asarray(counts, dtype=np.float64)
    days = np.broadcast_to(np.asarray(days, dtype=np.float64), counts.shape)
    some = np.flatnonzero((counts > 0) & (days > 0))
    if not len(some):
        return Fit(1.0, float(levels[0]), 0, 0.0, 0.0)
    enough = np.flatnonzero((counts >= s.min_clusters) & (days > 0))
    j = int(enough[-1]) if len(enough) else int(some[0])
    n0 = int(counts[j])
    lam0 = (n0 + 1.96 * math.sqrt(n0) + 2.0) / days[j]  # about the 95 % upper bound of the rate at u0
    u0 = float(levels[j])
    sigma, xi = 0.0, 0.0
    if lam0 <= rate_per_day:
        x = u0
    else:
        # each level's rate at u0's exposure; a higher level never has more clusters than a lower one
        with np.errstate(divide="ignore", invalid="ignore"):
            eff = np.where(days[j:] > 0, counts[j:] * days[j] / days[j:], 0.0)
        eff = np.minimum.accumulate(eff)
        if nodes_at is not None and nodes_at[j] >= s.shape_nodes:
            shared = np.flatnonzero(np.asarray(nodes_at)[j:] >= s.shape_nodes)
            eff[int(shared[-1]) + 1 :] = 0.0  # one node's alone: not the pool's tail
        sigma, xi = gpd_fit(levels[j:], eff) if j < len(levels) - 1 else (u0, 0.0)
        ratio = lam0 / rate_per_day
        x = u0 + (sigma * math.log(ratio) if xi < 1e-9 else sigma / xi * (ratio**xi - 1.0))
    # never under a level this pool has reached while the budget allows less than one excursion in
    # the node-days it was watched: there the fit's extrapolation is contradicted by the data
    seen = np.flatnonzero((counts > 0) & (days * rate_per_day < 1.0))
    if len(seen) and seen[-1] + 1 < len(levels):
        x = max(x, float(levels[seen[-1] + 1]))
    return Fit(float(min(s.max_threshold, max(1.0, x))), u0, n0, sigma, xi)


class Calibration:
    """Per pool and deciding component: cluster counts per level, node-days, fitted thresholds."""

    def __init__(self, settings: CfarSettings | None = None) -> None:
        self.s = settings or CfarSettings()
        self.pools: list[str] = []
        self.counts = np.zeros((0, len(DECIDING), len(LEVELS)))
        """Clusters per (pool, component, level)."""
        self.node_s = np.zeros(0)
        """Scored node-seconds per pool."""
        self.watched_s = np.zeros((0, len(DECIDING), len(LEVELS)))
        """Node-seconds per (pool, component, level) in which clusters there were counted: in shadow
        every level, live only the levels under the threshold of the moment, and never a node that went
        past its threshold in the last ``quarantine_steps`` (an incident is not evidence of normal)."""
        self.nodes_at = np.zeros((0, len(DECIDING), len(LEVELS)))
        """Distinct nodes per (pool, component, level) that have had a counted cluster there (since
        this scorer started: after a restart a node may count once more)."""
        self.thresholds = np.ones((0, len(DECIDING)))
        """Each pool's threshold per component, in the model's units (1.0 until fitted)."""
        self.fits: dict[tuple[int, int], Fit] = {}
        self.shadow = np.zeros(0, dtype=np.int64)
        """Would-be node incidents per pool while in shadow."""
        self.opened = np.zeros(0, dtype=np.int64)
        """Node incidents per pool while live (with the thresholds of the moment)."""
        self.live_s = np.zeros(0)
        """Scored node-seconds per pool while live."""
        self.node_pool = np.zeros(0, dtype=np.intp)
        """Each node's pool (-1: not assigned yet)."""
        self._held = np.zeros((0, len(DECIDING), self.s.hold_steps))
        self._until = np.zeros((0, len(DECIDING), len(LEVELS)), dtype=np.int64)
        self._reached = np.zeros((0, len(DECIDING), len(LEVELS)), dtype=bool)
        self._open_until = np.zeros(0, dtype=np.int64)
        self._quarantine = np.zeros(0, dtype=np.int64)
        self.last_shadow: list[tuple[int, int, float, float]] = []
        """The last instant's would-be incidents in shadow: (node, component, held value, threshold)."""
        self.frozen = False
        """True: thresholds stay as they are, nothing is counted (a calibration taken on a healthy
        period and held, as the fault runs of ``benchmarks/anomaly_fleets.py`` may)."""
        self._step = 0
        self._fitted_at = -math.inf
        self.background = counters.Background()
        """Per pool, how large one window of a healthy counter burst gets (``counters.Background``)."""

    # ------------------------------------------------------------------ layout

    def pool(self, key: str) -> int:
        if key in self.pools:
            return self.pools.index(key)
        self.pools.append(key)
        self.counts = np.concatenate([self.counts, np.zeros((1, *self.counts.shape[1:]))])
        self.node_s = np.append(self.node_s, 0.0)
        self.watched_s = np.concatenate([self.watched_s, np.zeros((1, *self.watched_s.shape[1:]))])
        self.nodes_at = np.concatenate([self.nodes_at, np.zeros((1, *self.nodes_at.shape[1:]))])
        self.thresholds = np.concatenate([self.thresholds, np.ones((1, len(DECIDING)))])
        self.shadow = np.append(self.shadow, 0)
        self.opened = np.append(self.opened, 0)
        self.live_s = np.append(self.live_s, 0.0)
        return len(self.pools) - 1

    def ensure(self, n: int) -> None:
        extra = n - len(self.node_pool)
        if extra <= 0:
            return
        self.node_pool = np.concatenate([self.node_pool, np.full(extra, -1, dtype=np.intp)])
        self._held = np.concatenate([self._held, np.zeros((extra, *self._held.shape[1:]))])
        self._until = np.concatenate(
            [self._until, np.full((extra, *self._until.shape[1:]), -1, dtype=np.int64)]
        )
        self._reached = np.concatenate(
            [self._reached, np.zeros((extra, *self._reached.shape[1:]), dtype=bool)]
        )
        self._open_until = np.concatenate([self._open_until, np.full(extra, -1, dtype=np.int64)])
        self._quarantine = np.concatenate([self._quarantine, np.full(extra, -1, dtype=np.int64)])

    def assign(self, node: int, key: str) -> None:
        self.node_pool[node] = self.pool(key)

    def counting(self, n: int) -> npt.NDArray[np.bool_]:
        """Per node (the first ``n``): what it shows now counts as this fleet's normal (not frozen, not
        in the quarantine after it went past a live threshold)."""
        self.ensure(n)
        out: npt.NDArray[np.bool_] = (self._step >= self._quarantine[:n]) & (not self.frozen)
        return out

    def pool_of(self, n: int) -> list[str | None]:
        """The first ``n`` nodes' pool keys (None: not assigned yet)."""
        self.ensure(n)
        return [self.pools[p] if p >= 0 else None for p in self.node_pool[:n].tolist()]

    @property
    def live(self) -> npt.NDArray[np.bool_]:
        """Per pool: calibrated on enough node-days to open incidents."""
        out: npt.NDArray[np.bool_] = self.node_s / 86400.0 >= self.s.min_node_days
        return out

    # ------------------------------------------------------------------ scoring

    def decide(self, lifted: F64, scored: npt.NDArray[np.bool_], at: float, dt: float) -> tuple[F64, F64]:
        """One scoring instant. ``lifted`` (components, nodes, gpus): each deciding component's value
        after the forest's corroboration, in the model's units; ``scored``: (nodes,) nodes with data.
        Learns from it and returns (per GPU the calibrated ratio, 1.0 = the rule's level, per node the
        cap on its score: 1.0 live, ``SHADOW_CAP`` in shadow or unassigned)."""
        n = lifted.shape[1]
        self.ensure(n)
        pool = self.node_pool[:n]
        has = scored & (pool >= 0)
        # (nodes, comps); an unassigned node (-1) reads the appended row of the model's own edges
        thr = np.concatenate([self.thresholds, np.ones((1, len(DECIDING)))])[pool]
        ratio = np.max(lifted / thr.T[:, :, None], axis=0)
        node_v = lifted.max(axis=2).T  # (nodes, comps)
        self._step += 1
        held = self._held[:n]
        held[:] = np.roll(held, 1, axis=2)
        held[:, :, 0] = np.where(has[:, None], node_v, 0.0)
        low = held.min(axis=2)  # held over the rule's for
        # clusters: a node above a level starts one unless it was above it within gap_steps
        above = (low[:, :, None] >= LEVELS[None, None, :]) & has[:, None, None]
        until = self._until[:n]
        new = above & (self._step > until)
        until[above] = self._step + self.s.gap_steps
        live_pool = np.zeros(n, dtype=bool)
        live_pool[pool >= 0] = self.live[pool[pool >= 0]]
        # what counts as normal: every excursion up to the instant it opens an incident (a false one
        # is the evidence that lifts the threshold), nothing a node does in the quarantine after (a
        # fault's course is no evidence of this fleet's normal)
        quar = self._quarantine[:n]
        watched = np.broadcast_to((has & (self._step > quar) & (not self.frozen))[:, None, None], new.shape)
        quar[live_pool & (low >= thr).any(axis=1)] = self._step + self.s.quarantine_steps
        if dt > 0 and has.any():
            counted = new & watched & has[:, None, None]
            np.add.at(self.counts, pool[has], counted[has].astype(np.float64))
            first = counted & ~self._reached[:n]
            np.add.at(self.nodes_at, pool[has], first[has].astype(np.float64))
            self._reached[:n] |= counted
            np.add.at(self.watched_s, pool[has], dt * watched[has])
            if not self.frozen:
                np.add.at(self.node_s, pool[has], dt)
        # would-be node incidents with the thresholds of the moment: counted once per excursion
        hit = has & (np.max(low / thr, axis=1) >= 1.0)
        start = hit & (self._step > self._open_until[:n])
        self._open_until[:n][hit] = self._step + self.s.gap_steps
        self.last_shadow = []
        for i in np.flatnonzero(start & ~live_pool).tolist():
            k = int(np.argmax(low[i] / thr[i]))
            self.last_shadow.append((i, k, float(low[i, k]), float(thr[i, k])))
        if start.any():
            np.add.at(self.shadow, pool[start & ~live_pool], 1)
            np.add.at(self.opened, pool[start & live_pool], 1)
        if dt > 0 and (has & live_pool).any():
            np.add.at(self.live_s, pool[has & live_pool], dt)
        if at - self._fitted_at >= self.s.refit_s and not self.frozen:
            self.refit()
            self._fitted_at = at
        cap = np.where(live_pool, 1.0, SHADOW_CAP)
        return ratio, cap

    def refit(self) -> None:
        """Fit every pool's thresholds again from what it has counted."""
        share = self.s.budget_per_1000_node_days / 1000.0 / len(DECIDING)
        for p in range(len(self.pools)):
            for k in range(len(DECIDING)):
                days = self.watched_s[p, k] / 86400.0
                fit = threshold_for(LEVELS, self.counts[p, k], days, share, self.s, self.nodes_at[p, k])
                self.fits[(p, k)] = fit
                self.thresholds[p, k] = fit.threshold

    # ------------------------------------------------------------------ reporting, persistence

    def status(self) -> list[dict[str, Any]]:
        """Per pool: shadow or live, node-days, thresholds, the measured rates (per 1,000 node-days)."""
        out = []
        live = self.live
        for p, key in enumerate(self.pools):
            days = self.node_s[p] / 86400.0
            live_days = self.live_s[p] / 86400.0
            out.append(
                {
                    "pool": key,
                    "state": "live" if live[p] else "shadow",
                    "node_days": round(days, 3),
                    "calibration_node_days_needed": self.s.min_node_days,
                    "thresholds": {c: round(float(self.thresholds[p, k]), 3) for k, c in enumerate(DECIDING)},
                    "shadow_incidents": int(self.shadow[p]),
                    "live_incidents": int(self.opened[p]),
                    "live_node_days": round(live_days, 3),
                    "live_per_1000_node_days": round(1000 * self.opened[p] / live_days, 1)
                    if live_days
                    else None,
                    "budget_per_1000_node_days": self.s.budget_per_1000_node_days,
                }
            )
        return out

    def export(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "levels": len(LEVELS),
            "components": list(DECIDING),
            "pools": {
                key: {
                    "counts": [[float(v) for v in row] for row in self.counts[p]],
                    "node_s": float(self.node_s[p]),
                    "watched_s": [[float(v) for v in row] for row in self.watched_s[p]],
                    "nodes_at": [[float(v) for v in row] for row in self.nodes_at[p]],
                    "live_s": float(self.live_s[p]),
                    "shadow": int(self.shadow[p]),
                    "opened": int(self.opened[p]),
                }
                for p, key in enumerate(self.pools)
            },
            "counter_background": self.background.export(),
        }

    def import_(self, doc: dict[str, Any]) -> int:
        """Restore what ``export`` wrote (thresholds are fitted again at once); returns the pools. A
        document of another format, level grid or component list is ignored (calibration starts over)."""
        if (
            doc.get("format") != FORMAT
            or doc.get("levels") != len(LEVELS)
            or doc.get("components") != list(DECIDING)
        ):
            return 0
        for key, v in doc.get("pools", {}).items():
            p = self.pool(key)
            self.counts[p] = np.array(v["counts"], dtype=np.float64)
            self.node_s[p] = float(v["node_s"])
            self.watched_s[p] = np.array(v["watched_s"], dtype=np.float64)
            # written before nodes were told apart: every level with clusters counts as shared
            shared = np.minimum(self.counts[p], float(self.s.shape_nodes))
            self.nodes_at[p] = np.array(v.get("nodes_at", shared), dtype=np.float64)
            self.live_s[p] = float(v.get("live_s", 0.0))
            self.shadow[p] = int(v.get("shadow", 0))
            self.opened[p] = int(v.get("opened", 0))
        if isinstance(doc.get("counter_background"), dict):
            self.background.import_(doc["counter_background"])
        self.refit()
        return len(doc.get("pools", {}))
