"""The thermal baselines' settings, constants and per-window values (``thermal.ThermalState``)."""

from __future__ import annotations

import dataclasses
from typing import Final

import numpy as np
import numpy.typing as npt

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
BAND_CENTERS: Final = (0.15, 0.4, 0.6, 0.775, 0.925)
"""A typical power fraction inside each band (``POWER_BANDS``)."""


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
    one (plus ``curve_err`` of the node's line between the two loads)."""
    curve_err0: float = 0.5
    """How far (a share of the node's slope times the change of load) a node's straight line between two
    loads may miss, until this fleet has shown it per GPU model (``ThermalState.curve_err``): the trained
    slope can be off by half (the mixed fleet's liquid H200s: 20-26 °C per fraction against 42)."""
    curve_err_min: float = 0.1
    """Least of it, whatever the fleet has shown."""
    offset_fresh_s: float = 900.0
    """A band's offset learns only while the level learned this recently (the inlet moves at most a
    few tenths of a degree in that time)."""
    stale_s: float = 1_800.0
    """A node whose level has not learned for this long (no steady window) is not scored until it has."""
    peer_floor_c: float = 3.0
    """Smallest edge of the node-vs-peers check (``peer_z``), °C: as ``edge_node_c``'s floor (it was
    6 °C while the peers were the whole fleet, before its offset stopped learning from a fault)."""
    peer_k: float = 6.0
    """... else this many robust standard deviations (1.4826 x MAD) of this fleet's nodes around it."""
    peer_tau_s: float = 10_800.0
    """Each node's own offset from its peers follows with this time constant (3 h), starting at 0."""
    peer_min_nodes: int = 4
    """Fewest nodes with a value before nodes are compared with their peers at all (a CDU of 4-6 liquid
    nodes is a peer group; it was 8, so a 6-node pool was never compared)."""
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
