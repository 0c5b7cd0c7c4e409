"""What the fail-slow scorer is tuned by (``Settings``) and what it names (``Straggler``, with its
``evidence``); the tests themselves are stragglers.py's."""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Settings:
    window_s: float = 60.0
    persist: int = 3
    """Lagging windows in a row before a straggler is confirmed (3 x 60 s: found within 5 minutes)."""
    min_loaded: float = 0.5
    """Share of a window's samples that must be loaded for the window to give a verdict."""
    min_peers: int = 4
    min_nodes: int = 3
    min_deficit: float = 0.08
    """Clock ratio below the reference by this fraction (8 %) or more to lag."""
    z_min: float = 4.0
    mad_floor: float = 0.01
    power_margin: float = 0.02
    """The GPU's power ratio (power / limit) must be below its peers' (own history's) by this much: a
    healthy chip at its power cap clocks low at the same power as its peers, a faulty one at less."""
    sample_every_s: float = 5.0
    """A node's frames are folded at most this often (the window's statistics need no more; it keeps
    the per-frame cost of 10,000 nodes at 1 Hz under 5 % of a core)."""
    history_windows: int = 10
    history_span: int = 30
    """The own-history reference is the median of a GPU's latest this many windows that did not lag (in
    its job): a phase shorter than half of it (15 minutes) does not move it (#39). 0: an exponentially
    weighted mean of ``history_alpha`` instead (the reference before #39)."""
    history_alpha: float = 0.05
    cap_share: float = 0.5
    """A loaded clock below its own past is explained, not judged, when at least this share of the
    window's loaded samples were at the power cap (or held by a reason a healthy chip obeys) and no
    reason names the hardware (``clock_reasons.cap_explains``): a phase that moves the clock at the cap
    is no fault (#39)."""
    link_share: float = 0.8
    free_min: int = 2
    """Unconstrained (free, ``FREE_POWER``) loaded samples a GPU needs in a window for the free-clock
    tests: its clock where no power cap or temperature explains a low one, against its job's peers'
    and against its own past (kept across jobs: that clock is the chip's, not the job's)."""
    free_persist: int = 2
    """Windows in a row whose free clock lags before a straggler is confirmed; a window with fewer
    than ``free_min`` free samples neither counts nor resets."""
    free_history_windows: int = 5


@dataclasses.dataclass(frozen=True)
class Straggler:
    node: str
    gpu: int | None
    """None: the whole node lags its job's other nodes."""
    job: str | None
    test: str
    """``peers``, ``history``, ``link``, ``nodes`` or ``port`` (straggler_ports)."""
    evidence: dict[str, float | str]


def evidence(
    readings: tuple[float, float, float, float, float],
    windows: int,
    by_free: bool,
    peers: int,
    job: str | None,
    cause: str | None,
) -> dict[str, float | str]:
    """A straggler's evidence for its incident: ``readings`` are the clock ratio shown, the power ratio,
    the reference clock, the deficit and the z-score (NaN where not known)."""
    clock, power, ref_clock, deficit, z = readings
    ev: dict[str, float | str] = {
        "straggler.clock_ratio": round(clock, 4),
        "straggler.power_ratio": round(power, 4),
        "straggler.windows": windows,
        "straggler.basis": "unconstrained clock" if by_free else "loaded clock",
    }
    if np.isfinite(ref_clock):
        ev["straggler.reference_clock_ratio"] = round(ref_clock, 4)
        ev["straggler.clock_deficit_pct"] = round(100 * deficit, 1)
    if np.isfinite(z):
        ev["straggler.z"] = round(z, 2)
        ev["straggler.peers"] = peers
    if job is not None:
        ev["straggler.job"] = str(job)
    if cause:
        ev["straggler.cause"] = cause
    return ev
