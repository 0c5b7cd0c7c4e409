"""The simulated jobs' ranks and step times (#28, sim/ranks.py): pipeline stages and a rank 0 that do more
work per step wait for nobody, the others wait at lower power with an even clock, and what the ranks
report to ``healer.steps`` lets the controller say how much slower a job runs and which rank is the
outlier, with no false straggler for the healthy asymmetry."""

from __future__ import annotations

import numpy as np

from healer.controller.failslow import detector
from healer.schemas import codec, stepreport
from healer.sim import ranks, scenarios, simulation, variation

UNEVEN = """
name: t
workload: {training: 1.0}
job_nodes: 4
ports: 8
steps: true
variation:
  pipeline_stages: 4
  stage_work_spread: 0.06
  rank0_extra: 0.1
  iteration_period_s: [2, 4]
"""


def _build(faults: str = "", seed: int = 3, text: str = UNEVEN) -> simulation.Simulation:
    return scenarios.build(
        scenarios.parse(text + (f"faults:\n{faults}\n" if faults else "")), nodes=8, seed=seed
    )


def _run(sim: simulation.Simulation, minutes: int) -> detector.FailSlow:
    """The controller's fail-slow part fed what a live run publishes: frames and step reports."""
    fs = detector.FailSlow()
    assert sim.steps is not None
    for _ in range(minutes * 12):
        sim.step(5.0)
        for _, data in sim.frames():
            fs.observe(codec.decode_frame(data))
        for r in sim.steps.reports(5.0):
            fs.steps.observe(stepreport.StepReport.model_validate(r))
        fs.tick(sim.t)
    return fs


def test_a_jobs_ranks_run_in_node_order_and_its_stages_and_rank_0_do_more_or_less_work() -> None:
    job = np.array([[4, 4, 4, 4, 9, 9, 9, 9], [4, 4, 4, 4, -1, -1, -1, -1]])
    training = job >= 0
    vary = variation.Drawn(pipeline_stages=(2.0, 2.0), stage_work_spread=0.05, rank0_extra=0.1)
    lay = ranks.layout(job, training, vary, seed=1)
    assert lay.rank.tolist() == [[0, 1, 2, 3, 0, 1, 2, 3], [4, 5, 6, 7, -1, -1, -1, -1]]
    work = lay.work
    assert (work[1, 4:] == 1.0).all()  # no job: nominal
    first, second = work[0, 1], work[1, 0]  # job 4's two stages: ranks 0-3 and 4-7
    assert (work[0, 1:4] == first).all()
    assert (work[1, :4] == second).all()
    assert min(first, second) >= 0.95
    assert max(first, second) <= 1.05
    assert work[0, 0] == first * 1.1  # rank 0's extra
    neutral = ranks.layout(job, training, variation.Drawn(), seed=1)
    assert (neutral.work == 1.0).all()


def test_healthy_uneven_ranks_wait_at_lower_power_with_an_even_clock_and_name_no_straggler() -> None:
    sim = _build()
    fs = _run(sim, 25)
    fl = sim.fleet
    job = fl.job[:4]
    assert len(set(job.ravel().tolist())) == 1
    heaviest = np.unravel_index(np.argmax(fl.ranks.work[:4]), (4, 8))
    assert fl.ranks.rank[heaviest] == 0  # rank 0's extra work makes it the slowest rank
    assert fl.wait[heaviest] == 0.0
    others = np.ones((4, 8), dtype=bool)
    others[heaviest] = False
    assert (fl.wait[:4][others] > 0.02).all()  # everybody else waits for it ...
    assert ((fl.sm_clock / fl.sm_max)[:4] > 0.97).all()  # ... at full clock
    # the healthy asymmetry: no straggler, no job slower, no job-level report, no outlier
    assert fs.scorer.stragglers == {}
    assert fs.steps.slower_jobs(sim.t) == []
    assert fs.job_level(sim.t) == []
    assert all(js.baseline_s is not None for js in fs.steps.jobs.values() if len(js.medians) >= 3)


def test_step_reports_leave_the_telemetry_as_it_was() -> None:
    with_steps, without = _build(), _build(text=UNEVEN.replace("steps: true", "steps: false"))
    assert without.steps is None
    assert with_steps.steps is not None
    for _ in range(30):
        with_steps.step(5.0)
        without.step(5.0)
        assert with_steps.steps.reports(5.0)
        assert with_steps.frames() == without.frames()


def test_the_clock_limited_gpus_rank_is_the_outlier_and_the_job_runs_slower() -> None:
    sim = _build("  - {kind: clock_limit, at_s: 900, nodes: [5], gpu: 3, params: {drop: 0.15}}")
    fs = _run(sim, 22)
    fl = sim.fleet
    rank = int(fl.ranks.rank[5, 3])
    assert rank != 0
    node = fl.node_names[5]
    assert set(fs.scorer.stragglers) == {(node, 3)}
    why = fs.explain(node, 3)
    job = str(why["straggler.job"])
    assert str(why["straggler.steps"]).startswith(f"job {job} runs ")
    assert str(why["straggler.steps"]).endswith(f"; rank {rank} on {node}/GPU 3 is the outlier")
    expected = 100 * (fl.ranks.work[5, 3] / 0.85 / fl.ranks.work[4:8].max() - 1)  # against its slowest rank
    assert abs(float(why["straggler.job_slowdown_pct"]) - expected) < 2.5
    assert fs.job_level(sim.t) == []  # a culprit is named: no job-level report


def test_a_job_level_stall_names_nobody_and_is_reported_from_the_step_times() -> None:
    sim = _build("  - {kind: job_slowdown, at_s: 900, nodes: [5], params: {slowdown: 0.2, duration_s: 0}}")
    fs = _run(sim, 22)
    assert fs.scorer.stragglers == {}
    (slow,) = fs.job_level(sim.t)
    assert slow.job == f"{sim.fleet.run_id}-j{sim.fleet.job[5, 0]}"
    assert slow.nodes == tuple(sim.fleet.node_names[4:8])
    assert slow.slower_pct > 5
    assert slow.summary.endswith(
        "no rank is the outlier: every rank computes as fast as before, the job waits"
    )


def test_a_congested_port_names_its_node_and_none_of_its_waiting_peers() -> None:
    sim = _build(
        "  - {kind: port_congestion, at_s: 900, nodes: [2], params: {port: 5, slowdown: 0.2, duration_s: 0}}"
    )
    fs = _run(sim, 22)
    node = sim.fleet.node_names[2]
    assert set(fs.scorer.stragglers) == {(node, None)}
    why = fs.explain(node, None)
    assert why["straggler.test"] == "port"
    assert why["straggler.port"] == "mlx5_5/1"
    assert str(why["straggler.steps"]).endswith(f"; node {node} is the outlier")
    assert fs.job_level(sim.t) == []
