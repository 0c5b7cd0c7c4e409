"""How temperature follows power, learned online per GPU from the fleet's own load changes.

A GPU's temperature follows its power through a first-order lag, ``T = inlet + a + r x P_lag`` with
``P_lag`` the power filtered with time constant ``tau`` (heat sink or cold plate: 10-20 s liquid,
30-120 s air). Between two scoring windows (``dt``, 30 s) the inlet moves a few tenths of a degree at
most, so the change of a window's mean temperature is, to that noise, ``r`` times the change of the
window's mean lagged power. Every load change the GPU goes through (a job starting or stopping, a
checkpoint dip, an eval phase, the power cap entered or left) is therefore a step response that shows
both ``r`` and ``tau``, whatever the inlet's level, and without the GPU ever having sat at two steady
loads.

``LagFit`` keeps, per GPU and per candidate time constant (``TAUS_S``), the window mean of the lagged
power (exact for a power that is constant within each window), and exponentially forgetting sums of
the changes ``(dP_lag, dT)``. Per GPU the candidate whose straight line through the origin leaves the
least residual variance is its time constant, and that line's slope its resistance ``r`` (°C per
fraction of the default power limit). Once a GPU has moved through enough load against its noise
(``max_rel_se``) its ``r`` is the prior of its own steady fit in ``thermal.ThermalState`` (a GPU seen
at one load only otherwise extrapolates another GPU model's slope: 17 °C off between the H200's full
load and idle; the node's inlet level and load offsets, learned against that slope, then start over),
and the median over a model class's GPUs replaces the trained seed for that class. The lagged power
at the GPU's own ``tau`` is what ``ThermalState.step`` compares temperature with, so a window after a
load change is explained by the lag, not flagged.

A GPU whose own residual is past half its edge does not learn (a fault is not absorbed).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Final

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]
BOOL = npt.NDArray[np.bool_]

TAUS_S: Final = (0.0, 10.0, 20.0, 40.0, 80.0, 160.0)
"""Candidate time constants, seconds (0: temperature follows within the window)."""
FORMAT: Final = "healer-anomaly-lag/1"


@dataclasses.dataclass(frozen=True)
class LagSettings:
    forget_s: float = 86_400.0
    """Forgetting time constant of the change sums (a day: a cold plate does not change faster)."""
    max_rel_se: float = 0.1
    """A GPU's own ``r`` is used once its standard error is under this share of it (the load it has
    moved through against the noise of its temperature's changes: whole degrees, the inlet's
    minutes-long swings)."""
    min_windows: float = 20.0
    """... and it has shown at least this many windows of changes."""
    min_class_gpus: int = 8
    """GPUs of a model class with their own ``r`` before the class's median replaces the seed."""
    max_step_s: float = 90.0
    """A gap between windows longer than this is not a change (the filters restart from the data)."""
    slope_range: float = 4.0
    """A GPU's own ``r`` is used only within this factor of its model's seed (the trained per-model
    slope): a cold plate or heat sink is not four times better or worse than its model's. Slopes far
    outside come from windows where something else moved the temperature with the power (an air node's
    fan chasing its hottest GPU in its first minutes: 600-2,500 °C per fraction on tuning seed 12 of
    the mixed fleet, whose A100s have 18-61)."""


