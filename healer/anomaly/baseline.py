"""Per-GPU thermal baselines: each GPU compared with its own past as well as with the fleet.

GPUs are not born equal: thermal paste, cold-plate contact and airflow make some run several degrees
hotter than their peers at the same power for their whole life. Compared only with the fleet, such a GPU
looks like a cooling fault forever, and a fleet check wide enough to let it pass is slow to see a GPU
that is getting hotter. So the scorer also keeps, per GPU, what it has learned of that GPU's own thermal
excess, and the ``thermal_rise`` component scores how far the GPU is above it.

The excess is kept per unit of power (°C per fraction of the default power limit; a thermal resistance:
a GPU with poor cooling is as many degrees too hot per watt at any load), learned only while the GPU is
busy (at least ``BUSY_POWER_FRAC`` of its default limit, when the residual means something):

- for its first ``init_s`` busy seconds the estimate is the plain mean of what it has shown (the GPU is
  *not ready*: it has no baseline yet, only the fleet check scores it);
- after that, an exponential moving average with time constant ``tau_s`` (6 h by default), so a
  degradation over hours still stands out (a linear ramp keeps about 1 - t / (2 tau) of its size: 92 %
  after one hour) and a slow drift over days is followed.

The state lives in the scorer's memory: after a controller restart every GPU starts unready again, and
a GPU that was already degrading when the scorer started is compared with its degraded self (the fleet
check still sees it once it is hotter than any healthy GPU).
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]

BUSY_POWER_FRAC = 0.5
"""A GPU updates its baseline only in windows where it drew at least this share of its default limit."""


class GpuBaseline:
    """Per-GPU thermal excess (nodes, gpus) in °C per unit of power fraction, grown as nodes appear."""

    def __init__(self, gpus: int, tau_s: float, init_s: float = 900.0) -> None:
        self.tau_s = tau_s
        self.init_s = init_s
        self.rate: F64 = np.zeros((0, gpus))
        """Learned excess, °C per unit of ``power_frac`` (0 until the GPU has been busy)."""
        self.busy_s: F64 = np.zeros((0, gpus))
        """Busy seconds folded in so far: the baseline's confidence."""

    @property
    def ready(self) -> npt.NDArray[np.bool_]:
        """GPUs whose baseline has seen ``init_s`` busy seconds (never, when ``tau_s`` is 0: off)."""
        out: npt.NDArray[np.bool_] = (self.busy_s >= self.init_s) & (self.tau_s > 0)
        return out

    def ensure(self, nodes: int) -> None:
        if nodes > len(self.rate):
            extra = np.zeros((nodes - len(self.rate), self.rate.shape[1]))
            self.rate = np.concatenate([self.rate, extra])
            self.busy_s = np.concatenate([self.busy_s, extra.copy()])

    def offset(self, power_frac: F64) -> F64:
        """Expected own excess in °C (nodes, gpus) at ``power_frac``; ``nan`` where not ready."""
        n = len(power_frac)
        self.ensure(n)
        out: F64 = np.where(self.ready[:n], self.rate[:n] * power_frac, np.nan)
        return out

    def update(self, residual_c: F64, power_frac: F64, dt_s: float) -> None:
        """Fold one window's residuals (nodes, gpus; ``nan`` where not scored) in, ``dt_s`` after the last."""
        self.ensure(len(residual_c))
        if self.tau_s <= 0 or dt_s <= 0:
            return
        n = len(residual_c)
        with np.errstate(invalid="ignore"):
            ok = ~np.isnan(residual_c) & (power_frac >= BUSY_POWER_FRAC)
        if not ok.any():
            return
        rate, busy = self.rate[:n], self.busy_s[:n]
        x = residual_c[ok] / power_frac[ok]
        seen = busy[ok] + dt_s
        # a plain running mean while the GPU is new, then the slow exponential average
        weight = np.where(seen <= self.init_s, dt_s / seen, 1.0 - math.exp(-dt_s / self.tau_s))
        rate[ok] += weight * (x - rate[ok])
        busy[ok] = seen


def replay(residual_c: F64, power_frac: F64, step_s: float, tau_s: float, init_s: float) -> F64:
    """Own expected excess in °C before each window (windows, nodes, gpus; ``nan`` where the GPU was not
    ready) for a series of windows ``step_s`` apart, as a scorer called once per window would have had it."""
    b = GpuBaseline(residual_c.shape[2], tau_s, init_s)
    b.ensure(residual_c.shape[1])
    out = np.empty(residual_c.shape)
    for k in range(len(residual_c)):
        out[k] = b.offset(np.nan_to_num(power_frac[k]))
        b.update(residual_c[k], power_frac[k], step_s)
    return out
