"""The power shell's pure helpers (#30): a dry run's view of its planned caps, the domain's SM clock, and
what a cap cost the jobs (their step reports before the first cap and under it)."""

from __future__ import annotations

import pytest

from healer.controller.core import power_views
from healer.controller.failslow import steptimes
from healer.controller.power import power_budget
from healer.schemas import stepreport


def report(job: str, ts: float, step_s: float) -> stepreport.StepReport:
    return stepreport.StepReport(job=job, rank=0, step_time_s=step_s, ts=ts)


def windows(steps: steptimes.StepTimes, job: str, start: float, step_s: float, n: int) -> float:
    """``n`` windows of reports of ``step_s`` from ``start``; returns the time after them."""
    t = start
    for _ in range(n * int(steptimes.STEP_WINDOW_S / 10) + 1):
        steps.observe(report(job, t, step_s))
        t += 10.0
    return t


def test_a_caps_cost_is_the_jobs_step_time_under_it_against_before_once_a_whole_window_ran_capped() -> None:
    steps = steptimes.StepTimes()
    t = windows(steps, "job-1", 1000.0, 1.0, 2)
    first = power_views.job_cost(steps, ["job-1", "job-unknown"], None, {})
    assert first == {"step_s_before.job-1": 1.0}, "the last window before the first cap; no reports: nothing"
    capped_at = t
    t = windows(steps, "job-1", t, 1.25, 1)  # the window the cap fell into is not counted
    evidence = dict(first)
    assert power_views.job_cost(steps, ["job-1"], capped_at, evidence) == {}, "no whole window capped yet"
    windows(steps, "job-1", t, 1.25, 1)
    cost = power_views.job_cost(steps, ["job-1"], capped_at, evidence)
    assert cost["step_s_capped.job-1"] == pytest.approx(1.25)
    assert cost["step_s_cost.job-1"] == pytest.approx(0.25), "25 % slower under the cap"


def test_a_dry_run_reads_each_gpu_as_if_its_planned_cap_held() -> None:
    r = power_budget.Reading("n1", 0, power_w=690.0, limit_w=700.0, min_w=200.0, default_w=700.0)
    other = power_budget.Reading("n1", 1, power_w=300.0, limit_w=700.0, min_w=200.0, default_w=700.0)
    state = power_budget.DomainState(capped_w={"n1/0": 520.0, "n1/1": 500.0})
    held, under = power_views.planned([r, other], state)
    assert (held.limit_w, held.power_w) == (520.0, 520.0)
    assert (under.limit_w, under.power_w) == (500.0, 300.0), "a GPU drawing less than its cap keeps its draw"
    assert power_views.planned([r], power_budget.DomainState()) == [r]


def test_the_domains_clock_is_the_mean_of_the_gpus_that_report_one() -> None:
    frames: dict[str, list[dict[str, object]]] = {
        "a": [{"sm_clock_mhz": 1980.0}, {"sm_clock_mhz": None}],
        "b": [{"sm_clock_mhz": 1500}],
    }
    assert power_views.mean_clock(frames) == 1740.0
    assert power_views.mean_clock({"a": [{"sm_clock_mhz": None}]}) is None
