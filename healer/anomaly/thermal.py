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

import dataclasses
import math
import warnings
from collections.abc import Sequence
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from healer.anomaly import thermal_peers

F64 = npt.NDArray[np.float64]
BOOL = npt.NDArray[np.bool_]

STATE_FORMAT: Final = "healer-anomaly-state/1"
BUSY_POWER_FRAC: Final = 0.4
"""Residuals are scored only where the GPU drew at least this share of its default limit."""
READY_POWER_FRAC: Final = 0.5
"""Only steady windows at this share of the default limit or more count towards a GPU being ready: a
GPU watched only while idle has not shown how hot it runs under load."""
PRIOR_SPREAD: Final = 0.2
"""The prior counts as ``prior_s`` seconds of data this far (in power fraction) from the GPU's mean:
as strong as a few minutes of a job's checkpoint dips, so a GPU that has shown two loads learns its own
slope within a quarter of an hour."""
POWER_BANDS: Final = (0.3, 0.5, 0.7, 0.85)
"""Edges of the power-fraction bands in which GPUs and nodes keep track of what they have shown."""
_STATS: Final = ("w", "sp", "sy", "spp", "spy")


@dataclasses.dataclass(frozen=True)
class ThermalSettings:
    tau_s: float = 21_600.0
    """Forgetting time constant of each GPU's own fit (6 h): slow drift is followed, hours-long
    degradation is not."""
    init_s: float = 900.0
    """Steady busy seconds a GPU (steady seconds a node) is watched before its own baseline is
    trusted."""
    node_tau_s: float = 1_800.0
    """Time constant of each node's inlet level (with its trend: ``node_trend_tau_s``)."""
    prior_s: float = 1_800.0
    """Weight of the prior on each GPU's resistance, in seconds of data (the fleet median's pull)."""
    steady_windows: int = 4
    """Windows (one per ``score`` call) over which a GPU's mean power must stay within ``steady_frac``."""
    steady_frac: float = 0.2
    step_frac: float = 0.04
    """... and change by at most this much from one window to the next (a 30 s bucket that differs by
    ten times this from the one it replaced: the start of a dip or a ramp)."""
    lag_s: float = 30.0
    """Time constant with which a GPU's temperature follows its power (heat sink and cold plate)."""
    carry_s: float = 600.0
    """A GPU or node that is not steady keeps its last value this long, then reads 0."""
    freeze_at: float = 0.5
    """Share of the edge past which a GPU learns ten times slower (a fault is not absorbed)."""
    seen_s: float = 300.0
    """Steady seconds a GPU (node) must have spent in a power band (``POWER_BANDS``) for its fit (its
    level) to be trusted there; elsewhere the GPU only extrapolates and is left out of the node's
    inlet reference."""
    node_rate_c_per_h: float = 2.5
    """Fastest a node's inlet level follows its reference, °C per hour (its trend included)."""
    node_trend_tau_s: float = 3_600.0
    """Integration time of each node's inlet trend (°C per hour, learned from what the level still
    misses): with it the level follows an inlet that keeps rising or falling (a daily swing plus a
    rack's drift, 1-2 °C/h for hours) without trailing it by ``node_tau_s`` x the rate. Never faster than
    ``node_rate_c_per_h``, so a cooling loss (6-10 °C in minutes) is not followed."""
    band_tau_s: float = 216_000.0
    """Once learned (its first ``init_s``), a power band's offset follows this slowly (60 h): the
    offsets tell loads apart, the level follows the inlet; an offset that followed faster would soak
    up the inlet's drift while the node stays at one load, and jump when the load changed."""
    band_slack_c: float = 1.5
    """At a power band without a learned offset, °C allowed per band between it and the nearest learned
    one."""
    offset_fresh_s: float = 900.0
    """A band's offset learns only while the level learned this recently (the inlet moves at most a
    few tenths of a degree in that time)."""
    stale_s: float = 1_800.0
    """A node whose level has not learned for this long (no steady window) is not scored until it has."""
    peer_floor_c: float = 6.0
    """Smallest edge of the node-vs-peers check (``peer_z``), °C."""
    peer_k: float = 6.0
    """... else this many robust standard deviations (1.4826 x MAD) of this fleet's nodes around it."""
    peer_tau_s: float = 10_800.0
    """Each node's own offset from its peers follows with this time constant (3 h), starting at 0."""
    peer_min_nodes: int = 8
    """Fewest nodes with a value before nodes are compared with their peers at all."""
    peer_min_gpus: int = 4
    """Fewest steady busy GPUs a node needs for its value."""


