"""The ranks of the simulated training jobs (#28): which GPU is which rank, how much a step asks of each,
and the step times the ranks report to ``healer.steps``.

A training job's ranks are its GPUs in (node, GPU) order, across the nodes of its gang. Ranks need not
do the same work: a job may split them into pipeline stages (consecutive ranks) that compute different
amounts per step, and its rank 0 may do extra work (logging, evaluation): each rank's ``work`` is its
compute per step against the job's nominal step (1), drawn per job from the scenario's ``variation``
(``pipeline_stages``, ``stage_work_spread``, ``rank0_extra``; all off by default). The fleet
(``physics.Fleet._fail_slow``) runs a synchronous job at its slowest rank's pace: a rank needs
``work / (clock cap x communication speed)`` per step, the job the longest of these (``job_time``), and
every other rank waits out the rest at lower power with its clock unchanged. So healthy asymmetry shows
as uneven power at an even clock, and a fault as a longer step.

``StepSource`` turns that into what each rank's ``healer.steps.StepReporter`` would publish (the
scenario's ``steps: true``): one report per rank and step of the simulation while the job computes,
``step_time_s`` the job's step and ``compute_s`` the rank's own share of it before it waits. It draws
its jitter from its own generator, so the fleet's telemetry is the same with or without it.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import numpy.typing as npt

from healer.sim import variation

if TYPE_CHECKING:
    from healer.sim import physics

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
BOOL = npt.NDArray[np.bool_]
SCHEMA: Final = "healer.steps.v1"
STEP_JITTER: Final = 0.01
"""A step's time varies by about this share from step to step (the job's), a rank's compute likewise."""


@dataclasses.dataclass(frozen=True)
class Layout:
    rank: I64
    """Each GPU's rank in its training job, (nodes, gpus); -1: no training job."""
    work: F64
    """Each GPU's compute per step against its job's nominal step (1: no asymmetry, or no job)."""


def layout(job: I64, training: BOOL, vary: variation.Drawn, seed: int) -> Layout:
    """Ranks and work of every training job on the fleet (``job``: each GPU's job number, -1 none)."""
    flat = np.where(training.ravel(), job.ravel(), -1)
    rank = np.full(flat.size, -1, dtype=np.int64)
    work = np.ones(flat.size)
    member = np.flatnonzero(flat >= 0)
    if member.size:
        order = member[np.argsort(flat[member], kind="stable")]  # by job, then (node, gpu)
        ids, start, size = np.unique(flat[order], return_index=True, return_counts=True)
        pos = np.arange(order.size) - np.repeat(start, size)
        rank[order] = pos
        if vary.uneven_ranks:
            for k, job_no in enumerate(ids.tolist()):
                members = order[start[k] : start[k] + size[k]]
                work[members] = _job_work(int(job_no), int(size[k]), vary, seed)
    shape = job.shape
    return Layout(rank.reshape(shape), work.reshape(shape))


def _job_work(job_no: int, ranks: int, vary: variation.Drawn, seed: int) -> F64:
    """One job's per-rank work: its stages' (drawn from the job's own generator) and rank 0's extra."""
    rng = np.random.default_rng([seed, 0x57A6, job_no])
    lo, hi = vary.pipeline_stages
    stages = max(1, min(ranks, int(rng.integers(int(lo), int(hi) + 1))))
    spread = vary.stage_work_spread
    per_stage = 1.0 + rng.uniform(-spread, spread, stages) if stages > 1 else np.ones(1)
    out: F64 = per_stage[np.arange(ranks) * stages // ranks]
    out[0] *= 1.0 + vary.rank0_extra
    return out


class StepSource:
    """The step reports of a fleet's training jobs, as their ranks would publish them."""

    def __init__(self, fl: physics.Fleet, job_prefix: str, seed: int) -> None:
        self.fleet = fl
        self.job_prefix = job_prefix
        self._rng = np.random.default_rng([seed, 0x57E9])
        self._step: dict[int, float] = {}
        """Each job's step count so far (fractional: a simulation step spans several training steps)."""

    def job_id(self, job_no: int) -> str:
        """The job as the frames name it (``frames.Encoder``: ``<run id>-j<number>``)."""
        return f"{self.job_prefix}-j{job_no}"

    def reports(self, dt: float) -> list[dict[str, Any]]:
        """One report (wire dict, schema ``healer.steps.v1``) per rank of every training job that computes
        now, for the step that just ended; ``dt``: simulated seconds since the last call."""
        fl = self.fleet
        computing = fl.work.computing(fl.t) & (fl.ranks.rank >= 0) & fl.present & ~fl.silent[:, None]
        nodes, gpus = np.nonzero(computing)
        if not nodes.size:
            return []
        period = fl.work.step_period()[nodes, gpus]
        job = fl.job[nodes, gpus]
        ids, first, inverse = np.unique(job, return_index=True, return_inverse=True)
        common = 1.0 + STEP_JITTER * self._rng.standard_normal(ids.size)  # one step, one time, every rank
        step_s = period * fl.job_time[nodes, gpus] * common[inverse]
        own = 1.0 + STEP_JITTER * self._rng.standard_normal(nodes.size)
        compute_s = np.minimum(period * fl.ranks.work[nodes, gpus] / fl.clock_cap[nodes, gpus] * own, step_s)
        steps = {
            job_no: self._step.get(job_no, 0.0) + dt / max(one, 1e-6)
            for job_no, one in zip(ids.tolist(), step_s[first].tolist(), strict=True)
        }
        self._step = steps  # jobs that stopped computing start again from 0 (a restart)
        ts = round(fl.t, 3)
        names = fl.node_names
        return [
            {
                "schema": SCHEMA,
                "job": self.job_id(j),
                "rank": r,
                "step": int(steps[j]),
                "step_time_s": round(s, 4),
                "compute_s": round(c, 4),
                "node": names[n],
                "gpu": g,
                "ts": ts,
            }
            for n, g, j, r, s, c in zip(
                nodes.tolist(),
                gpus.tolist(),
                job.tolist(),
                fl.ranks.rank[nodes, gpus].tolist(),
                step_s.tolist(),
                compute_s.tolist(),
                strict=True,
            )
        ]
