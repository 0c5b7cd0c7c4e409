"""Step times end to end (#28): the simulator's jobs (four nodes, pipeline stages, a rank 0 that does more)
publish each rank's step times on ``healer.steps`` through a real nats-server, a real controller reads
them, and

- a clock-limited GPU's ``gpu-straggler`` incident says "job X runs N % slower since T; rank R on
  node/GPU G is the outlier", R being the faulty GPU's rank, not rank 0 (which always computes most);
- a job-level stall (every rank waits on its host) names nobody and is one ``job-slowdown`` incident
  about the job, with no action and no drain."""

from __future__ import annotations

import asyncio
import pathlib
import time
from typing import Any

from healer import testing
from healer.agent import sim_fleet
from healer.bus import nats as natsbus
from healer.bus import subjects
from healer.controller.failslow import job_slowdowns
from healer.schemas import incidents
from healer.sim import scenarios, simulation
from tests.controller.conftest import Harness

RULES = (pathlib.Path(__file__).resolve().parents[2] / "rules" / "stragglers.yaml").read_text()
STEP_S = 5.0
"""Simulated seconds per fleet tick; the controller's 0.6 s windows see a few ticks each."""
FAULT_AT_S = 600.0
"""After the job's step-time baseline (three 2-minute windows of its reports)."""


def scenario(fault: dict[str, Any]) -> scenarios.Scenario:
    return scenarios.Scenario.model_validate(
        {
            "name": "steps",
            "workload": {"training": 1.0},
            "job_nodes": 4,
            "steps": True,
            "variation": {"pipeline_stages": 4, "stage_work_spread": 0.05, "rank0_extra": 0.1},
            "faults": [{"at_s": FAULT_AT_S, "nodes": [2], **fault}],
        }
    )


def changes(harness: Harness, change: str, rule: str) -> list[incidents.IncidentData]:
    return [e.data for e in harness.feed.events if e.change == change and e.data.rule_id == rule]


async def drive(harness: Harness, sim: simulation.Simulation, done: Any, after: int = 20) -> None:
    """Tick the fleet (frames and step reports) until ``done()``, then ``after`` ticks more."""
    bus = await natsbus.NatsBus.connect(harness.srv.url, name="fleet")
    fleet = sim_fleet.LiveFleet(sim, bus, subjects.Subjects())
    await fleet.start()
    try:
        async with asyncio.timeout(120):
            while not done():
                await fleet.tick(STEP_S)
                await asyncio.sleep(0.1)
            for _ in range(after):
                await fleet.tick(STEP_S)
                await asyncio.sleep(0.1)
    finally:
        await fleet.close()
        await bus.close()
    assert fleet.stats.step_reports > 0


async def test_a_clock_limited_gpus_incident_names_its_rank_as_the_outlier_from_the_step_times(
    harness: Harness,
) -> None:
    (harness.rules / "dbe.yaml").unlink()
    (harness.rules / "stragglers.yaml").write_text(RULES)
    fault = {"kind": "clock_limit", "gpu": 6, "params": {"drop": 0.15}}
    sim = scenarios.build(
        scenario(fault), nodes=4, seed=5, start_ts=time.time(), run_id=scenarios.fresh_run_id()
    )
    actuator = testing.RecordingActuator()
    ctl = await harness.controller(actuator, straggler_window_s=0.6, jobs_refresh_s=0)
    node = sim.fleet.node_names[2]
    rank = int(sim.fleet.ranks.rank[2, 6])
    assert rank != 0

    def said() -> list[incidents.IncidentData]:
        return [
            e.data
            for e in harness.feed.events
            if e.data.rule_id == "gpu-straggler" and "straggler.steps" in e.data.evidence
        ]

    await drive(harness, sim, lambda: bool(said()), after=5)
    (opened,) = changes(harness, "opened", "gpu-straggler")
    assert (opened.node, opened.gpu_index) == (node, 6)
    text = str(said()[0].evidence["straggler.steps"])
    job = f"{sim.fleet.run_id}-j{sim.fleet.job[2, 6]}"
    assert text.startswith(f"job {job} runs ")
    assert text.endswith(f"; rank {rank} on {node}/GPU 6 is the outlier")
    assert float(str(said()[0].evidence["straggler.job_slowdown_pct"])) > 5
    assert changes(harness, "opened", job_slowdowns.RULE_ID) == []  # a culprit is named
    failslow = ctl.learning.failslow
    assert failslow is not None
    assert set(failslow.scorer.stragglers) == {(node, 6)}  # rank 0 and the waiting peers: never


async def test_a_job_level_stall_is_one_job_slowdown_incident_and_nobody_is_drained(harness: Harness) -> None:
    (harness.rules / "dbe.yaml").unlink()
    (harness.rules / "stragglers.yaml").write_text(RULES)
    fault = {"kind": "job_slowdown", "params": {"slowdown": 0.25, "duration_s": 0}}
    sim = scenarios.build(
        scenario(fault), nodes=4, seed=5, start_ts=time.time(), run_id=scenarios.fresh_run_id()
    )
    actuator = testing.RecordingActuator()
    await harness.controller(actuator, straggler_window_s=0.6, jobs_refresh_s=0)
    await drive(harness, sim, lambda: bool(changes(harness, "opened", job_slowdowns.RULE_ID)))
    (inc,) = changes(harness, "opened", job_slowdowns.RULE_ID)
    job = f"{sim.fleet.run_id}-j{sim.fleet.job[2, 0]}"
    assert inc.node == job_slowdowns.node_of(job)
    assert inc.severity == "info"
    assert inc.domain is not None
    assert (inc.domain.key, inc.domain.value) == ("job", job)
    assert sorted(inc.domain.members) == sorted(sim.fleet.node_names)
    assert str(inc.evidence["steps"]).endswith("every rank computes as fast as before, the job waits")
    assert inc.actions == []
    assert changes(harness, "opened", "gpu-straggler") == []  # nobody named ...
    assert not [r for r in actuator.requests if r.kind in ("cordon", "migrate")]  # ... nobody drained
