"""The Injector: starts, ticks and stops faults on one fleet, and collects their truth records.

Scheduled faults start at their time; random ones are drawn at per-GPU-hour rates, one simulated hour
ahead at a time, from the injector's own seeded generator, so a run is the same for the same seed.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Mapping, Sequence
from typing import Any, Final

import numpy as np

from healer.sim import faults, physics


@dataclasses.dataclass(frozen=True, slots=True)
class RandomSpec:
    kind: str
    rate_per_gpu_hour: float
    params: Mapping[str, float]


class Injector:
    """Starts, ticks and stops faults on one fleet, and collects their truth records."""

    BLOCK_S: Final = 3600.0

    def __init__(
        self,
        fl: physics.Fleet,
        scheduled: Sequence[faults.Fault],
        random_specs: Sequence[RandomSpec] = (),
        *,
        multiplier: float = 1.0,
        rng: np.random.Generator,
    ) -> None:
        self.fleet = fl
        self.pending: list[tuple[float, int, faults.Fault]] = []
        self.active: list[faults.Fault] = []
        self.truth: list[dict[str, Any]] = []
        self._specs = list(random_specs)
        self._multiplier = multiplier
        self._rng = rng
        self._next_id = 0
        self._drawn_until = fl.t
        for f in scheduled:
            self.schedule(f)

    def schedule(self, f: faults.Fault) -> None:
        """Start ``f`` at its time (benches place faults on a fleet they have looked at)."""
        self._next_id += 1
        f.id = f"{self.fleet.run_id}-f{self._next_id}"
        heapq.heappush(self.pending, (f.start, self._next_id, f))

    def _draw(self, until: float) -> None:
        fl = self.fleet
        while self._drawn_until < until:
            lo, hi = self._drawn_until, self._drawn_until + self.BLOCK_S
            gpu_hours = fl.nodes * fl.gpus * self.BLOCK_S / 3600.0
            for spec in self._specs:
                count = int(self._rng.poisson(spec.rate_per_gpu_hour * self._multiplier * gpu_hours))
                for _ in range(count):
                    node = int(self._rng.integers(fl.nodes))
                    gpu = int(self._rng.integers(fl.gpus))
                    start = float(self._rng.uniform(lo, hi))
                    scoped = gpu if faults.KINDS[spec.kind].scope == "gpu" else None
                    self.schedule(faults.Fault(spec.kind, node, scoped, start, dict(spec.params)))
            self._drawn_until = hi

    def advance(self, t: float) -> None:
        """Start what is due by ``t``, tick what is active, stop what has ended."""
        if self._specs:
            self._draw(t + 1.0)
        fl = self.fleet
        while self.pending and self.pending[0][0] <= t:
            f = heapq.heappop(self.pending)[2]
            kind = faults.KINDS[f.kind]
            f.started = True
            kind.start(fl, f)
            fl.record_fault(f.node, f.gpu, f.start, f.kind)
            self.truth.append(f.truth(fl.node_names))
            self.active.append(f)
        still = []
        for f in self.active:
            kind = faults.KINDS[f.kind]
            end = f.end
            if end is not None and t >= end:
                kind.stop(fl, f)
                continue
            if end is None and kind.tick is faults.no_tick:
                continue  # a one-off: nothing more to do
            kind.tick(fl, f, t)
            still.append(f)
        self.active = still

    def take_truth(self) -> list[dict[str, Any]]:
        out, self.truth = self.truth, []
        return out
