"""Each node's inlet level, its trend and its per-load offsets (``thermal.Step.node_c``).

The node's inlet reference (the median of its steady GPUs' implied inlets) is compared with the node's
own level carried along its trend, at the learned offset of the node's current power band; a band not
learned yet borrows the nearest learned one's offset less ``band_slack_c`` per band of distance.
"""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from healer.anomaly.thermal_settings import BAND_CENTERS, F64, POWER_BANDS

if TYPE_CHECKING:
    from healer.anomaly.thermal import ThermalState, _Ref


def node_value(
    state: ThermalState,
    n: int,
    p: F64,
    rf: _Ref,
    now: float,
    cls: npt.NDArray[np.intp],
    r: F64,
) -> tuple[F64, npt.NDArray[np.intp], F64]:
    """Each node's reference (``rf``: ``thermal._Ref``) against its own inlet level, at the offset of
    its current power band (``nan`` where not scored); the node's power band; the node's slope (the
    median over the GPUs its reference was taken from of the slope each was extrapolated with, ``r``)."""
    s = state.s
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        node_p = np.nan_to_num(np.nanmedian(np.where(rf.pick, p, np.nan), axis=1))
        r_node = np.nanmedian(np.where(rf.pick, r, np.nan), axis=1)
    ncls = cls[:, 0] if cls.ndim == 2 else cls
    r_node = np.where(np.isnan(r_node), state.fleet_r[ncls], r_node)
    nband = np.searchsorted(np.array(POWER_BANDS), node_p)
    rows = np.arange(n)
    # at a load band not learned yet, the nearest learned band's offset stands in, less band_slack_c
    # per band of distance and what the node's straight line may miss between the two loads (its
    # class's ``curve_err`` times its slope times the change of load: an air node's fan makes
    # temperature concave in power), so a cooling loss that starts as the node changes load is still
    # seen where the line is known to hold
    learned = state.band_s[:, :n] >= s.init_s
    dist = np.where(learned, np.abs(np.arange(len(learned))[:, None] - nband[None]), 99)
    nearest = np.argmin(dist, axis=0)
    off = state.band_off[nearest, rows]
    moved = np.abs(node_p - np.array(BAND_CENTERS)[nearest]) * (dist[nearest, rows] > 0)
    slack = s.band_slack_c * dist[nearest, rows]
    curve = state.curve_err[ncls] * r_node * moved
    known = (state.level_s[:n] >= s.init_s) & learned.any(axis=0)
    known &= now - state.level_at[:n] <= s.stale_s  # a level not updated for long is re-learned first
    x = rf.ref - level_now(state, n, now) - off - slack
    # the line's possible miss shrinks the value towards 0 either way (a trend is learned from it)
    x = np.sign(x) * np.maximum(np.abs(x) - curve, 0.0)
    node: F64 = np.where(known & rf.trusted, x, np.nan)
    return node, nband, r_node


def learn_curve(
    state: ThermalState,
    n: int,
    nband: npt.NDArray[np.intp],
    before: F64,
    after: F64,
    ncls: npt.NDArray[np.intp],
    r_node: F64,
) -> None:
    """Where a node's band has just been learned (``before`` < ``init_s`` <= ``after``) next to one
    learned already, how far its straight line missed between the two (the offsets' difference over
    the slope times the change of load) moves its class's ``curve_err``: up fast, down slowly."""
    s = state.s
    rows = np.arange(n)
    done = (before < s.init_s) & (after >= s.init_s)
    if not done.any():
        return
    learned = state.band_s[:, :n] >= s.init_s
    learned[nband, rows] = False
    dist = np.where(learned, np.abs(np.arange(len(learned))[:, None] - nband[None]), 99)
    other = np.argmin(dist, axis=0)
    done &= dist[other, rows] < 99
    centers = np.array(BAND_CENTERS)
    for i in np.flatnonzero(done).tolist():
        span = abs(centers[nband[i]] - centers[other[i]]) * r_node[i]
        if not span > 0:
            continue
        miss = min(2.0, abs(state.band_off[nband[i], i] - state.band_off[other[i], i]) / span)
        e = state.curve_err[ncls[i]]
        gain = 0.3 if miss > e else 0.03
        state.curve_err[ncls[i]] = max(s.curve_err_min, e + gain * (miss - e))


