"""The controller's fail-slow part (#28, docs/fail-slow.md): the job index, the GPU and node scorer
(``stragglers``), the port test (``straggler_ports``) and the jobs' step times (``steptimes``) together,
one window at a time (``score``), with what each straggler's incident says and the job-level slowdowns
nobody is to blame for.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping

from healer.controller.failslow import steptimes, straggler_ports, straggler_settings, stragglers
from healer.controller.inventory import jobs
from healer.schemas import telemetry


def port_straggler(lag: straggler_ports.Lagging, windows: int) -> straggler_settings.Straggler:
    """A node named by the port test (``straggler_ports``): its worst port, against its job's others."""
    p = lag.ports
    ev: dict[str, float | str] = {
        "straggler.job": lag.job,
        "straggler.nodes": lag.nodes,
        "straggler.windows": windows,
        "straggler.basis": "port counters",
    }
    if lag.congested:
        ev["straggler.port"] = p.wait_port
        ev["straggler.port_xmit_wait_per_s"] = round(p.wait_per_s)
        ev["straggler.reference_xmit_wait_per_s"] = round(lag.reference_wait_per_s)
        ev["straggler.cause"] = "port_congested"
    else:
        ev["straggler.port"] = p.error_port
        ev["straggler.port_errors"] = round(p.errors)
        ev["straggler.cause"] = "port_erroring"
    return straggler_settings.Straggler(lag.node, None, lag.job, "port", ev)


@dataclasses.dataclass(frozen=True)
class JobSlowdown:
    """A job that runs slower by its step times with no straggler named or pending in it (#28): a
    job-level slowdown, every rank waiting alike (docs/fail-slow.md, "Job-level slowdowns")."""

    job: str
    slower_pct: float
    since: float
    nodes: tuple[str, ...]
    summary: str


class FailSlow:
    """The controller's fail-slow part: the job index, the scorer, the port test, the jobs' step times,
    and what each straggler's incident says. Frames come in through ``observe`` (ingest), step reports
    through ``steps.observe``; ``tick`` scores at each window's end."""

    def __init__(
        self,
        settings: straggler_settings.Settings | None = None,
        port_settings: straggler_ports.Settings | None = None,
    ) -> None:
        self.jobs = jobs.JobIndex()
        self.scorer = stragglers.Scorer(settings)
        self.steps = steptimes.StepTimes()
        self.ports = straggler_ports.PortWatch()
        self.port_test = straggler_ports.PortTest(port_settings)
        self.last_cost_s = 0.0
        self.windows = 0
        """Windows scored so far (the incident shell acts once per window)."""

    def observe(self, frame: telemetry.FrameView) -> None:
        if self.scorer.observe(frame):
            self.jobs.observe_frame(frame)
            self.ports.observe(frame)

    def forget_node(self, node: str) -> None:
        """A node silent past retention: its jobs and ports are forgotten (its scorer slots stay, idle)."""
        self.jobs.forget_node(node)
        self.ports.forget_node(node)

    def tick(self, now: float) -> dict[str, dict[int, float]] | None:
        """Per node, per GPU: the straggler verdicts at a window's end (None between)."""
        if not self.scorer.due(now):
            return None
        started = time.process_time()
        job_of = {key: self.jobs.job_of(*key) for key in self.scorer._keys}
        score(self.scorer, self.port_test, self.ports, now, job_of)
        self.steps.forget(now)
        self.windows += 1
        self.last_cost_s = time.process_time() - started
        return self.scorer.scores()

    def job_level(self, now: float) -> list[JobSlowdown]:
        """Jobs that run slower by their step times while no GPU or node of theirs is a straggler or
        about to be one (a lagging streak, a port lagging): nobody to name, the job as a whole waits."""
        named = {found.job for found in self.scorer.stragglers.values()}
        held = named | self.scorer.pending_jobs | self.port_test.pending()
        out = []
        for job in self.steps.slower_jobs(now):
            if job in held:
                continue
            slow = self.steps.slowdown(job, now)
            said = self.steps.summary(job)
            if slow is None or said is None:
                continue
            nodes = tuple(sorted({n for n, _ in self.steps.jobs[job].where.values() if n}))
            out.append(JobSlowdown(job, round(100 * slow[0], 1), slow[1], nodes, said))
        return out

    def explain(self, node: str, gpu: int | None) -> dict[str, float | str]:
        """The evidence of the straggler at (node, gpu), or of its node (empty when none)."""
        found = self.scorer.stragglers.get((node, gpu)) or self.scorer.stragglers.get((node, None))
        if found is None:
            return {}
        out: dict[str, float | str] = {
            **self.ports.evidence(node),
            **found.evidence,
            "straggler.test": found.test,
        }
        causes = [str(out.get("straggler.cause", ""))] if out.get("straggler.cause") else []
        causes += [
            k.removeprefix("straggler.")
            for k in ("straggler.ports_down_trained", "straggler.ports_erroring", "straggler.ports_congested")
            if k in out
        ]
        if causes:
            out["straggler.cause"] = ",".join(dict.fromkeys(causes))
        out.update(self.step_evidence(found))
        return out

    def step_evidence(self, found: straggler_settings.Straggler) -> dict[str, float | str]:
        """What the job's step times say of a straggler's job (empty: not slower, or no reports)."""
        if found.job is None:
            return {}
        said = self.steps.summary(found.job, found.node, found.gpu)
        slow = self.steps.slowdown(found.job)
        if said is None or slow is None:
            return {}
        return {
            "straggler.steps": said,
            "straggler.job_slowdown_pct": round(100 * slow[0], 1),
            "straggler.slower_since": slow[1],
        }


def score(
    scorer: stragglers.Scorer,
    port_test: straggler_ports.PortTest,
    ports: straggler_ports.PortWatch,
    now: float,
    job_of: Mapping[tuple[str, int], str | None],
) -> None:
    """One window: the GPU and node tests (``Scorer.score``), then the port test over the nodes each job
    loaded in it; a node the port test confirms joins ``scorer.stragglers`` unless already named."""
    scorer.score(now, job_of)
    for lag, windows in port_test.score(scorer.job_nodes, ports.window()):
        if (lag.node, None) not in scorer.stragglers:
            scorer.stragglers[(lag.node, None)] = port_straggler(lag, windows)
