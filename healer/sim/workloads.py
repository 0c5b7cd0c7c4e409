"""Jobs that drive utilisation, so healthy telemetry is not flat.

Each node runs one job at a time (a node is the scheduling unit on HGX machines): ``training`` (steady
~95 % on every GPU with a short dip at each checkpoint), ``inference`` (bursty: every GPU flips between
busy and quiet on its own) or ``idle``. Jobs end after an exponentially distributed time and the next
kind is drawn from the scenario's mix. A fault that kills the job (an XID 79 or 95) makes the node idle
until the scheduler gives it new work. Everything is vectorised over the whole fleet.

Every job has a number (``job_no``, -1: idle), which the frames carry as the GPU's ``jobs``. With
gangs (the scenario's ``job_nodes``), consecutive nodes run one job together: the gang's first node
draws the job and its others copy it (the same kind, end, checkpoint and iteration phase: a synchronous
multi-node job), and a fault that kills the job on one node ends it on every node of the gang.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from healer.sim import variation

IDLE: Final = 0
TRAINING: Final = 1
INFERENCE: Final = 2
KINDS: Final = {"idle": IDLE, "training": TRAINING, "inference": INFERENCE}

MEAN_DURATION_S: Final = {IDLE: 1200.0, TRAINING: 6 * 3600.0, INFERENCE: 2 * 3600.0}
MIN_DURATION_S: Final = 300.0
CHECKPOINT_PERIOD_S: Final = 1800.0
CHECKPOINT_LENGTH_S: Final = 40.0
UTIL_TAU_S: Final = 3.0
BURST_SWITCH_PER_S: Final = 1.0 / 20.0
DEFAULT_STEP_S: Final = 1.0
"""A training job's step (iteration) time where the scenario draws no iteration period."""

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


def gangs(sizes: list[int], nodes: int) -> npt.NDArray[np.intp]:
    """Each node's gang leader (the gang's first node) for consecutive gangs of ``sizes`` (cycled)."""
    leader = np.arange(nodes, dtype=np.intp)
    i, k = 0, 0
    while i < nodes:
        size = max(1, sizes[k % len(sizes)]) if sizes else 1
        leader[i : i + size] = i
        i, k = i + size, k + 1
    return leader


