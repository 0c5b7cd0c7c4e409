"""Step times from the job (#28, docs/fail-slow.md): does a job really run slower, by how much, since
when, and which rank is the outlier.

A job may publish each rank's iteration time (``healer.steps``). Per job, the median step time over a
window of ``STEP_WINDOW_S`` is compared with the job's baseline (the median of its first
``STEP_BASELINE_WINDOWS`` windows): ``STEP_SLOWER`` (5 %) or more above it, the job runs slower. The
outlier rank is the one whose own compute time (``compute_s``, the part of the step before it waits for
its peers, when the job reports it) rose most against *its own* baseline: ranks that always compute more
(a pipeline stage with more layers, a rank 0 that logs) are not outliers for that, only a rank that got
slower is. When every rank computes as fast as before yet the job is slower, no rank is the outlier: the
job waits on something outside its GPUs' compute (a link, a port, a data loader, storage), which the
incident then says.

Pure bookkeeping: reports come in through ``observe`` (ingest), time is the reports' own (``ts``), and
nothing here does I/O.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Final, Protocol

import numpy as np

STEP_WINDOW_S: Final = 120.0
"""Step times are compared over this window (the job's median step time in it)."""
STEP_BASELINE_WINDOWS: Final = 3
STEP_SLOWER: Final = 0.05
"""A job whose median step time is this much (5 %) above its baseline runs slower; a rank whose median
compute time is this much above its own baseline (and its peers') is the outlier."""
STEP_STALE_WINDOWS: Final = 3
"""A job that reported nothing for this many windows is no longer known to run slower (it ended or
stopped reporting); it is forgotten after ``FORGET_S``."""
FORGET_S: Final = 3600.0


class Report(Protocol):
    """What a step report carries (schemas/stepreport.py ``StepReport``; benches pass lighter objects)."""

    @property
    def job(self) -> str: ...
    @property
    def rank(self) -> int: ...
    @property
    def step_time_s(self) -> float: ...
    @property
    def compute_s(self) -> float | None: ...
    @property
    def node(self) -> str | None: ...
    @property
    def gpu(self) -> int | None: ...
    @property
    def ts(self) -> float: ...


@dataclasses.dataclass
class JobSteps:
    window: list[float] = dataclasses.field(default_factory=list)
    compute: dict[int, list[float]] = dataclasses.field(default_factory=dict)
    where: dict[int, tuple[str | None, int | None]] = dataclasses.field(default_factory=dict)
    baseline_s: float | None = None
    medians: list[float] = dataclasses.field(default_factory=list)
    compute_windows: dict[int, list[float]] = dataclasses.field(default_factory=dict)
    """Each rank's median compute time in the baseline windows (until the baseline is set)."""
    compute_base: dict[int, float] = dataclasses.field(default_factory=dict)
    current_s: float | None = None
    slower_since: float | None = None
    started: float = 0.0
    last_ts: float = 0.0
    outlier: int | None = None
    """The rank whose compute time rose most against its own baseline, while the job runs slower."""
    compute_ratio: float | None = None
    """That rank's compute time against its own baseline."""
    typical_ratio: float | None = None
    """The ranks' median compute time against their own baselines (1: they compute as fast as before)."""


class StepTimes:
    """Per job: the median step time per window against the job's own first windows (its baseline),
    since when it is slower, and which rank is the outlier (its compute time against its own)."""

    def __init__(self) -> None:
        self.jobs: dict[str, JobSteps] = {}
        self.accepted = 0

    def observe(self, report: Report) -> None:
        js = self.jobs.get(report.job)
        if js is None:
            js = self.jobs[report.job] = JobSteps(started=report.ts, last_ts=report.ts)
        js.window.append(report.step_time_s)
        if report.compute_s is not None:
            js.compute.setdefault(report.rank, []).append(report.compute_s)
        js.where[report.rank] = (report.node, report.gpu)
        js.last_ts = max(js.last_ts, report.ts)
        self.accepted += 1
        if report.ts - js.started >= STEP_WINDOW_S:
            self._close(js, report.ts)

    def _close(self, js: JobSteps, now: float) -> None:
        per_rank = {r: float(np.median(v)) for r, v in js.compute.items()}
        if js.window:
            js.current_s = float(np.median(js.window))
            if js.baseline_s is None:
                js.medians.append(js.current_s)
                for r, c in per_rank.items():
                    js.compute_windows.setdefault(r, []).append(c)
                if len(js.medians) >= STEP_BASELINE_WINDOWS:
                    js.baseline_s = float(np.median(js.medians))
                    js.compute_base = {r: float(np.median(v)) for r, v in js.compute_windows.items()}
                    js.compute_windows = {}
            elif js.current_s > js.baseline_s * (1 + STEP_SLOWER):
                js.slower_since = js.slower_since or js.started
            else:
                js.slower_since = None
        js.outlier, js.compute_ratio, js.typical_ratio = None, None, None
        if js.slower_since is not None:
            js.outlier, js.compute_ratio, js.typical_ratio = _outlier(per_rank, js.compute_base)
        js.window, js.compute, js.started = [], {}, now

    def slowdown(self, job: str, now: float | None = None) -> tuple[float, float] | None:
        """(fraction slower than the baseline, since when) for a job that runs slower, else None; with
        ``now``, also None for a job that has not reported for ``STEP_STALE_WINDOWS`` windows."""
        js = self.jobs.get(job)
        if js is None or js.baseline_s is None or js.current_s is None or js.slower_since is None:
            return None
        if now is not None and now - js.last_ts > STEP_STALE_WINDOWS * STEP_WINDOW_S:
            return None
        return js.current_s / js.baseline_s - 1, js.slower_since

    def slower_jobs(self, now: float) -> list[str]:
        """The jobs that run slower now (reported within ``STEP_STALE_WINDOWS`` windows)."""
        return [job for job in self.jobs if self.slowdown(job, now) is not None]

    def forget(self, now: float) -> None:
        """Jobs that reported nothing for ``FORGET_S`` are dropped (ended jobs do not pile up)."""
        for job in [j for j, js in self.jobs.items() if now - js.last_ts > FORGET_S]:
            del self.jobs[job]

    def rank_on(self, job: str, node: str, gpu: int | None) -> int | None:
        js = self.jobs.get(job)
        if js is None:
            return None
        for rank, (n, g) in sorted(js.where.items()):
            if n == node and (gpu is None or g is None or g == gpu):
                return rank
        return None

    def summary(self, job: str, node: str | None = None, gpu: int | None = None) -> str | None:
        """ "job X runs N % slower since T; rank R on node/GPU G is the outlier" (None: not slower). The
        outlier is the rank whose compute time rose; else, with a straggler named by telemetry (``node``,
        ``gpu``), its rank or node; else nobody: every rank computes as fast as before."""
        slow = self.slowdown(job)
        if slow is None:
            return None
        fraction, since = slow
        js = self.jobs[job]
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(since))
        text = f"job {job} runs {round(100 * fraction)} % slower since {at}"
        rank = js.outlier
        if rank is None and node is not None and gpu is not None:
            rank = self.rank_on(job, node, gpu)
        if rank is not None:
            n, g = js.where.get(rank, (node, gpu))
            return text + f"; rank {rank} on {n or node}/GPU {g if g is not None else '?'} is the outlier"
        if node is not None:
            return text + f"; node {node} is the outlier"
        if js.typical_ratio is None:
            return text + "; no rank is known to be the outlier"
        if js.typical_ratio >= 1 + STEP_SLOWER:
            return text + "; no rank is the outlier: every rank computes slower"
        return text + "; no rank is the outlier: every rank computes as fast as before, the job waits"


def _outlier(
    per_rank: dict[int, float], base: dict[int, float]
) -> tuple[int | None, float | None, float | None]:
    """(outlier, its compute ratio, the ranks' median ratio): the rank whose compute time rose most
    against its own baseline, when it rose by ``STEP_SLOWER`` or more and by that much more than its
    peers' (a job whose every rank computes slower, as under a power cap, has none)."""
    ratios = {r: c / base[r] for r, c in per_rank.items() if base.get(r)}
    if not ratios:
        return None, None, None
    rank = max(ratios, key=lambda r: ratios[r])
    top, typical = ratios[rank], float(np.median(list(ratios.values())))
    if top >= 1 + STEP_SLOWER and top - typical >= STEP_SLOWER:
        return rank, round(top, 4), round(typical, 4)
    return None, None, round(typical, 4)
