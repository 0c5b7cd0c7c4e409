"""The power-budget targets (#30, item 5), measured in a closed loop on a small simulated domain.

A domain of ``nodes`` x 8 GPUs whose jobs ramp from idle to full over ``ramp_s`` and then hold, with a
budget below what they draw at full load. Each second the GPUs draw ``min(demand, limit)`` (healer's
simulator's power rule, healer.sim.physics) and ``power_budget.step`` decides; a GPU's throughput goes
with its SM clock, the cube root of the dynamic power it is allowed (the simulator's DVFS rule). The
report says:

- ``under_after_hold_s``: seconds from the end of the hold time to the domain's first reading under its
  budget (target: ≤ 10);
- ``over_2pct_beyond_hold_s``: the longest run of seconds more than 2 % over, less the hold time
  (target: 0);
- ``loss_ratio``: the throughput the jobs lost at steady load, over the least any division of the same
  power could lose (water-filling: every GPU at one level; target: ≤ 1.2);
- ``cycles_per_10min``: cap / restore cycles per 10 minutes of steady load (target: ≤ 1).

Figures are from this model of healer's simulator, not from real GPUs.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from healer import config
from healer.controller.power import power_budget


@dataclasses.dataclass(frozen=True, slots=True)
class Report:
    gpus: int
    budget_w: float
    peak_demand_w: float
    under_after_hold_s: float
    over_2pct_beyond_hold_s: float
    loss_ratio: float
    cycles_per_10min: float
    steady_s: float

    def ok(self) -> bool:
        return (
            self.under_after_hold_s <= 10
            and self.over_2pct_beyond_hold_s <= 0
            and self.loss_ratio <= 1.2
            and self.cycles_per_10min <= 1
        )


def _throughput(power_w: np.ndarray, idle_w: float, full_w: np.ndarray) -> float:
    dyn = np.clip((power_w - idle_w) / np.maximum(full_w - idle_w, 1e-6), 0.0, 1.0)
    return float(np.sum(np.cbrt(dyn)))


def _waterfill(demand_w: np.ndarray, total_w: float) -> np.ndarray:
    """Every GPU at one level ``L`` (or its demand if lower), summing to ``total_w``."""
    lo, hi = 0.0, float(demand_w.max())
    for _ in range(60):
        mid = (lo + hi) / 2
        if np.minimum(demand_w, mid).sum() > total_w:
            hi = mid
        else:
            lo = mid
    out: np.ndarray = np.minimum(demand_w, lo)
    return out


def run(
    *,
    nodes: int = 8,
    seconds: int = 1800,
    ramp_s: int = 120,
    budget_fraction: float = 0.8,
    policy: str = "proportional",
    seed: int = 1,
) -> Report:
    rng = np.random.default_rng(seed)
    n = nodes * 8
    idle_w, min_w, default_w = 70.0, 200.0, 700.0
    full_w = rng.uniform(450.0, 700.0, n)  # jobs differ in how hard they drive their GPUs
    peak = float(full_w.sum())
    budget = config.PowerBudget(
        key="rack", value="r1", contract_kw=peak * budget_fraction / 1000.0, policy=policy,
        hold_s=10.0, restore_after_s=120.0,
    )  # fmt: skip
    state = power_budget.DomainState()
    limit = np.full(n, default_w)
    first_over: float | None = None
    under_at: float | None = None
    over_run = longest_over = 0.0
    loss_ratios: list[float] = []
    cycles_steady: list[float] = []
    for t in range(seconds):
        ramp = min(1.0, t / ramp_s)
        demand = idle_w + (full_w - idle_w) * ramp + rng.normal(0.0, 4.0, n)
        power = np.minimum(demand, limit)
        total = float(power.sum())
        if total > budget.gpu_budget_w:
            first_over = t if first_over is None else first_over
            over_run = over_run + 1 if total > budget.gpu_budget_w * 1.02 else 0.0
            longest_over = max(longest_over, over_run)
        else:
            over_run = 0.0
            if first_over is not None and under_at is None:
                under_at = t
        if t > ramp_s * 2:  # steady load: the cost of the caps against water-filling the same power
            full_thr = _throughput(demand, idle_w, full_w)
            lost = full_thr - _throughput(power, idle_w, full_w)
            ideal = full_thr - _throughput(_waterfill(demand, total), idle_w, full_w)
            if ideal > 1e-3:
                loss_ratios.append(lost / ideal)
        readings = [
            power_budget.Reading("n", i, float(power[i]), float(limit[i]), min_w, default_w) for i in range(n)
        ]
        d = power_budget.step(readings, budget, state, float(t))
        state = d.state
        for c in d.changes:
            limit[c.gpu] = c.to_w
        cycles_steady = [c for c in state.cycles if c > ramp_s * 2]
    steady = max(1.0, seconds - ramp_s * 2)
    hold = budget.hold_s
    return Report(
        gpus=n,
        budget_w=budget.gpu_budget_w,
        peak_demand_w=peak,
        under_after_hold_s=max(
            0.0, (under_at if under_at is not None else seconds) - (first_over or 0) - hold
        ),
        over_2pct_beyond_hold_s=max(0.0, longest_over - hold),
        loss_ratio=float(np.mean(loss_ratios)) if loss_ratios else 1.0,
        cycles_per_10min=len(cycles_steady) / steady * 600.0,
        steady_s=steady,
    )