class Workloads:
    """Per-node job state and the utilisation it asks of every GPU."""

    def __init__(
        self,
        nodes: int,
        gpus: int,
        mix: Mapping[str, float],
        rng: np.random.Generator,
        now: float,
        gang: npt.NDArray[np.intp] | None = None,
    ) -> None:
        self.nodes = nodes
        self.gang = gang if gang is not None and (gang != np.arange(nodes)).any() else None
        """Each node's gang leader; None: every node runs its own jobs."""
        self.gpus = gpus
        self._rng = rng
        self._t0 = now
        kinds = [KINDS[k] for k in mix]
        weights = np.array([mix[k] for k in mix], dtype=np.float64)
        if weights.sum() <= 0:
            kinds, weights = [IDLE], np.ones(1)
        self._kinds = np.array(kinds, dtype=np.int8)
        self._weights = weights / weights.sum()
        self.kind = self._draw_kinds(nodes)
        self.end_t = now + self._draw_durations(self.kind) * rng.random(nodes)
        self.ckpt_phase = rng.random(nodes) * CHECKPOINT_PERIOD_S
        self.busy = rng.random((nodes, gpus)) < 0.5
        self.gpu_offset = rng.normal(0.0, 1.5, (nodes, gpus))
        self.job_no: I64 = np.arange(nodes, dtype=np.int64)
        self._next_job = nodes
        self._gang_mirror()
        self.util = self.target(now)

    def _gang_mirror(self) -> None:
        """A gang's members run their leader's job."""
        if self.gang is not None:
            for arr in (self.kind, self.end_t, self.ckpt_phase, self.job_no):
                arr[:] = arr[self.gang]

    def jobs(self) -> I64:
        """Each GPU's job number (-1: idle)."""
        out: I64 = np.where(self.kind == IDLE, -1, self.job_no)[:, None].repeat(self.gpus, axis=1)
        return out

    def _draw_kinds(self, n: int) -> npt.NDArray[np.int8]:
        return self._kinds[self._rng.choice(len(self._kinds), size=n, p=self._weights)]

    def _draw_durations(self, kind: npt.NDArray[np.int8]) -> F64:
        means = np.array([MEAN_DURATION_S[IDLE], MEAN_DURATION_S[TRAINING], MEAN_DURATION_S[INFERENCE]])
        out: F64 = np.maximum(MIN_DURATION_S, self._rng.exponential(1.0, kind.shape) * means[kind])
        return out

    def crash(self, node: int, now: float) -> None:
        """The node's job died (on every node of its gang); they sit idle until the scheduler hands
        out new work."""
        where: Any = node if self.gang is None else self.gang == self.gang[node]
        self.kind[where] = IDLE
        self.end_t[where] = now + MIN_DURATION_S

    def target(self, now: float) -> F64:
        """Utilisation (percent) each GPU is asked for at ``now``."""
        kind = self.kind[:, None]
        in_ckpt = ((now - self._t0 + self.ckpt_phase) % CHECKPOINT_PERIOD_S) < CHECKPOINT_LENGTH_S
        training = np.where(in_ckpt[:, None], 15.0, 95.0 + self.gpu_offset)
        inference = np.where(self.busy, 85.0, 20.0) + 2 * self.gpu_offset
        out: F64 = np.where(kind == TRAINING, training, np.where(kind == INFERENCE, inference, 0.0))
        return out

    def step(self, now: float, dt: float) -> F64:
        """Advance jobs to ``now`` and return each GPU's utilisation (percent, 0..100)."""
        ended = self.end_t <= now
        if self.gang is not None:
            ended &= self.gang == np.arange(self.nodes)
        done = np.flatnonzero(ended)
        if done.size:
            new = self._draw_kinds(done.size)
            self.kind[done] = new
            self.end_t[done] = now + self._draw_durations(new)
            self.job_no[done] = self._next_job + np.arange(done.size)
            self._next_job += done.size
            self._gang_mirror()
        flip = self._rng.random(self.busy.shape) < min(1.0, BURST_SWITCH_PER_S * dt)
        self.busy ^= flip
        target = self.target(now)
        alpha = 1.0 - np.exp(-dt / UTIL_TAU_S)
        sigma = np.array([0.0, 1.2, 6.0])[self.kind][:, None]
        self.util += (target - self.util) * alpha
        noisy: F64 = np.clip(self.util + self._rng.normal(0.0, 1.0, self.util.shape) * sigma, 0.0, 100.0)
        return noisy

    def training(self) -> npt.NDArray[np.bool_]:
        """Each GPU: it runs a training job (ranks that step together; sim/ranks.py)."""
        out: npt.NDArray[np.bool_] = (self.kind == TRAINING)[:, None].repeat(self.gpus, axis=1)
        return out

    def step_period(self) -> F64:
        """Each GPU's job's nominal step (iteration) time: ``DEFAULT_STEP_S`` (no oscillation here)."""
        out: F64 = np.full((self.nodes, self.gpus), DEFAULT_STEP_S)
        return out

    def computing(self, now: float) -> npt.NDArray[np.bool_]:
        """Each GPU: its job computes at ``now`` (a job runs, outside a training checkpoint): the job state
        a fail-slow fault slows, whatever the telemetry shows."""
        in_ckpt = ((now - self._t0 + self.ckpt_phase) % CHECKPOINT_PERIOD_S) < CHECKPOINT_LENGTH_S
        busy = (self.kind == INFERENCE) | ((self.kind == TRAINING) & ~in_ckpt)
        out: npt.NDArray[np.bool_] = busy[:, None].repeat(self.gpus, axis=1)
        return out

    def mem_fraction(self) -> F64:
        """Fraction of HBM each node's job keeps allocated."""
        out: F64 = np.array([0.006, 0.92, 0.62])[self.kind]
        return out

    def mem_util_factor(self) -> F64:
        """Memory-bandwidth utilisation relative to SM utilisation, per node."""
        out: F64 = np.array([0.0, 0.45, 0.7])[self.kind]
        return out