def learn_node(
    state: ThermalState,
    n: int,
    ref: F64,
    nband: npt.NDArray[np.intp],
    node: F64,
    now: float,
    dt: float,
    slope: tuple[npt.NDArray[np.intp], F64] | None = None,
    held: npt.NDArray[np.bool_] | None = None,
) -> None:
    """Learn each node's level, trend and band offsets from its trusted reference ``ref``;
    ``slope``: each node's class and slope, for its class's ``curve_err`` (``learn_curve``); ``held``:
    nodes that stand out from their peers (``thermal_peers``), whose level is only carried along its
    trend: their inlet moved and their peers' did not, so it is no drift to follow."""
    s = state.s
    if dt <= 0:
        return
    rows = np.arange(n)
    ok = hold_level(state, n, ~np.isnan(ref), held, now)
    lvl = state.level[:n]
    first = ok & np.isnan(lvl)
    lvl[first] = ref[first]
    seen = state.level_s[:n]
    # a node steady at a load it has no offset for, with a level too stale to learn one against,
    # starts over at this load: the level is the reference here, the other loads are learned again
    lost = ok & (seen >= s.init_s) & (state.band_s[nband, rows] < s.init_s)
    lost &= now - state.level_at[:n] > s.stale_s
    if lost.any():
        idx = np.flatnonzero(lost)
        state.band_off[:, idx] = 0.0
        state.band_s[:, idx] = 0.0
        state.band_s[nband[idx], idx] = s.init_s
        lvl[idx] = ref[idx]
        state.level_at[idx] = now
        state.trend[idx] = 0.0
    band_s = state.band_s[nband, rows]
    off = state.band_off[nband, rows]
    # the level learns from bands whose offset is known (the first band seen defines it)
    from_band = ok & ~first & ((band_s >= s.init_s) | (seen < s.init_s))
    # time since the level last learned: a node unsteady for hours catches up on its inlet's drift
    gap = np.clip(now - state.level_at[:n], dt, None)
    # carried along its trend since it last learned, the level then closes part of what it still
    # misses (an average over node_tau_s); what it keeps missing feeds the trend (an integral over
    # node_trend_tau_s), so an inlet that rises steadily is followed without a lag
    ahead = level_now(state, n, now) - lvl
    miss = ref - off - lvl - ahead
    alpha = np.where(seen < s.init_s, dt / np.maximum(seen + dt, dt), 1.0 - np.exp(-gap / s.node_tau_s))
    move = ahead + alpha * miss
    # once ready, the level moves at most node_rate_c_per_h: a daily swing and drift (about
    # 1-2 °C/h) are followed, a cooling loss (6 °C in 20 min) is not
    limit = np.where(seen < s.init_s, np.inf, s.node_rate_c_per_h * gap / 3600.0)
    lvl[from_band] += np.clip(move, -limit, limit)[from_band]
    state.level_at[:n][from_band] = now
    # the trend learns only on a ready node within its edge, and is bounded by the rate. Not frozen
    # at half the edge as the offsets are: a healthy inlet that turns and rises 2 °C/h is 1.5-2 °C
    # ahead of the level before the trend has caught up (held-out seed 9201)
    with np.errstate(invalid="ignore"):
        calm = ok & (seen >= s.init_s) & ~(np.abs(node) > state.edges[2])
    rate = s.node_rate_c_per_h / 3600.0
    nudge = (1.0 - np.exp(-gap / s.node_trend_tau_s)) * miss / s.node_tau_s
    trend = state.trend[:n]
    trend[from_band & calm] = np.clip(trend + nudge, -rate, rate)[from_band & calm]
    seen[from_band] += dt
    # each band's offset: a plain mean while new, then very slow; not while the node looks faulty
    with np.errstate(invalid="ignore"):
        calm = ok & (seen >= s.init_s) & ~(node > s.freeze_at * state.edges[2])
    b_alpha = np.where(band_s < s.init_s, dt / (band_s + dt), 1.0 - math.exp(-dt / s.band_tau_s))
    # a band's offset is what the reference does at that load *at the same inlet*: it is learned
    # only while the level is fresh (learned within offset_fresh_s from a known band), never against
    # a level hours stale, which would soak the inlet's drift into the offset
    fresh = now - state.level_at[:n] <= s.offset_fresh_s
    learn_off = calm & fresh
    upd = np.where(learn_off, b_alpha * (ref - level_now(state, n, now) - off), 0.0)
    state.band_off[nband, rows] = off + upd
    after = band_s + np.where(learn_off | (ok & (seen < s.init_s)), dt, 0.0)
    state.band_s[nband, rows] = after
    if slope is not None:
        learn_curve(state, n, nband, band_s, after, slope[0], slope[1])


def hold_level(
    state: ThermalState, n: int, ok: npt.NDArray[np.bool_], held: npt.NDArray[np.bool_] | None, now: float
) -> npt.NDArray[np.bool_]:
    """Carry the ready nodes in ``held`` along their trend to ``now`` (their level learns nothing this
    window); returns ``ok`` without them."""
    if held is None or not held.any():
        return ok
    hold = ok & held & ~np.isnan(state.level[:n]) & (state.level_s[:n] >= state.s.init_s)
    state.level[:n][hold] = level_now(state, n, now)[hold]
    state.level_at[:n][hold] = now
    out: npt.NDArray[np.bool_] = ok & ~hold
    return out


def level_now(state: ThermalState, n: int, now: float) -> F64:
    """Each node's level carried along its trend since it last learned (for at most ``stale_s``)."""
    since = np.clip(now - state.level_at[:n], 0.0, state.s.stale_s)
    out: F64 = state.level[:n] + state.trend[:n] * since
    return out
