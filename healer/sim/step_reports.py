"""The step times the simulated training jobs' ranks report to ``healer.steps`` (#28).

``StepSource`` turns the ranks' work per step (``ranks.layout``) and each job's pace (``physics.Fleet``)
into what each rank's ``healer.steps.StepReporter`` would publish (the scenario's ``steps: true``): one
report per rank and step of the simulation while the job computes, ``step_time_s`` the job's step and
``compute_s`` the rank's own share of it before it waits. It draws its jitter from its own generator, so
the fleet's telemetry is the same with or without it.
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np

from healer.schemas import stepreport
from healer.sim import physics

SCHEMA: Final = stepreport.SCHEMA
STEP_JITTER: Final = 0.01
"""A step's time varies by about this share from step to step (the job's), a rank's compute likewise."""


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
