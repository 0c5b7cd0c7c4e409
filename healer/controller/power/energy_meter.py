"""Energy per failure domain and per job, from the frames' NVML energy counters (#30).

Every GPU sample carries ``energy_j``, NVML's total energy since the driver loaded (a counter that
restarts at zero on a driver reload, a GPU reset or a reboot). ``observe`` takes each frame's increase
per GPU (a counter lower than the last reading restarted: its value is what was drawn since) and adds
it to the GPU's domains (``rack=r7``, ``switch=leaf-07``: every key of the admitted topology, or
``controller.energy_keys``) and to its job (``jobs.JobIndex.job_of``: the agent's job map, Slurm or
Kubernetes placements). The first reading of a GPU only sets its baseline. ``fold`` moves what was
added into the counters ``healer_controller_energy_joules_total{domain}`` and
``healer_controller_job_energy_joules_total{job}`` once per tick (a frame's hot path touches only dicts).

A job not seen for ``JOB_TTL_S`` leaves the metric (its series stops; Prometheus keeps what was
scraped), and at most ``MAX_JOBS`` jobs are counted at once, so job ids cannot grow the exposition
without bound (a reading beyond the cap still counts for its domains; it is counted in
``healer_controller_energy_jobs_dropped_total`` and logged, once per tick). Each controller counts
what it ingests (a standby as well): read one controller's series, e.g. the leader's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import structlog

from healer.controller.observability import metrics as controller_metrics
from healer.schemas import framecols, telemetry

_READ = np.array([framecols.COLUMN["index"], framecols.COLUMN["energy_j"]], dtype=np.intp)

log = structlog.get_logger(__name__)

JOB_TTL_S = 3600.0
MAX_JOBS = 20000


class EnergyMeter:
    def __init__(self, metrics: controller_metrics.ControllerMetrics, keys: Sequence[str] = ()) -> None:
        self.metrics = metrics
        self.keys = tuple(keys)
        """The topology keys counted; empty: every key."""
        self.last: dict[tuple[str, int], float] = {}
        """(node, GPU) → its last energy reading, J."""
        self.domains: dict[str, tuple[str, ...]] = {}
        """node → the domains it counts into (``set_topology``)."""
        self.by_domain: dict[str, float] = {}
        self.by_job: dict[str, float] = {}
        self.job_seen: dict[str, float] = {}
        self.total_j: dict[str, float] = {}
        self.job_total_j: dict[str, float] = {}
        """Every job's joules since this process started (``job_joules``; dropped with the job)."""
        """Every domain's joules since this process started (what ``joules`` reads; kept past ``fold``)."""
        self.dropped_jobs = 0
        self._dropped_folded = 0

    def set_topology(self, domains: Mapping[str, Mapping[str, str]]) -> None:
        """Each node's domains (``admission.topology().domains``); refreshed now and then by the shell."""
        self.domains = {
            node: tuple(f"{k}={v}" for k, v in sorted(d.items()) if not self.keys or k in self.keys)
            for node, d in domains.items()
        }

    def observe(
        self, frame: telemetry.FrameView, job_of: Callable[[str, int], str | None] | None, now: float
    ) -> None:
        node = frame.node
        doms = self.domains.get(node, ())
        added = 0.0
        rows = frame.readings(_READ) if isinstance(frame, framecols.Frame) else None
        if rows is not None:  # the plane's, while they are there (NaN: null)
            readings = [(int(i), e) for i, e in rows if e == e]
        else:
            readings = [(g.index, e) for g in frame.gpus if (e := getattr(g, "energy_j", None)) is not None]
        for index, e in readings:
            key = (node, index)
            before = self.last.get(key)
            self.last[key] = e
            if before is None:
                continue
            delta = e - before if e >= before else e
            if delta <= 0:
                continue
            added += delta
            job = job_of(node, index) if job_of is not None else None
            if job is not None:
                if job not in self.job_seen and len(self.job_seen) >= MAX_JOBS:
                    self.dropped_jobs += 1
                else:
                    self.by_job[job] = self.by_job.get(job, 0.0) + delta
                    self.job_seen[job] = now
        if added:
            for d in doms:
                self.by_domain[d] = self.by_domain.get(d, 0.0) + added

    def forget_node(self, node: str) -> None:
        for key in [k for k in self.last if k[0] == node]:
            del self.last[key]

    def fold(self, now: float) -> None:
        """Once per tick: what was added into the counters; jobs silent past ``JOB_TTL_S`` dropped."""
        for d, j in self.by_domain.items():
            self.metrics.energy_domain.labels(d).inc(j)
            self.total_j[d] = self.total_j.get(d, 0.0) + j
        for job, j in self.by_job.items():
            self.metrics.energy_job.labels(job).inc(j)
            self.job_total_j[job] = self.job_total_j.get(job, 0.0) + j
        self.by_domain.clear()
        self.by_job.clear()
        if self.dropped_jobs > self._dropped_folded:
            new = self.dropped_jobs - self._dropped_folded
            self._dropped_folded = self.dropped_jobs
            self.metrics.energy_jobs_dropped.inc(new)
            log.warning("controller.energy_jobs_dropped", readings=new, jobs=len(self.job_seen), cap=MAX_JOBS)
        for job in [j for j, seen in self.job_seen.items() if now - seen > JOB_TTL_S]:
            del self.job_seen[job]
            self.job_total_j.pop(job, None)
            with contextlib.suppress(KeyError):  # never folded: no series yet
                self.metrics.energy_job.remove(job)

    def job_joules(self, job: str) -> float | None:
        """The job's joules counted so far, or None for a job not counted."""
        if job not in self.job_seen:
            return None
        return self.job_total_j.get(job, 0.0) + self.by_job.get(job, 0.0)

    def joules(self, domain: str) -> float:
        """The domain's joules counted so far (folded and not yet folded)."""
        return self.total_j.get(domain, 0.0) + self.by_domain.get(domain, 0.0)