class LagFit:
    """Per GPU (rows in the scorer's node order): lagged power per candidate ``tau``, change sums."""

    def __init__(self, gpus: int, settings: LagSettings | None = None) -> None:
        self.gpus = gpus
        self.s = settings or LagSettings()
        k = len(TAUS_S)
        self.state = np.full((k, 0, gpus), np.nan)
        """Each candidate filter's value at the end of the last window."""
        self.mean = np.full((k, 0, gpus), np.nan)
        """Each candidate's window mean of the lagged power, last window."""
        self.temp = np.full((0, gpus), np.nan)
        self.spp = np.zeros((k, 0, gpus))
        self.spy = np.zeros((k, 0, gpus))
        self.syy = np.zeros((0, gpus))
        self.count = np.zeros((0, gpus))
        """Windows of changes (forgotten as the sums are)."""
        self.node_names: list[str] = []
        self._pending: dict[str, Any] = {}
        """Imported nodes that have not reported yet (applied when they appear)."""

    def ensure(self, names: list[str]) -> None:
        extra = len(names) - len(self.node_names)
        if extra <= 0:
            return
        k, g = len(TAUS_S), self.gpus
        self.state = np.concatenate([self.state, np.full((k, extra, g), np.nan)], axis=1)
        self.mean = np.concatenate([self.mean, np.full((k, extra, g), np.nan)], axis=1)
        self.temp = np.concatenate([self.temp, np.full((extra, g), np.nan)])
        self.spp = np.concatenate([self.spp, np.zeros((k, extra, g))], axis=1)
        self.spy = np.concatenate([self.spy, np.zeros((k, extra, g))], axis=1)
        self.syy = np.concatenate([self.syy, np.zeros((extra, g))])
        self.count = np.concatenate([self.count, np.zeros((extra, g))])
        start = len(self.node_names)
        self.node_names = list(names)
        for i in range(start, len(names)):
            doc = self._pending.pop(names[i], None)
            if doc is not None:
                self._apply(i, doc)

    def step(self, temp: F64, power: F64, valid: BOOL, dt: float, learn: BOOL) -> F64:
        """One window's mean temperature and power (fraction of the limit), (nodes, gpus). Learns from
        the change since the last window where ``learn`` and returns the lagged power at each GPU's own
        time constant (the raw power where the GPU has no history)."""
        n = len(temp)
        s = self.s
        p = np.where(valid, power, np.nan)
        fresh = 0.0 < dt <= s.max_step_s
        state, mean = self.state[:, :n], self.mean[:, :n]
        new_mean = np.empty_like(mean)
        for k, tau in enumerate(TAUS_S):
            if tau <= 0 or not fresh:
                new_mean[k], new_state = p, p
            else:
                e = math.exp(-dt / tau)
                start = np.where(np.isnan(state[k]), p, state[k])
                # a first-order filter of a power constant within the window: its mean over the window
                # and its value at the window's end
                new_mean[k] = p + (start - p) * (tau / dt) * (1.0 - e)
                new_state = p + (start - p) * e
            state[k] = new_state
        if fresh:
            d_p = new_mean - mean
            d_t = temp - self.temp[:n]
            ok = valid & learn & ~np.isnan(d_t) & ~np.isnan(d_p).any(axis=0)
            keep = math.exp(-dt / s.forget_s)
            d_pz, d_tz = np.nan_to_num(d_p), np.nan_to_num(d_t)
            self.spp[:, :n] = self.spp[:, :n] * keep + np.where(ok, d_pz * d_pz, 0.0)
            self.spy[:, :n] = self.spy[:, :n] * keep + np.where(ok, d_pz * d_tz, 0.0)
            self.syy[:n] = self.syy[:n] * keep + np.where(ok, d_tz * d_tz, 0.0)
            self.count[:n] = self.count[:n] * keep + ok
        mean[:] = new_mean
        self.temp[:n] = np.where(valid, temp, np.nan)
        best = self.best(n)
        lagged = np.take_along_axis(new_mean, best[None], axis=0)[0]
        out: F64 = np.where(np.isnan(lagged), p, lagged)
        return out

    def best(self, n: int) -> npt.NDArray[np.intp]:
        """Each GPU's candidate with the least residual variance (the shortest while none has data)."""
        spp, spy = self.spp[:, :n], self.spy[:, :n]
        with np.errstate(divide="ignore", invalid="ignore"):
            sse = np.where(spp > 0, self.syy[:n][None] - spy * spy / spp, np.inf)
        out: npt.NDArray[np.intp] = np.argmin(sse, axis=0)
        return out

    def _known(self, n: int) -> tuple[F64, BOOL, npt.NDArray[np.intp]]:
        """Each GPU's slope at its own time constant, whether it is known (its standard error under
        ``max_rel_se`` of it, over ``min_windows``), and the candidate's index."""
        best = self.best(n)
        spp = np.take_along_axis(self.spp[:, :n], best[None], axis=0)[0]
        spy = np.take_along_axis(self.spy[:, :n], best[None], axis=0)[0]
        cnt = self.count[:n]
        with np.errstate(divide="ignore", invalid="ignore"):
            r = spy / spp
            var = (self.syy[:n] - spy * r) / np.maximum(cnt - 1.0, 1.0)
            se = np.sqrt(np.maximum(var, 0.0) / spp)
            known = (cnt >= self.s.min_windows) & (spp > 0) & (r > 0) & (se <= self.s.max_rel_se * r)
        return r, known, best

    def resistance(self, n: int, seed: F64 | None = None) -> F64:
        """Each GPU's ``r`` (°C per fraction of the limit) at its own time constant; nan until known,
        and (given ``seed``, each GPU's model's slope) while outside ``slope_range`` of it."""
        r, known, _ = self._known(n)
        if seed is not None:
            k = self.s.slope_range
            with np.errstate(invalid="ignore"):
                known = known & (r >= seed / k) & (r <= seed * k)
        out: F64 = np.where(known, r, np.nan)
        return out

    def tau_s(self, n: int) -> F64:
        """Each GPU's time constant, seconds (nan until its ``r`` is known)."""
        _, known, best = self._known(n)
        out: F64 = np.where(known, np.array(TAUS_S)[best], np.nan)
        return out

    def class_medians(
        self, cls: npt.NDArray[np.intp], classes: int, seed: F64 | None = None
    ) -> dict[int, float]:
        """Per model class with ``min_class_gpus`` GPUs of known ``r`` (``resistance``): their median."""
        n = len(cls)
        r = self.resistance(n, seed)
        out = {}
        for c in range(classes):
            sel = (cls == c) & ~np.isnan(r)
            if sel.sum() >= self.s.min_class_gpus:
                out[c] = float(np.median(r[sel]))
        return out

    # ----------------------------------------------------------------- persistence

    def export(self) -> dict[str, Any]:
        """The change sums per node (the filters restart from the data after a restart)."""
        nodes = {}
        for i, name in enumerate(self.node_names):
            nodes[name] = {
                "spp": [[float(x) for x in self.spp[k, i]] for k in range(len(TAUS_S))],
                "spy": [[float(x) for x in self.spy[k, i]] for k in range(len(TAUS_S))],
                "syy": [float(x) for x in self.syy[i]],
                "count": [float(x) for x in self.count[i]],
            }
        for name, doc in self._pending.items():
            nodes.setdefault(name, doc)
        return {"format": FORMAT, "taus_s": list(TAUS_S), "nodes": nodes}

    def import_(self, doc: dict[str, Any]) -> int:
        """Restore ``export``'s sums (nodes not seen yet when they first report; a document of another
        format or candidate list is ignored: the fit starts over). Returns the nodes it holds."""
        if doc.get("format") != FORMAT or doc.get("taus_s") != list(TAUS_S):
            return 0
        index = {name: i for i, name in enumerate(self.node_names)}
        nodes = doc.get("nodes", {})
        for name, v in nodes.items():
            if len(v["syy"]) != self.gpus:
                raise ValueError(f"thermal lag state for {name}: {len(v['syy'])} GPUs, expected {self.gpus}")
            if name in index:
                self._apply(index[name], v)
            else:
                self._pending[name] = v
        return len(nodes)

    def _apply(self, i: int, v: dict[str, Any]) -> None:
        self.spp[:, i] = np.array(v["spp"], dtype=np.float64)
        self.spy[:, i] = np.array(v["spy"], dtype=np.float64)
        self.syy[i] = np.array(v["syy"], dtype=np.float64)
        self.count[i] = np.array(v["count"], dtype=np.float64)
