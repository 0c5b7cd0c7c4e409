"""Step times from the job (controller/failslow/steptimes.py): the outlier is the rank whose own compute time
rose, not the rank that always computes more; a job whose ranks all wait names nobody; a job that stopped
reporting is no longer slower."""

from __future__ import annotations

from healer.controller.failslow import steptimes
from healer.schemas import stepreport

T0 = 1_800_000_000.0
BASE = {0: 1.10, 1: 0.95, 2: 0.95, 3: 1.05}
"""Each rank's compute time per step in a healthy window: rank 0 logs, rank 3's stage has more layers."""


def feed(
    steps: steptimes.StepTimes, start: float, seconds: int, step_s: float, compute: dict[int, float]
) -> float:
    for t in range(seconds):
        for rank, c in compute.items():
            steps.observe(
                stepreport.StepReport(
                    job="7", rank=rank, step_time_s=step_s, compute_s=c, node=f"n{rank // 2}", gpu=rank % 2,
                    ts=start + t,
                )
            )  # fmt: skip
    return start + seconds


def test_a_rank_that_always_computes_more_is_never_the_outlier_the_one_that_slowed_is() -> None:
    steps = steptimes.StepTimes()
    t = feed(steps, T0, 480, 1.1, BASE)  # baseline: three windows and more
    assert steps.slowdown("7") is None
    assert steps.summary("7") is None
    # rank 2 computes 10 % slower (still less than rank 0) and its link slows it more: a 10 % longer step
    t = feed(steps, t, 300, 1.21, {**BASE, 2: 1.05})
    fraction, _ = steps.slowdown("7") or (0.0, 0.0)
    assert round(100 * fraction) == 10
    said = steps.summary("7")
    assert said is not None
    assert said.endswith("rank 2 on n1/GPU 0 is the outlier")
    assert steps.jobs["7"].outlier == 2  # not rank 0, whose compute time is the largest all along


def test_a_job_whose_ranks_all_wait_alike_names_no_rank_unless_telemetry_named_one() -> None:
    steps = steptimes.StepTimes()
    t = feed(steps, T0, 480, 1.1, BASE)
    feed(steps, t, 300, 1.3, BASE)  # the step is longer; every rank computes as before and waits
    said = steps.summary("7")
    assert said is not None
    assert said.endswith("no rank is the outlier: every rank computes as fast as before, the job waits")
    named = steps.summary("7", "n1", None)  # the port test named node n1
    assert named is not None
    assert named.endswith("node n1 is the outlier")
    on_gpu = steps.summary("7", "n1", 1)  # a link test named n1/GPU 1: its rank
    assert on_gpu is not None
    assert on_gpu.endswith("rank 3 on n1/GPU 1 is the outlier")


def test_every_rank_computing_slower_names_no_rank() -> None:
    steps = steptimes.StepTimes()
    t = feed(steps, T0, 480, 1.1, BASE)
    feed(steps, t, 300, 1.1 * 1.15, {r: c * 1.15 for r, c in BASE.items()})  # a power cap on every GPU
    said = steps.summary("7")
    assert said is not None
    assert said.endswith("no rank is the outlier: every rank computes slower")


def test_a_job_that_stopped_reporting_is_no_longer_slower_and_is_forgotten_after_an_hour() -> None:
    steps = steptimes.StepTimes()
    t = feed(steps, T0, 480, 1.1, BASE)
    t = feed(steps, t, 300, 1.4, BASE)
    assert steps.slower_jobs(t) == ["7"]
    late = t + steptimes.STEP_STALE_WINDOWS * steptimes.STEP_WINDOW_S + 1
    assert steps.slower_jobs(late) == []
    assert steps.slowdown("7") is not None  # without a time: what it last said
    steps.forget(t + steptimes.FORGET_S - 1)
    assert "7" in steps.jobs
    steps.forget(t + steptimes.FORGET_S + 1)
    assert steps.jobs == {}