class VariedWorkloads:
    """Workloads with a fleet's variety (``variation.Drawn``): nodes split between two independent jobs
    (GPUs 0..G/2-1 and G/2..G-1), training power oscillating at the iteration period, checkpoint
    period and length drawn per job, and short stops (restarts, data stalls). A job runs on a *half*;
    an unsplit node's second half mirrors its first."""

    def __init__(
        self,
        nodes: int,
        gpus: int,
        mix: Mapping[str, float],
        rng: np.random.Generator,
        now: float,
        v: variation.Drawn,
        gang: npt.NDArray[np.intp] | None = None,
    ) -> None:
        self.nodes, self.gpus = nodes, gpus
        self.gang = gang if gang is not None and (gang != np.arange(nodes)).any() else None
        """Each node's gang leader (a gang's nodes are not split); None: every node its own jobs."""
        self._rng = rng
        self._v = v
        kinds = [KINDS[k] for k in mix]
        weights = np.array([mix[k] for k in mix], dtype=np.float64)
        if weights.sum() <= 0:
            kinds, weights = [IDLE], np.ones(1)
        self._kinds = np.array(kinds, dtype=np.int8)
        self._weights = weights / weights.sum()
        self.split = rng.random(nodes) < v.split_share
        if self.gang is not None:
            counts = np.bincount(self.gang, minlength=nodes)
            self.split &= counts[self.gang] == 1
        half = (np.arange(gpus)[None, :] >= gpus // 2) & self.split[:, None]
        self.half = half.astype(np.intp)
        shape = (nodes, 2)
        self.kind = self._draw_kinds(shape)
        self.end_t = now + self._draw_durations(self.kind) * rng.random(shape)
        self.ckpt_period = np.zeros(shape)
        self.ckpt_len = np.zeros(shape)
        self.ckpt_phase = np.zeros(shape)
        self.iter_period = np.zeros(shape)
        self.iter_low = np.ones(shape)
        self.iter_phase = np.zeros(shape)
        self.pause_until = np.full(shape, -np.inf)
        self.job_no: I64 = np.arange(nodes * 2, dtype=np.int64).reshape(shape)
        self._next_job = nodes * 2
        self._new_jobs(np.ones(shape, dtype=np.bool_))
        self._mirror()
        self.busy = rng.random((nodes, gpus)) < 0.5
        self.gpu_offset = rng.normal(0.0, 1.5, (nodes, gpus))
        self.util = self.target(now)

    def _draw_kinds(self, shape: tuple[int, ...]) -> npt.NDArray[np.int8]:
        return self._kinds[self._rng.choice(len(self._kinds), size=shape, p=self._weights)]

    def _draw_durations(self, kind: npt.NDArray[np.int8]) -> F64:
        means = np.array([MEAN_DURATION_S[IDLE], MEAN_DURATION_S[TRAINING], MEAN_DURATION_S[INFERENCE]])
        out: F64 = np.maximum(MIN_DURATION_S, self._rng.exponential(1.0, kind.shape) * means[kind])
        return out

    def _new_jobs(self, mask: npt.NDArray[np.bool_]) -> None:
        k = int(mask.sum())
        if not k:
            return
        rng, v = self._rng, self._v
        self.ckpt_period[mask] = rng.uniform(*v.checkpoint_period_s, k)
        self.ckpt_len[mask] = rng.uniform(*v.checkpoint_s, k)
        self.ckpt_phase[mask] = rng.random(k) * self.ckpt_period[mask]
        self.iter_period[mask] = rng.uniform(*v.iteration_period_s, k)
        self.iter_low[mask] = rng.uniform(*v.iteration_low_frac, k)
        self.iter_phase[mask] = rng.random(k)

    def _mirror(self) -> None:
        """An unsplit node runs one job: its second half copies the first."""
        one = ~self.split
        for arr in (
            self.kind,
            self.end_t,
            self.ckpt_period,
            self.ckpt_len,
            self.ckpt_phase,
            self.iter_period,
            self.iter_low,
            self.iter_phase,
            self.pause_until,
            self.job_no,
        ):
            arr[one, 1] = arr[one, 0]
            if self.gang is not None:
                arr[:, 0] = arr[self.gang, 0]
                arr[:, 1] = np.where(self.split, arr[:, 1], arr[:, 0])

    def jobs(self) -> I64:
        """Each GPU's job number (-1: idle)."""
        out: I64 = np.where(self.kind == IDLE, -1, self.job_no)
        per_gpu: I64 = self._per_gpu(out)
        return per_gpu

    def crash(self, node: int, now: float) -> None:
        where: Any = node if self.gang is None else self.gang == self.gang[node]
        self.kind[where] = IDLE
        self.end_t[where] = now + MIN_DURATION_S

    def _per_gpu(self, arr: npt.NDArray[Any]) -> npt.NDArray[Any]:
        return np.take_along_axis(arr, self.half, axis=1)

    def target(self, now: float) -> F64:
        kind = self._per_gpu(self.kind)
        period = np.maximum(self.ckpt_period, 1.0)
        in_ckpt = ((now + self.ckpt_phase) % period) < self.ckpt_len
        paused = now < self.pause_until
        with np.errstate(invalid="ignore", divide="ignore"):
            cycle = np.where(
                self.iter_period > 0, (now / np.maximum(self.iter_period, 1e-9) + self.iter_phase) % 1.0, 0.0
            )
        level = np.where((self.iter_period > 0) & (cycle >= 0.5), self.iter_low, 1.0)
        level = self._per_gpu(level)
        hold = self._per_gpu(in_ckpt | paused)
        training = np.where(
            hold, np.where(self._per_gpu(paused), 0.0, 15.0), (95.0 + self.gpu_offset) * level
        )
        inference = np.where(self.busy, 85.0, 20.0) + 2 * self.gpu_offset
        out: F64 = np.where(kind == TRAINING, training, np.where(kind == INFERENCE, inference, 0.0))
        return out

    def step(self, now: float, dt: float) -> F64:
        rng = self._rng
        done = self.end_t <= now
        if self.gang is not None:
            done &= (self.gang == np.arange(self.nodes))[:, None]
        if done.any():
            new = self._draw_kinds((int(done.sum()),))
            self.kind[done] = new
            self.end_t[done] = now + self._draw_durations(new)
            self._new_jobs(done)
            self.job_no[done] = self._next_job + np.arange(int(done.sum()))
            self._next_job += int(done.sum())
        if self._v.restarts_per_hour > 0:
            stop = (self.kind == TRAINING) & (
                rng.random(self.kind.shape) < self._v.restarts_per_hour * dt / 3600
            )
            self.pause_until[stop] = now + rng.uniform(60.0, 300.0, int(stop.sum()))
        self._mirror()
        flip = rng.random(self.busy.shape) < min(1.0, BURST_SWITCH_PER_S * dt)
        self.busy ^= flip
        target = self.target(now)
        kind = self._per_gpu(self.kind)
        oscillating = self._per_gpu(self.iter_period > 0) & (kind == TRAINING)
        alpha = 1.0 - np.exp(-dt / UTIL_TAU_S)
        self.util = np.where(oscillating, target, self.util + (target - self.util) * alpha)
        sigma = np.array([0.0, 1.2, 6.0])[kind]
        noisy: F64 = np.clip(self.util + rng.normal(0.0, 1.0, self.util.shape) * sigma, 0.0, 100.0)
        return noisy

    def training(self) -> npt.NDArray[np.bool_]:
        out: npt.NDArray[np.bool_] = self._per_gpu(self.kind) == TRAINING
        return out

    def step_period(self) -> F64:
        """Each GPU's job's iteration period (``DEFAULT_STEP_S`` where power does not oscillate)."""
        out: F64 = self._per_gpu(np.where(self.iter_period > 0, self.iter_period, DEFAULT_STEP_S))
        return out

    def computing(self, now: float) -> npt.NDArray[np.bool_]:
        """Each GPU: its job computes at ``now`` (a job runs, outside a training checkpoint or stop)."""
        period = np.maximum(self.ckpt_period, 1.0)
        held = (((now + self.ckpt_phase) % period) < self.ckpt_len) | (now < self.pause_until)
        busy = (self.kind == INFERENCE) | ((self.kind == TRAINING) & ~held)
        out: npt.NDArray[np.bool_] = self._per_gpu(busy)
        return out

    def mem_fraction(self) -> F64:
        out: F64 = np.array([0.006, 0.92, 0.62])[self._per_gpu(self.kind)]
        return out

    def mem_util_factor(self) -> F64:
        out: F64 = np.array([0.0, 0.45, 0.7])[self._per_gpu(self.kind)]
        return out
