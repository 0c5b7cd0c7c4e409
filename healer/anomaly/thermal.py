"""What healthy looks like thermally, learned on the fleet being watched: per GPU, per node, per model.

Nothing here is an absolute level learned from a training fleet. Each GPU's temperature is explained as

    temp = inlet_ref(node) + a(gpu) + r(gpu) x power_frac

where ``a`` (°C: slot position, the rear row's pre-heated air) and ``r`` (°C per fraction of the
default power limit: the GPU's own thermal resistance, paste, cold plate, fan curve) are learned per
GPU on this fleet by an exponentially forgetting least-squares fit (time constant ``tau_s``) with a
weak prior pulling ``r`` towards the fleet's median for the GPU model (itself learned here; the
trained model only seeds it). ``inlet_ref`` is not measured: each window it is the median, over the
node's GPUs whose power was steady, of what each GPU's own model says its inlet was
(``temp - a - r x power_frac``). A GPU's residual is then its temperature against its own model at
the node's current inlet, so it holds when the inlet swings, when the other half of the node changes
load (that half's GPUs are either steady and agree on the inlet, or are left out of the median), and
whatever the job layout.

Three values come out per window (``Step``):

- ``rise_c``: the residual of GPUs whose own fit is ready (``init_s`` steady busy seconds), °C;
- ``gpu_rel``: for GPUs not ready yet, the residual as a share of the model's median resistance at the
  GPU's power (how much worse than a median GPU of its model it cools), a wide fleet check;
- ``node_c``: ``inlet_ref`` minus its own level (an average over ``node_tau_s``, 30 min, carried along
  a trend learned over ``node_trend_tau_s``, so an inlet that keeps rising is followed without a lag;
  never faster than ``node_rate_c_per_h``), once the node has been watched ``init_s``.

Windows around a load change are biased (temperature lags power by 30 s), so only GPUs whose window
mean power stayed within ``steady_frac`` over the last ``steady_windows`` windows are compared or
learned from; the others keep their last steady value for up to ``carry_s``. A GPU (or node) whose
residual is past half its edge stops learning, so a fault is not absorbed into its own baseline.

The whole state is plain arrays, exported as JSON-able dicts (``export`` / ``import_``) so a
controller can keep it across a restart.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from healer.anomaly import thermal_node, thermal_peers, thermal_store
from healer.anomaly.thermal_settings import (
    _STATS,
    BOOL,
    BUSY_POWER_FRAC,
    F64,
    POWER_BANDS,
    PRIOR_SPREAD,
    READY_POWER_FRAC,
    STATE_FORMAT,
    Step,
    ThermalSettings,
)

__all__ = [
    "BUSY_POWER_FRAC",
    "POWER_BANDS",
    "PRIOR_SPREAD",
    "READY_POWER_FRAC",
    "STATE_FORMAT",
    "Step",
    "ThermalSettings",
    "ThermalState",
]


class _Ref(NamedTuple):
    """A window's inlet references (``ThermalState._reference``), per node or (nodes, gpus)."""

    band: npt.NDArray[np.intp]
    inside: BOOL
    pick: BOOL
    trusted: BOOL
    ref: F64
    target: F64
    recent: BOOL


