"""The ranks of the simulated training jobs (#28): which GPU is which rank, and how much a step asks of each.

A training job's ranks are its GPUs in (node, GPU) order, across the nodes of its gang. Ranks need not
do the same work: a job may split them into pipeline stages (consecutive ranks) that compute different
amounts per step, and its rank 0 may do extra work (logging, evaluation): each rank's ``work`` is its
compute per step against the job's nominal step (1), drawn per job from the scenario's ``variation``
(``pipeline_stages``, ``stage_work_spread``, ``rank0_extra``; all off by default). The fleet
(``physics.Fleet._fail_slow``) runs a synchronous job at its slowest rank's pace: a rank needs
``work / (clock cap x communication speed)`` per step, the job the longest of these (``job_time``), and
every other rank waits out the rest at lower power with its clock unchanged. So healthy asymmetry shows
as uneven power at an even clock, and a fault as a longer step.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import numpy.typing as npt

from healer.sim import variation

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
BOOL = npt.NDArray[np.bool_]


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