@dataclasses.dataclass
class Step:
    """One window's thermal values, (nodes, gpus) each; ``nan`` where not scored."""

    rise_c: F64
    gpu_rel: F64
    node_c: F64
    residual_c: F64
    """Temperature minus the GPU's own model at the node's inlet reference (any GPU, ready or not)."""
    inlet_ref_c: F64
    """The node's inlet reference (per GPU, the node's value), °C."""
    ready: BOOL
    peer_z: F64 | None = None
    """The node against its peers at the same moment (per GPU, the node's value), 1.0 = the edge."""


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
        s = self.s
        # an empty fleet's class index comes as (0,), not (0, gpus): never broadcast against that
        cls = np.asarray(cls, dtype=np.intp).reshape(n, self.gpus)
        p = np.where(valid, power, np.nan)
        self.hist[:n] = np.roll(self.hist[:n], 1, axis=2)
        self.hist[:n, :, 0] = p
        with np.errstate(invalid="ignore"):  # a nan anywhere in the history: not steady
            h = self.hist[:n]
            swing = h.max(axis=2) - h.min(axis=2)
            jump = np.abs(np.diff(h, axis=2)).max(axis=2)
            steady = valid & (swing <= s.steady_frac) & (jump <= s.step_frac)
        a, r = self.fit(cls)
        a, r = a[:n], r[:n]
        pz = np.nan_to_num(p)
        # temperature follows power with a lag: each GPU's own (``thermal_lag``), else lag_s's
        p_th = self._lagged(n, p, dt) if lagged is None else np.where(valid, lagged, np.nan)
        pt = np.nan_to_num(p_th)
        implied = np.where(valid, temp - a - r * pt, np.nan)
        ready = self.ready[:n]
        # a GPU in a power band its own fit has not seen only extrapolates its inlet
        band = np.searchsorted(np.array(POWER_BANDS), pz)
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
        resid = implied - ref[:, None]
        busy = pz >= BUSY_POWER_FRAC
        hot = np.zeros_like(valid) if throttled is None else throttled[:n] & valid
        scored = (steady | hot) & busy & ~np.isnan(resid)
        # outside the bands it has shown a GPU's own slope is uncertain: allow a tenth of its model's
        w, sp = self.stats[0, :n], self.stats[1, :n]
        with np.errstate(invalid="ignore", divide="ignore"):
            pbar = np.where(w > 0, sp / w, pz)
        slack = np.where(inside, 0.0, 0.1 * self.fleet_r[cls[:n]] * np.abs(pz - pbar))
        rise = np.where(scored & ready, resid - slack, np.nan)
        # before its own fit is ready a GPU is compared with the median GPU of its model on this fleet
        r_model = self.fleet_r[cls[:n]]
        rel_resid = temp - r_model * pt - ref[:, None]
        rel = np.where(scored & ~ready, rel_resid / (r_model * np.maximum(pz, 0.05)), np.nan)
        # the node against its own inlet level, at the offset of its current power band
        with np.errstate(invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            node_p = np.nan_to_num(np.nanmedian(np.where(pick, p, np.nan), axis=1))
        nband = np.searchsorted(np.array(POWER_BANDS), node_p)
        rows = np.arange(n)
        # at a load band not learned yet, the nearest learned band's offset stands in, less
        # band_slack_c per band of distance (far loads differ more), so a cooling loss that starts as
        # the node changes load is still seen
        learned = self.band_s[:, :n] >= s.init_s
        dist = np.where(learned, np.abs(np.arange(len(learned))[:, None] - nband[None]), 99)
        nearest = np.argmin(dist, axis=0)
        off = self.band_off[nearest, rows]
        slack = s.band_slack_c * dist[nearest, rows]
        known = (self.level_s[:n] >= s.init_s) & learned.any(axis=0)
        known &= now - self.level_at[:n] <= s.stale_s  # a level not updated for long is re-learned first
        node = np.where(known & trusted, ref - self._level_now(n, now) - off - slack, np.nan)
        node_g = np.broadcast_to(node[:, None], temp.shape).copy()
        values = [rise, rel, node_g]
        out = []
        for k, v in enumerate(values):
            fresh = ~np.isnan(v)
            self.prev[k, :n][fresh] = self.last[k, :n][fresh]
            self.last[k, :n][fresh] = v[fresh]
            self.last_at[k, :n][fresh] = now
            # carried: the lower of the last two steady values, so one odd window is not held for long
            kept = np.minimum(self.last[k, :n], self.prev[k, :n])
            carried = np.where(now - self.last_at[k, :n] <= s.carry_s, kept, np.nan)
            out.append(np.where(fresh, v, np.where(valid, carried, np.nan)))
        calm = steady & ~hot
        # against a carried reference, a GPU whose implied inlet is more than half the node's edge
        # away does not learn: its node's inlet may be what moved (a cooling loss), or its own fit
        # is wrong at this load and is corrected in a trusted window instead
        with np.errstate(invalid="ignore"):
            carried = (~trusted & recent)[:, None]
            far = carried & (np.abs(implied - target[:, None]) > s.freeze_at * self.edges[2])
        calm = calm & ~far
        self._learn(n, p_th, implied - target[:, None], calm, target, rise, rel, cls, dt)
        self._learn_bands(n, band, calm & ~np.isnan(target)[:, None], dt)
        fresh = trusted & ~np.isnan(ref)
        self.ref_last[:n][fresh] = ref[fresh]
        self.ref_at[:n][fresh] = now
        self._learn_node(n, np.where(trusted, ref, np.nan), nband, node, now, dt)
        peer = thermal_peers.peer_z(self, n, temp, pt, (steady | hot) & busy, cls, dt)
        return Step(
            out[0],
            out[1],
            out[2],
            resid,
            np.broadcast_to(ref[:, None], temp.shape).copy(),
            ready,
            np.broadcast_to(peer[:, None], temp.shape).copy(),
        )

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

    def _learn_node(
        self, n: int, ref: F64, nband: npt.NDArray[np.intp], node: F64, now: float, dt: float
    ) -> None:
        s = self.s
        if dt <= 0:
            return
        rows = np.arange(n)
        ok = ~np.isnan(ref)
        lvl = self.level[:n]
        first = ok & np.isnan(lvl)
        lvl[first] = ref[first]
        seen = self.level_s[:n]
        # a node steady at a load it has no offset for, with a level too stale to learn one against,
        # starts over at this load: the level is the reference here, the other loads are learned again
        lost = ok & (seen >= s.init_s) & (self.band_s[nband, rows] < s.init_s)
        lost &= now - self.level_at[:n] > s.stale_s
        if lost.any():
            idx = np.flatnonzero(lost)
            self.band_off[:, idx] = 0.0
            self.band_s[:, idx] = 0.0
            self.band_s[nband[idx], idx] = s.init_s
            lvl[idx] = ref[idx]
            self.level_at[idx] = now
            self.trend[idx] = 0.0
        band_s = self.band_s[nband, rows]
        off = self.band_off[nband, rows]
        # the level learns from bands whose offset is known (the first band seen defines it)
        from_band = ok & ~first & ((band_s >= s.init_s) | (seen < s.init_s))
        # time since the level last learned: a node unsteady for hours catches up on its inlet's drift
        gap = np.clip(now - self.level_at[:n], dt, None)
        # carried along its trend since it last learned, the level then closes part of what it still
        # misses (an average over node_tau_s); what it keeps missing feeds the trend (an integral over
        # node_trend_tau_s), so an inlet that rises steadily is followed without a lag
        ahead = self._level_now(n, now) - lvl
        miss = ref - off - lvl - ahead
        alpha = np.where(seen < s.init_s, dt / np.maximum(seen + dt, dt), 1.0 - np.exp(-gap / s.node_tau_s))
        move = ahead + alpha * miss
        # once ready, the level moves at most node_rate_c_per_h: a daily swing and drift (about
        # 1-2 °C/h) are followed, a cooling loss (6 °C in 20 min) is not
        limit = np.where(seen < s.init_s, np.inf, s.node_rate_c_per_h * gap / 3600.0)
        lvl[from_band] += np.clip(move, -limit, limit)[from_band]
        self.level_at[:n][from_band] = now
        # the trend learns only on a ready node within its edge, and is bounded by the rate. Not frozen
        # at half the edge as the offsets are: a healthy inlet that turns and rises 2 °C/h is 1.5-2 °C
        # ahead of the level before the trend has caught up (held-out seed 9201)
        with np.errstate(invalid="ignore"):
            calm = ok & (seen >= s.init_s) & ~(np.abs(node) > self.edges[2])
        rate = s.node_rate_c_per_h / 3600.0
        nudge = (1.0 - np.exp(-gap / s.node_trend_tau_s)) * miss / s.node_tau_s
        trend = self.trend[:n]
        trend[from_band & calm] = np.clip(trend + nudge, -rate, rate)[from_band & calm]
        seen[from_band] += dt
        # each band's offset: a plain mean while new, then very slow; not while the node looks faulty
        with np.errstate(invalid="ignore"):
            calm = ok & (seen >= s.init_s) & ~(node > s.freeze_at * self.edges[2])
        b_alpha = np.where(band_s < s.init_s, dt / (band_s + dt), 1.0 - math.exp(-dt / s.band_tau_s))
        # a band's offset is what the reference does at that load *at the same inlet*: it is learned
        # only while the level is fresh (learned within offset_fresh_s from a known band), never against
        # a level hours stale, which would soak the inlet's drift into the offset
        fresh = now - self.level_at[:n] <= s.offset_fresh_s
        learn_off = calm & fresh
        upd = np.where(learn_off, b_alpha * (ref - self._level_now(n, now) - off), 0.0)
        self.band_off[nband, rows] = off + upd
        self.band_s[nband, rows] = band_s + np.where(learn_off | (ok & (seen < s.init_s)), dt, 0.0)

    def _level_now(self, n: int, now: float) -> F64:
        """Each node's level carried along its trend since it last learned (for at most ``stale_s``)."""
        since = np.clip(now - self.level_at[:n], 0.0, self.s.stale_s)
        out: F64 = self.level[:n] + self.trend[:n] * since
        return out

    def _fit_pred(self, n: int, p: F64, cls: npt.NDArray[np.intp]) -> F64:
        a, r = self.fit(cls)
        out: F64 = a[:n] + r[:n] * np.nan_to_num(p)
        return out

    # ----------------------------------------------------------------- persistence

    def export(self) -> dict[str, Any]:
        """The learned state as a JSON-able dict: per node its GPUs' fit statistics and steady seconds,
        its inlet level; per class the fleet's median resistance."""

        def rnd(v: F64) -> list[float]:
            return [float(x) for x in v.tolist()]

        nodes: dict[str, Any] = {}
        for i, name in enumerate(self.node_names):
            nodes[name] = {
                "stats": [rnd(self.stats[k, i]) for k in range(len(_STATS))],
                "busy_s": rnd(self.busy_s[i]),
                "seen_s": [rnd(self.seen[k, i]) for k in range(len(self.seen))],
                "level_c": None if np.isnan(self.level[i]) else float(self.level[i]),
                "level_s": float(self.level_s[i]),
                "level_at": float(self.level_at[i]) if np.isfinite(self.level_at[i]) else None,
                "trend_c_per_h": float(self.trend[i] * 3600.0),
                "band_off_c": rnd(self.band_off[:, i]),
                "band_s": rnd(self.band_s[:, i]),
                "ref_c": None if np.isnan(self.ref_last[i]) else float(self.ref_last[i]),
                "ref_at": float(self.ref_at[i]) if np.isfinite(self.ref_at[i]) else None,
                "peer_off_c": float(self.peer_off[i]),
            }
        for name, doc in self._pending.items():
            nodes.setdefault(name, doc)
        return {
            "format": STATE_FORMAT,
            "gpus": self.gpus,
            "classes": self.classes,
            "fleet_r": [float(x) for x in self.fleet_r[: len(self.classes)]],
            "nodes": nodes,
        }

    def import_(self, state: dict[str, Any]) -> int:
        """Load an exported state: nodes already known are restored at once, the others when they first
        report. Returns how many nodes the state holds. A wrong format or GPU count raises ValueError."""
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"anomaly state format {state.get('format')!r}, expected {STATE_FORMAT!r}")
        if int(state.get("gpus", -1)) != self.gpus:
            raise ValueError(f"anomaly state has {state.get('gpus')} GPUs per node, scorer {self.gpus}")
        for c, r in zip(state.get("classes", []), state.get("fleet_r", []), strict=False):
            if c in self.classes:
                self.fleet_r[self.classes.index(c)] = float(r)
        index = {name: i for i, name in enumerate(self.node_names)}
        nodes = state.get("nodes", {})
        for name, doc in nodes.items():
            if len(doc["stats"]) != len(_STATS) or any(len(v) != self.gpus for v in doc["stats"]):
                raise ValueError(f"anomaly state for {name}: malformed statistics")
            i = index.get(name)
            if i is None:
                self._pending[name] = doc
            else:
                self._apply(i, doc)
        return len(nodes)

    def _apply(self, i: int, doc: dict[str, Any]) -> None:
        self.stats[:, i] = np.array(doc["stats"], dtype=np.float64)
        self.busy_s[i] = np.array(doc["busy_s"], dtype=np.float64)
        self.level[i] = np.nan if doc.get("level_c") is None else float(doc["level_c"])
        self.level_s[i] = float(doc.get("level_s", 0.0))
        self.level_at[i] = -math.inf if doc.get("level_at") is None else float(doc["level_at"])
        self.trend[i] = float(doc.get("trend_c_per_h", 0.0)) / 3600.0
        self.seen[:, i] = np.array(doc["seen_s"], dtype=np.float64)
        self.band_off[:, i] = np.array(doc["band_off_c"], dtype=np.float64)
        self.band_s[:, i] = np.array(doc["band_s"], dtype=np.float64)
        self.ref_last[i] = np.nan if doc.get("ref_c") is None else float(doc["ref_c"])
        self.ref_at[i] = -math.inf if doc.get("ref_at") is None else float(doc["ref_at"])
        self.peer_off[i] = float(doc.get("peer_off_c", 0.0))