class ThermalState:
    """Per-GPU and per-node learned thermal baselines for a fleet (rows in the scorer's node order)."""

    def __init__(
        self,
        gpus: int,
        classes: Sequence[str],
        prior_r: Sequence[float],
        settings: ThermalSettings | None = None,
        edges: tuple[float, float, float] = (math.inf, math.inf, math.inf),
    ) -> None:
        self.gpus = gpus
        self.s = settings or ThermalSettings()
        self.classes = list(classes)
        self.prior_r = np.array([*prior_r, float(np.median(prior_r)) if len(prior_r) else 45.0])
        """Seed of each model class's median resistance (last entry: unknown class)."""
        self.fleet_r = self.prior_r.copy()
        """Each class's median resistance over this fleet's ready GPUs (updated every step)."""
        self.edges = edges
        """(rise °C, gpu_rel, node °C) at which learning freezes (x ``freeze_at``); set by the model."""
        self.stats = np.zeros((len(_STATS), 0, gpus))
        self.busy_s = np.zeros((0, gpus))
        self.hist = np.full((0, gpus, self.s.steady_windows), np.nan)
        self.last = np.zeros((3, 0, gpus))
        self.prev = np.zeros((3, 0, gpus))
        self.last_at = np.full((3, 0, gpus), -math.inf)
        self.seen = np.zeros((len(POWER_BANDS) + 1, 0, gpus))
        """Steady seconds (forgotten with ``tau_s``) each GPU has spent in each power band."""
        self.level = np.full(0, np.nan)
        """Each node's inlet level, °C (its inlet reference less the offset of the power band)."""
        self.level_s = np.zeros(0)
        self.level_at = np.full(0, -math.inf)
        """When each node's level last learned (unix seconds)."""
        self.trend = np.zeros(0)
        """Each node's inlet trend, °C per second: the level is carried along it between learning."""
        self.band_off = np.zeros((len(POWER_BANDS) + 1, 0))
        """Per power band and node, how far the inlet reference sits from the level at that load: what
        the GPUs' fits cannot tell apart from the inlet (a shared error in their slopes, the fans)."""
        self.band_s = np.zeros((len(POWER_BANDS) + 1, 0))
        self.ref_last = np.full(0, np.nan)
        """Each node's last trusted inlet reference, °C, and when it was taken (unix seconds)."""
        self.ref_at = np.full(0, -math.inf)
        self.peer_off = np.zeros(0)
        """Each node's own learned offset from its peers, °C (0 at a cold start)."""
        self.peer_c = np.full(0, np.nan)
        """Each node against its peers at the last step, °C (``thermal_peers.peer_z``; nan: none)."""
        self.domains: dict[str, str] = {}
        """Each node's cooling domain (rack, CDU, cooling loop: ``set_domains``); its peers share it."""
        self.curve_err = np.full(len(self.prior_r), self.s.curve_err0)
        """Per model class, how far a node's straight line between two of its loads has missed on this
        fleet (a share of the slope times the change of load; learned where a node's second load band
        is learned next to its first: an air node's fan makes temperature concave in power)."""
        self.gpu_r: F64 | None = None
        """Each GPU's resistance from its own load changes (``thermal_lag``; nan: not known), the prior
        of its fit in place of its class's median."""
        self.node_names: list[str] = []
        self._pending: dict[str, Any] = {}
        """Imported node states whose nodes have not reported yet (applied when they appear)."""

    # ----------------------------------------------------------------- layout

    def ensure(self, names: Sequence[str]) -> None:
        """Grow to the scorer's node list (nodes are only ever appended)."""
        extra = len(names) - len(self.node_names)
        if extra <= 0:
            return
        g = self.gpus
        self.stats = np.concatenate([self.stats, np.zeros((len(_STATS), extra, g))], axis=1)
        self.busy_s = np.concatenate([self.busy_s, np.zeros((extra, g))])
        self.hist = np.concatenate([self.hist, np.full((extra, g, self.s.steady_windows), np.nan)])
        self.last = np.concatenate([self.last, np.zeros((3, extra, g))], axis=1)
        self.prev = np.concatenate([self.prev, np.zeros((3, extra, g))], axis=1)
        self.last_at = np.concatenate([self.last_at, np.full((3, extra, g), -math.inf)], axis=1)
        nb = len(POWER_BANDS) + 1
        self.seen = np.concatenate([self.seen, np.zeros((nb, extra, g))], axis=1)
        self.level = np.concatenate([self.level, np.full(extra, np.nan)])
        self.level_s = np.concatenate([self.level_s, np.zeros(extra)])
        self.level_at = np.concatenate([self.level_at, np.full(extra, -math.inf)])
        self.trend = np.concatenate([self.trend, np.zeros(extra)])
        self.band_off = np.concatenate([self.band_off, np.zeros((nb, extra))], axis=1)
        self.band_s = np.concatenate([self.band_s, np.zeros((nb, extra))], axis=1)
        self.ref_last = np.concatenate([self.ref_last, np.full(extra, np.nan)])
        self.ref_at = np.concatenate([self.ref_at, np.full(extra, -math.inf)])
        self.peer_off = np.concatenate([self.peer_off, np.zeros(extra)])
        start = len(self.node_names)
        self.node_names = list(names)
        for i in range(start, len(names)):
            doc = self._pending.pop(names[i], None)
            if doc is not None:
                self._apply(i, doc)

    def set_domains(self, domains: dict[str, str]) -> None:
        """Which cooling domain (rack, CDU, cooling loop) each node sits in, by node name: a node is
        compared with the nodes of its GPU model in its domain (``thermal_peers``). Replaces the last."""
        self.domains = {str(k): str(v) for k, v in domains.items()}

    def domain_index(self, n: int) -> npt.NDArray[np.intp]:
        """Per node (scorer order), an index of its cooling domain; -1 where not known."""
        if not self.domains:
            return np.full(n, -1, dtype=np.intp)
        keys = sorted(set(self.domains.values()))
        pos = {k: i for i, k in enumerate(keys)}
        return np.array([pos.get(self.domains.get(m, ""), -1) for m in self.node_names[:n]], dtype=np.intp)

    # ----------------------------------------------------------------- the fit

    def fit(self, cls: npt.NDArray[np.intp], prior: F64 | None = None) -> tuple[F64, F64]:
        """Each GPU's (a, r): its own least-squares fit, pulled towards its class's fleet median r
        (or towards ``prior``, per class)."""
        w, sp, sy, spp, spy = self.stats
        r0 = (self.fleet_r if prior is None else prior)[cls]
        if self.gpu_r is not None and self.gpu_r.shape == r0.shape:  # its own step responses' slope
            r0 = np.where(np.isnan(self.gpu_r), r0, self.gpu_r)
        lam = self.s.prior_s * PRIOR_SPREAD**2
        eps = 1.0
        # minimise sum w (y - a - r p)^2 + lam (r - r0)^2 + eps a^2
        a11, a12, a22 = w + eps, sp, spp + lam
        b1, b2 = sy, spy + lam * r0
        det = a11 * a22 - a12 * a12
        a = (a22 * b1 - a12 * b2) / det
        r = (a11 * b2 - a12 * b1) / det
        return a, r

    @property
    def ready(self) -> BOOL:
        out: BOOL = self.busy_s >= self.s.init_s
        return out

    def step(
        self,
        temp: F64,
        power: F64,
        valid: BOOL,
        cls: npt.NDArray[np.intp],
        now: float,
        dt: float,
        throttled: BOOL | None = None,
        lagged: F64 | None = None,
    ) -> Step:
        """Score one window (arrays (nodes, gpus) in ``node_names`` order) and learn from it.
        ``throttled``: GPUs under thermal slowdown in the window; their power moves because they are
        too hot, so they are scored even when not steady (the lag then errs towards hot), never
        learned from. ``lagged``: the power temperature follows (``thermal_lag.LagFit``)."""
        n = len(temp)
        # an empty fleet's class index comes as (0,), not (0, gpus): never broadcast against that
        cls = np.asarray(cls, dtype=np.intp).reshape(n, self.gpus)
        p = np.where(valid, power, np.nan)
        steady = self._steady(n, p, valid)
        a, r = self.fit(cls)
        # temperature follows power with a lag: each GPU's own (``thermal_lag``), else lag_s's
        p_th = self._lagged(n, p, dt) if lagged is None else np.where(valid, lagged, np.nan)
        pt = np.nan_to_num(p_th)
        implied = np.where(valid, temp - a[:n] - r[:n] * pt, np.nan)
        ready = self.ready[:n]
        rf = self._reference(n, p, implied, steady, ready, now)
        resid = implied - rf.ref[:, None]
        busy = np.nan_to_num(p) >= BUSY_POWER_FRAC
        hot = np.zeros_like(valid) if throttled is None else throttled[:n] & valid
        scored = (steady | hot) & busy & ~np.isnan(resid)
        rise, rel = self._gpu_values(n, temp, p, pt, resid, rf, scored, ready, cls)
        node, nband, r_node = thermal_node.node_value(self, n, p, rf, now, cls[:n], r[:n])
        node_g = np.broadcast_to(node[:, None], temp.shape).copy()
        out = self._carry(n, [rise, rel, node_g], valid, now)
        # a node that stands out from its peers (past half the edge) holds its level: its inlet moved
        # and theirs did not, so what moved is no drift to follow (a coolant fault over an hour)
        peer = thermal_peers.peer_z(self, n, temp, pt, (steady | hot) & busy, cls, dt)
        with np.errstate(invalid="ignore"):
            held = peer > self.s.freeze_at
        learned = (nband, node, r_node, held)
        self._learn_window(n, p_th, implied, steady & ~hot, rf, rise, rel, cls, learned, now, dt)
        return Step(
            out[0],
            out[1],
            out[2],
            resid,
            np.broadcast_to(rf.ref[:, None], temp.shape).copy(),
            ready,
            np.broadcast_to(peer[:, None], temp.shape).copy(),
        )

    def _steady(self, n: int, p: F64, valid: BOOL) -> BOOL:
        """Push this window's power into each GPU's history: steady where it stayed within
        ``steady_frac`` over the history and moved at most ``step_frac`` between windows."""
        s = self.s
        self.hist[:n] = np.roll(self.hist[:n], 1, axis=2)
        self.hist[:n, :, 0] = p
        with np.errstate(invalid="ignore"):  # a nan anywhere in the history: not steady
            h = self.hist[:n]
            swing = h.max(axis=2) - h.min(axis=2)
            jump = np.abs(np.diff(h, axis=2)).max(axis=2)
            out: BOOL = valid & (swing <= s.steady_frac) & (jump <= s.step_frac)
        return out

    def _reference(self, n: int, p: F64, implied: F64, steady: BOOL, ready: BOOL, now: float) -> _Ref:
        """Each node's inlet reference this window and what its GPUs learn against."""
        s = self.s
        # a GPU in a power band its own fit has not seen only extrapolates its inlet
        band = np.searchsorted(np.array(POWER_BANDS), np.nan_to_num(p))
        inside = np.take_along_axis(self.seen[:, :n], band[None], axis=0)[0] >= s.seen_s
        # the node's inlet reference: the median of its steady GPUs' implied inlets, preferring ready
        # GPUs inside their range (3 or more), then any inside their range (2 or more), then any steady
        # GPU (then the node is not scored: its reference is an extrapolation)
        best = steady & ready & inside
        good = steady & inside
        pick = np.where(
            (best.sum(axis=1) >= 3)[:, None], best, np.where((good.sum(axis=1) >= 2)[:, None], good, steady)
        )
        trusted = (best.sum(axis=1) >= 3) | (good.sum(axis=1) >= 2)
        with np.errstate(invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            ref = np.nanmedian(np.where(pick, implied, np.nan), axis=1)
        ref[pick.sum(axis=1) < 2] = np.nan
        # what the GPUs learn against: a trusted reference, else the node's last trusted one while it is
        # recent (the inlet moves about a degree at most in stale_s). Only a node without a trusted
        # window for stale_s (its first minutes, or a load none of its GPUs has shown) learns against
        # its steady GPUs' own extrapolation: a GPU fitted against the extrapolation of GPUs that have
        # not learned (the other half of a split node, steady only while this half is not) inherits
        # their error, and once ready passes it on to the node's reference
        recent = now - self.ref_at[:n] <= s.stale_s
        target = np.where(trusted, ref, np.where(recent, self.ref_last[:n], ref))
        return _Ref(band, inside, pick, trusted, ref, target, recent)

    def _gpu_values(
        self,
        n: int,
        temp: F64,
        p: F64,
        pt: F64,
        resid: F64,
        rf: _Ref,
        scored: BOOL,
        ready: BOOL,
        cls: npt.NDArray[np.intp],
    ) -> tuple[F64, F64]:
        """``rise_c`` of the ready GPUs and ``gpu_rel`` of the others, this window."""
        pz = np.nan_to_num(p)
        # outside the bands it has shown a GPU's own slope is uncertain: allow a tenth of its model's,
        # or while its own slope is not known (``thermal_lag``) what its class's straight line has
        # missed between loads on this fleet (``curve_err``: half the slope until shown)
        w, sp = self.stats[0, :n], self.stats[1, :n]
        with np.errstate(invalid="ignore", divide="ignore"):
            pbar = np.where(w > 0, sp / w, pz)
        share = np.full(pz.shape, 0.1)
        if self.gpu_r is not None and self.gpu_r.shape == pz.shape:
            share = np.where(np.isnan(self.gpu_r), np.maximum(share, self.curve_err[cls[:n]]), share)
        slack = np.where(rf.inside, 0.0, share * self.fleet_r[cls[:n]] * np.abs(pz - pbar))
        rise: F64 = np.where(scored & ready, resid - slack, np.nan)
        # before its own fit is ready a GPU is compared with the median GPU of its model on this fleet:
        # its temperature less the model's slope times its power, against the node's median of the same
        # (not against the inlet reference, whose level carries the GPUs' own offsets: a slope the fits
        # have not learned yet moves the offsets by 15 °C, tuning seed 12 of the mixed fleet)
        r_model = self.fleet_r[cls[:n]]
        raw = temp - r_model * pt
        with np.errstate(invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            med = np.nanmedian(np.where(rf.pick, raw, np.nan), axis=1)
        med[np.isnan(rf.ref)] = np.nan
        rel_resid = raw - med[:, None]
        rel: F64 = np.where(scored & ~ready, rel_resid / (r_model * np.maximum(pz, 0.05)), np.nan)
        return rise, rel

    def _carry(self, n: int, values: list[F64], valid: BOOL, now: float) -> list[F64]:
        """Each value where fresh, else the lower of its last two fresh ones for up to ``carry_s``."""
        out = []
        for k, v in enumerate(values):
            fresh = ~np.isnan(v)
            self.prev[k, :n][fresh] = self.last[k, :n][fresh]
            self.last[k, :n][fresh] = v[fresh]
            self.last_at[k, :n][fresh] = now
            # carried: the lower of the last two steady values, so one odd window is not held for long
            kept = np.minimum(self.last[k, :n], self.prev[k, :n])
            carried = np.where(now - self.last_at[k, :n] <= self.s.carry_s, kept, np.nan)
            out.append(np.where(fresh, v, np.where(valid, carried, np.nan)))
        return out

    def _learn_window(
        self,
        n: int,
        p_th: F64,
        implied: F64,
        calm: BOOL,
        rf: _Ref,
        rise: F64,
        rel: F64,
        cls: npt.NDArray[np.intp],
        node_values: tuple[npt.NDArray[np.intp], F64, F64, BOOL],
        now: float,
        dt: float,
    ) -> None:
        """Learn from this window: the GPUs' fits, the bands they have shown, the node's level
        (``node_values``: the node's power band, its value and its slope, ``thermal_node.node_value``,
        and whether it stands out from its peers: then its level holds)."""
        # against a carried reference, a GPU whose implied inlet is more than half the node's edge
        # away does not learn: its node's inlet may be what moved (a cooling loss), or its own fit
        # is wrong at this load and is corrected in a trusted window instead
        target = rf.target
        with np.errstate(invalid="ignore"):
            carried = (~rf.trusted & rf.recent)[:, None]
            far = carried & (np.abs(implied - target[:, None]) > self.s.freeze_at * self.edges[2])
        calm = calm & ~far
        self._learn(n, p_th, implied - target[:, None], calm, target, rise, rel, cls, dt)
        self._learn_bands(n, rf.band, calm & ~np.isnan(target)[:, None], dt)
        fresh = rf.trusted & ~np.isnan(rf.ref)
        self.ref_last[:n][fresh] = rf.ref[fresh]
        self.ref_at[:n][fresh] = now
        nband, node, r_node, held = node_values
        trusted_ref = np.where(rf.trusted, rf.ref, np.nan)
        thermal_node.learn_node(self, n, trusted_ref, nband, node, now, dt, (cls[:n, 0], r_node), held)

    def _lagged(self, n: int, p: F64, dt: float) -> F64:
        """A window's mean temperature belongs to the mean power of a window ``lag_s`` earlier: this
        window's mean moved ``lag_s / dt`` of the way back towards the previous window's."""
        prev = self.hist[:n, :, 1] if self.hist.shape[2] > 1 else p
        back = min(1.0, self.s.lag_s / dt) if dt > 0 else 0.0
        out: F64 = np.where(np.isnan(prev), p, p + back * (prev - p))
        return out

    def restart_nodes(self, idx: npt.NDArray[np.intp]) -> None:
        """Nodes whose GPUs' fits, inlet level and load offsets start over: learned against slopes
        since replaced (``thermal_lag`` has measured their GPUs' own), their inlet and offsets trade
        the error off between them."""
        self.stats[:, idx], self.busy_s[idx], self.seen[:, idx], self.last_at[:, idx] = (
            0.0,
            0.0,
            0.0,
            -math.inf,
        )
        self.level[idx], self.level_s[idx], self.level_at[idx] = np.nan, 0.0, -math.inf
        self.trend[idx], self.band_off[:, idx], self.band_s[:, idx] = 0.0, 0.0, 0.0
        self.ref_last[idx], self.ref_at[idx] = np.nan, -math.inf

    def _learn(
        self,
        n: int,
        p: F64,
        resid: F64,
        steady: BOOL,
        ref: F64,
        rise: F64,
        rel: F64,
        cls: npt.NDArray[np.intp],
        dt: float,
    ) -> None:
        s = self.s
        if dt <= 0:
            return
        f = s.freeze_at
        with np.errstate(invalid="ignore"):
            odd = (rise > f * self.edges[0]) | (rel > f * self.edges[1])
        learn = steady & ~np.isnan(ref)[:, None]
        # past half its edge a GPU learns at a tenth of the pace: a fault is not absorbed, but a GPU
        # whose own model was wrong (a load it had not shown before) still converges
        tau = np.where(odd, s.tau_s * 10, s.tau_s)
        keep = np.where(learn, np.exp(-dt / tau), 1.0)
        st = self.stats[:, :n]
        y = np.nan_to_num(resid + self._fit_pred(n, p, cls))
        pp = np.nan_to_num(p)
        w = np.where(learn, np.where(odd, dt / 10, dt), 0.0)
        for k, v in enumerate((np.ones_like(pp), pp, y, pp * pp, pp * y)):
            st[k] = st[k] * keep + w * v
        self.busy_s[:n] += np.where(pp >= READY_POWER_FRAC, w, 0.0)
        # the fleet's own median resistance per class, from its ready GPUs' fits pulled towards the
        # trained seed, not towards this median itself: a GPU that has shown one load only has no
        # slope of its own, and a median of priors that are the median would drift with any few GPUs
        _, r = self.fit(cls, self.prior_r)
        ready = self.ready[:n]
        for c in range(len(self.fleet_r)):
            sel = ready & (cls[:n] == c)
            if sel.sum() >= 8:
                self.fleet_r[c] = float(np.median(r[:n][sel]))

    def _learn_bands(self, n: int, band: npt.NDArray[np.intp], learn: BOOL, dt: float) -> None:
        if dt <= 0:
            return
        seen = self.seen[:, :n]
        seen *= np.where(learn, math.exp(-dt / self.s.tau_s), 1.0)[None]
        hit = np.arange(len(seen))[:, None, None] == band[None]
        seen += np.where(hit & learn[None], dt, 0.0)

    def _level_now(self, n: int, now: float) -> F64:
        return thermal_node.level_now(self, n, now)

    def _fit_pred(self, n: int, p: F64, cls: npt.NDArray[np.intp]) -> F64:
        a, r = self.fit(cls)
        out: F64 = a[:n] + r[:n] * np.nan_to_num(p)
        return out

    # ----------------------------------------------------------------- persistence

    def export(self) -> dict[str, Any]:
        """The learned state as a JSON-able dict (``thermal_store.export``)."""
        return thermal_store.export(self)

    def import_(self, state: dict[str, Any]) -> int:
        """Load an exported state (``thermal_store.import_``); returns how many nodes it holds."""
        return thermal_store.import_(self, state)

    def _apply(self, i: int, doc: dict[str, Any]) -> None:
        thermal_store.apply(self, i, doc)
