"""Per-GPU thermal baselines: each GPU compared with its own past as well as with the fleet.

GPUs are not born equal: thermal paste, cold-plate contact and airflow make some run several degrees
hotter than their peers at the same power for their whole life. Compared only with the fleet, such a GPU
looks like a cooling fault forever. The scorer therefore keeps, per GPU, a slow exponential moving
average of its thermal residual (time constant ``tau_s``, 6 h by default, updated only while the GPU is
busy, when the residual means something) and the thermal component scores the residual minus that
baseline. A GPU whose cooling degrades over hours still stands out (a linear ramp keeps about
1 - t / (2 tau) of its size: 92 % after one hour); one that has always run hot stops alerting once its
baseline has caught up (a few busy hours after the scorer starts). The price: a fault that develops over
days is absorbed too, and the baseline starts from zero (the fleet) whenever the controller restarts.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]

BUSY_POWER_FRAC = 0.5
"""A GPU updates its baseline only in windows where it drew at least this share of its default limit."""


class GpuBaseline:
    """Baseline offsets (nodes, gpus) in °C, grown as nodes appear."""

    def __init__(self, gpus: int, tau_s: float) -> None:
        self.tau_s = tau_s
        self.offset: F64 = np.zeros((0, gpus))

    def ensure(self, nodes: int) -> None:
        if nodes > len(self.offset):
            extra = np.zeros((nodes - len(self.offset), self.offset.shape[1]))
            self.offset = np.concatenate([self.offset, extra])

    def update(self, residual_c: F64, power_frac: F64, dt_s: float) -> None:
        """Fold one window's residuals (nodes, gpus; ``nan`` where not scored) in, ``dt_s`` after the last."""
        self.ensure(len(residual_c))
        if self.tau_s <= 0 or dt_s <= 0:
            return
        n = len(residual_c)
        with np.errstate(invalid="ignore"):
            ok = ~np.isnan(residual_c) & (power_frac >= BUSY_POWER_FRAC)
        alpha = 1.0 - math.exp(-dt_s / self.tau_s)
        cur = self.offset[:n]
        cur[ok] += alpha * (residual_c[ok] - cur[ok])


def replay(residual_c: F64, power_frac: F64, step_s: float, tau_s: float) -> F64:
    """Offsets before each window (windows, nodes, gpus) for a series of windows ``step_s`` apart, as a
    scorer called once per window would have had them."""
    b = GpuBaseline(residual_c.shape[2], tau_s)
    b.ensure(residual_c.shape[1])
    out = np.zeros(residual_c.shape)
    for k in range(len(residual_c)):
        out[k] = b.offset
        b.update(residual_c[k], power_frac[k], step_s)
    return out
