"""Error counters against the fleet's own background: a burst is not an anomaly, a rate that holds is.

The ``counters`` component is each GPU's error-counter rates over the window (SBE, CRC flits, PCIe
replays ...) over the largest rates of the training fleet. A healthy fleet has its own background: an
SBE burst now and then (tens of errors in one second, then nothing for hours), a few GPUs with a low
steady CRC flit rate. Two things judge a GPU's counters against that background:

- **Persistence** (here): the value the component passes on is the smaller of its value now and its
  value one window earlier (``lookback`` scoring instants: two windows that do not overlap). A burst
  fills one window and is gone from the next, so it reads 0; a rate that is rising, or holds, reads in
  both (an NVLink whose CRC rate climbs over half an hour is seen one window later than its first
  errors).
- **The pool's own tail** (``cfar``): the persistent value's threshold per pool of alike nodes is where
  this fleet's own healthy distribution of it meets the false-alarm budget, so the steady low rates
  some healthy GPUs show set the pool's background, and a GPU must rise above it.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]


class Persistence:
    """Per GPU (rows in the scorer's node order): the component's last ``lookback + 1`` values."""

    def __init__(self, gpus: int, lookback: int = 10) -> None:
        self.gpus = gpus
        self.lookback = lookback
        self.ring = np.zeros((lookback + 1, 0, gpus))
        self.at = 0

    def step(self, value: F64) -> F64:
        """This instant's value (nodes, gpus) in, the smaller of it and the value ``lookback`` instants
        ago out (0 while there is no such value: a node that just appeared is not judged on one window)."""
        n = len(value)
        if self.ring.shape[1] < n:
            extra = n - self.ring.shape[1]
            self.ring = np.concatenate([self.ring, np.zeros((self.lookback + 1, extra, self.gpus))], axis=1)
        self.at = (self.at + 1) % (self.lookback + 1)
        self.ring[self.at, :n] = value
        before = self.ring[(self.at + 1) % (self.lookback + 1), :n]  # the oldest slot: lookback ago
        out: F64 = np.minimum(value, before)
        return out
