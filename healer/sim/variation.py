"""Fleet variation: what makes one healthy fleet unlike another, each effect switchable.

A real fleet is not the tidy one the simulator started with: GPUs differ in thermal resistance for
life, the rear row of a chassis breathes air the front row has already warmed, racks sit at different
inlet temperatures that swing through the day and drift, node fans speed up when the node runs hot,
nodes are split between independent jobs, training power oscillates at the iteration period, jobs
checkpoint, pause and restart, and node pools hold different GPU models. A scenario's ``variation``
block switches each of these on; every value is a number or a ``[min, max]`` range drawn once per run
from the run's seed (``draw``), so a scenario file describes a *family* of fleets. All defaults are
neutral: without a ``variation`` block the simulator behaves exactly as before.

Per-node and per-GPU values (each GPU's resistance, each node's preheat, rack phases ...) are drawn
inside the fleet from its own generator; this module only holds the settings.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pydantic

Range = float | tuple[float, float]


class Variation(pydantic.BaseModel):
    """The ``variation`` block of a scenario (docs/simulator.md, "Fleet variation")."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    resistance_sigma: Range = 0.0
    """Per-GPU thermal resistance, lognormal with this sigma around the profile's (0: the old cooling
    efficiency N(1, 0.04))."""
    rear_preheat_c: Range = 0.0
    """Rear-row GPUs (the upper half of the indices) breathe air the front row pre-heated: up to this
    many °C at full front-row power (each node draws its own value in [0.5, 1] x this)."""
    rack_nodes: int = pydantic.Field(default=0, ge=0)
    """Nodes per rack sharing one inlet (0: every node its own inlet, as before)."""
    rack_inlet_spread_c: Range = 0.0
    """Rack inlets uniform in inlet_c ± this (nodes add ± 0.5 °C of their own)."""
    daily_swing_c: Range = 0.0
    """Amplitude of each rack's daily inlet swing (a sine with a per-rack phase)."""
    drift_c: Range = 0.0
    """Standard deviation of each rack's slow inlet drift (a random walk pulled back with a 6 h
    time constant)."""
    fan_gain: Range = 0.0
    """Node fan control: thermal resistance falls by up to this share as the node's hottest GPU goes
    from 50 to 90 °C (fans follow with a 60 s time constant)."""
    split_share: Range = 0.0
    """Share of nodes whose two halves (GPUs 0-3 and 4-7) run independent jobs."""
    iteration_period_s: Range = 0.0
    """Training power oscillates at this period (drawn per job); 0: no oscillation."""
    iteration_low_frac: Range = 1.0
    """... between this share of the job's utilisation and all of it."""
    checkpoint_period_s: Range = 1800.0
    """Training checkpoint period (drawn per job in the range)."""
    checkpoint_s: Range = 40.0
    """Checkpoint dip length, seconds (drawn per job in the range)."""
    restarts_per_hour: Range = 0.0
    """Training jobs stop for 1-5 minutes (crash and restart, data stall) at this rate."""
    model_pools: int = pydantic.Field(default=0, ge=0)
    """Nodes come in this many contiguous pools, each of one GPU model from the mix (0: per node)."""
    pipeline_stages: Range = 1
    """A training job splits its ranks into this many consecutive pipeline stages (drawn per job, whole
    numbers; sim/ranks.py)."""
    stage_work_spread: Range = 0.0
    """Each pipeline stage's compute per step is within this share of the job's nominal (drawn per job
    and stage): stages with less work wait for the slowest at lower power, their clock unchanged."""
    rank0_extra: Range = 0.0
    """A training job's rank 0 computes this share more per step (logging, evaluation)."""


@dataclasses.dataclass(frozen=True)
class Drawn:
    """A Variation with every range drawn: the values one run uses (ranges kept for per-job draws)."""

    resistance_sigma: float = 0.0
    rear_preheat_c: float = 0.0
    rack_nodes: int = 0
    rack_inlet_spread_c: float = 0.0
    daily_swing_c: float = 0.0
    drift_c: float = 0.0
    fan_gain: float = 0.0
    split_share: float = 0.0
    iteration_period_s: tuple[float, float] = (0.0, 0.0)
    iteration_low_frac: tuple[float, float] = (1.0, 1.0)
    checkpoint_period_s: tuple[float, float] = (1800.0, 1800.0)
    checkpoint_s: tuple[float, float] = (40.0, 40.0)
    restarts_per_hour: float = 0.0
    model_pools: int = 0
    pipeline_stages: tuple[float, float] = (1.0, 1.0)
    stage_work_spread: float = 0.0
    rank0_extra: float = 0.0

    @property
    def uneven_ranks(self) -> bool:
        """Whether a training job's ranks do different work per step (pipeline stages, rank 0)."""
        return (self.pipeline_stages[1] > 1 and self.stage_work_spread > 0) or self.rank0_extra > 0

    @property
    def varied_jobs(self) -> bool:
        """Whether the jobs need the varied workload model (halves, oscillation, restarts ...)."""
        return (
            self.split_share > 0
            or self.iteration_period_s[1] > 0
            or self.restarts_per_hour > 0
            or self.checkpoint_period_s != (1800.0, 1800.0)
            or self.checkpoint_s != (40.0, 40.0)
        )


def _pair(v: Range) -> tuple[float, float]:
    return (float(v), float(v)) if isinstance(v, int | float) else (float(v[0]), float(v[1]))


def draw(v: Variation, rng: np.random.Generator) -> Drawn:
    """Draw the run-level values of ``v`` (per-job ranges stay ranges)."""

    def one(r: Range) -> float:
        lo, hi = _pair(r)
        return lo if lo == hi else float(rng.uniform(lo, hi))

    return Drawn(
        resistance_sigma=one(v.resistance_sigma),
        rear_preheat_c=one(v.rear_preheat_c),
        rack_nodes=v.rack_nodes,
        rack_inlet_spread_c=one(v.rack_inlet_spread_c),
        daily_swing_c=one(v.daily_swing_c),
        drift_c=one(v.drift_c),
        fan_gain=one(v.fan_gain),
        split_share=one(v.split_share),
        iteration_period_s=_pair(v.iteration_period_s),
        iteration_low_frac=_pair(v.iteration_low_frac),
        checkpoint_period_s=_pair(v.checkpoint_period_s),
        checkpoint_s=_pair(v.checkpoint_s),
        restarts_per_hour=one(v.restarts_per_hour),
        model_pools=v.model_pools,
        pipeline_stages=_pair(v.pipeline_stages),
        stage_work_spread=one(v.stage_work_spread),
        rank0_extra=one(v.rank0_extra),
    )
