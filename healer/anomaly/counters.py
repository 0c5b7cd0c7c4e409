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
- **The pool's burst envelope** (``Background``): two bursts in consecutive windows on one GPU (an SBE
  burst every few hours on a few GPUs makes that a few times a week on a 24-node fleet) would read
  the smaller burst's rate, once in weeks: too rare for the pool's tail to have seen before it fires,
  and one such reading (4.2 on a 24-hour run of the mixed fleet, tuning seed 101) was a false
  incident that then lifted the pool's threshold to the cap. Single bursts are frequent, so the pool
  learns how large one window of a burst gets: per pool, each GPU's largest *onset* value (its value
  in a window whose previous window was quiet), and the envelope is the ``k``-th largest of those
  over distinct GPUs (one GPU alone, a faulty one included, cannot set it). The persistent value is
  passed on over ``max(1, envelope)``: a rate no larger than one burst of this fleet reads under 1, a
  rate that rises past what a burst reaches reads above it. A rising fault contributes only its onset
  window, which is small next to what it becomes.
- **The pool's own tail** (``cfar``): the value's threshold per pool of alike nodes is where this
  fleet's own healthy distribution of it meets the false-alarm budget, so the steady low rates some
  healthy GPUs show set the pool's background, and a GPU must rise above it.
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]

FORMAT: Final = "healer-anomaly-counters/1"


class Persistence:
    """Per GPU (rows in the scorer's node order): the component's last ``lookback + 1`` values."""

    def __init__(self, gpus: int, lookback: int = 10) -> None:
        self.gpus = gpus
        self.lookback = lookback
        self.ring = np.zeros((lookback + 1, 0, gpus))
        self.at = 0
        self.onset = np.zeros((0, gpus), dtype=bool)
        """After ``step``: per GPU, its value a window ago was 0 (this window starts an event)."""

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
        self.onset = before == 0.0
        out: F64 = np.minimum(value, before)
        return out


class Background:
    """Per pool: how large one window of a healthy counter event (a burst) gets on this fleet.

    ``top[pool]`` keeps the ``kept`` largest per-GPU onset values (``"node/gpu"`` -> value); the
    envelope is the ``k``-th largest (0 while fewer than ``k`` GPUs have shown one)."""

    def __init__(self, k: int = 2, kept: int = 8) -> None:
        self.k = k
        self.kept = kept
        self.top: dict[str, dict[str, float]] = {}

    def envelope(self, pool: str) -> float:
        values = sorted(self.top.get(pool, {}).values(), reverse=True)
        return values[self.k - 1] if len(values) >= self.k else 0.0

    def learn(self, pool: str, gpu: str, value: float) -> None:
        """One GPU's onset value (a window whose previous window was quiet) in ``pool``."""
        top = self.top.setdefault(pool, {})
        if value <= top.get(gpu, 0.0):
            return
        if len(top) >= self.kept and gpu not in top:
            low = min(top, key=lambda g: top[g])
            if top[low] >= value:
                return
            del top[low]
        top[gpu] = value

    def judge(
        self,
        held: F64,
        raw: F64,
        onset: npt.NDArray[np.bool_],
        pools: list[str | None],
        names: list[str],
        learning: npt.NDArray[np.bool_],
    ) -> F64:
        """The persistent values ``held`` (nodes, gpus) over ``max(1, envelope)`` of each node's pool
        (``pools``, None: not assigned yet, judged at 1), then learning from this instant's ``raw``
        values where ``onset`` (per GPU) and ``learning`` (per node: counted as normal now)."""
        keys = sorted({p for p in pools if p is not None})
        env = {p: max(1.0, self.envelope(p)) for p in keys}
        # only a value past the smallest one a full list keeps can enter it (a fleet's many low
        # background rates are not looked at one by one)
        least = {p: min(self.top[p].values()) if len(self.top.get(p, {})) >= self.kept else 0.0 for p in keys}
        out: F64 = held / np.array([env[p] if p is not None else 1.0 for p in pools])[:, None]
        floor = np.array([least[p] if p is not None else np.inf for p in pools])
        for i, g in zip(*np.nonzero(onset & (raw > floor[:, None]) & learning[:, None]), strict=True):
            p = pools[i]
            if p is not None:
                self.learn(p, f"{names[i]}/{g}", float(raw[i, g]))
        return out

    def export(self) -> dict[str, Any]:
        return {"format": FORMAT, "k": self.k, "top": {p: dict(v) for p, v in self.top.items()}}

    def import_(self, doc: dict[str, Any]) -> None:
        """Restore what ``export`` wrote; a document of another format is ignored (learned again)."""
        if doc.get("format") != FORMAT:
            return
        self.top = {str(p): {str(g): float(x) for g, x in v.items()} for p, v in doc.get("top", {}).items()}
