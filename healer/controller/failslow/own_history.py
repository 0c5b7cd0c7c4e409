"""Each GPU's own past under load, the reference of the fail-slow scorer's own-history test (#28, #39).

Per GPU slot, the mean clock ratio and power ratio of its past windows that did not lag, in its current
job. The reference is their median over the latest ``span`` such windows: a phase of the job shorter than
half of that (an eval phase at full clock, a checkpoint-heavy stretch) fills fewer than half of them and
does not move it, so when the job is back in its usual phase its GPUs do not "lag their past" together
(#39: on a kept-apart fleet a 10-minute eval phase lifted an exponentially weighted mean enough that all
8 GPUs of a node lagged it by 9-11 % once back at the power cap). A fault's own windows lag and are not
learned, so they never lift or lower it. ``span`` 0 keeps the exponentially weighted mean of ``alpha``
(the reference before #39).

Memory: slots x 2 x ``span`` float32 (19 MB for 80,000 GPUs at 30 windows); one sort per window.
"""

from __future__ import annotations

import numpy as np


class OwnHistory:
    """Per slot: the windows learned (``count``) and the reference (``reference``) they give."""

    def __init__(self, span: int, alpha: float) -> None:
        if span < 0:
            raise ValueError("span must be 0 (exponentially weighted mean) or more windows")
        self.span = span
        self.alpha = alpha
        self.count = np.zeros(0, dtype=np.int64)
        """Per slot: windows learned since its history (re)started."""
        self._ring = np.full((2, 0, max(span, 1)), np.nan, dtype=np.float32 if span else np.float64)
        """(clock, power) x slot x window: the latest ``span`` learned windows (ring, NaN where none);
        with ``span`` 0, one column: the exponentially weighted means."""

    def grow(self, extra: int) -> None:
        self.count = np.pad(self.count, (0, extra))
        self._ring = np.pad(self._ring, ((0, 0), (0, extra), (0, 0)), constant_values=np.nan)

    def restart(self, slots: np.ndarray) -> None:
        """Forget the past of ``slots`` (indices): its job changed."""
        self.count[slots] = 0
        self._ring[:, slots] = np.nan

    def learn(self, learn: np.ndarray, clock: np.ndarray, power: np.ndarray) -> None:
        """Fold the windows of the slots in ``learn`` (a mask over the first ``learn.size`` slots)."""
        n = learn.size
        count = self.count[:n]
        values = np.stack([clock, power])
        if self.span:
            i = np.flatnonzero(learn)
            self._ring[:, i, count[i] % self.span] = values[:, i]
        else:
            first, rest = learn & (count == 0), learn & (count > 0)
            h, a = self._ring[:, :n, 0], self.alpha
            h[:, first] = values[:, first]
            h[:, rest] = (1 - a) * h[:, rest] + a * values[:, rest]
        count[learn] += 1

    def reference(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(clock, power) references of the first ``n`` slots: the median of the learned windows kept
        (NaN where none), or the exponentially weighted means with ``span`` 0."""
        if not self.span:
            return self._ring[0, :n, 0].copy(), self._ring[1, :n, 0].copy()
        kept = np.minimum(self.count[:n], self.span)
        ordered = np.sort(self._ring[:, :n], axis=2)  # NaN (no window) last
        lo, hi = np.maximum(kept - 1, 0) // 2, kept // 2
        hi = np.minimum(hi, self.span - 1)
        low = np.take_along_axis(ordered, lo[None, :, None], axis=2)[..., 0]
        high = np.take_along_axis(ordered, hi[None, :, None], axis=2)[..., 0]
        med = (low.astype(np.float64) + high) / 2
        med[:, kept == 0] = np.nan
        return med[0], med[1]
