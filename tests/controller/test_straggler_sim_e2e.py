"""A clock-limited GPU in a simulated multi-node job, end to end: the simulator's fleet (four nodes
running one 32-GPU training job, their frames carrying the job) on a real nats-server, a real
controller with the default pack's ``gpu-straggler`` rule, one incident that names the faulty node, GPU
and job, and a drain of that node only: the healthy peers, which wait for it at lower power, are
never blamed."""

from __future__ import annotations

import asyncio
import pathlib
import time

from healer import testing
from healer.agent import sim_fleet
from healer.bus import nats as natsbus
from healer.bus import subjects
from healer.schemas import incidents
from healer.sim import scenarios
from tests import conftest
from tests.controller.conftest import Harness

RULES = (pathlib.Path(__file__).resolve().parents[2] / "rules" / "stragglers.yaml").read_text()
STEP_S = 5.0
"""Simulated seconds per fleet tick; the controller's 0.6 s windows see a few ticks each."""


def opened(harness: Harness) -> list[incidents.IncidentData]:
    return [e.data for e in harness.feed.events if e.change == "opened"]


async def test_a_clock_limited_gpu_of_a_multi_node_job_is_one_straggler_incident(harness: Harness) -> None:
    (harness.rules / "dbe.yaml").unlink()
    (harness.rules / "stragglers.yaml").write_text(RULES)
    sc = scenarios.Scenario.model_validate(
        {
            "name": "straggler",
            "workload": {"training": 1.0},
            "job_nodes": 4,
            "faults": [
                {"kind": "clock_limit", "at_s": 120, "nodes": [2], "gpu": 6, "params": {"drop": 0.15}}
            ],
        }
    )
    run_id = scenarios.fresh_run_id()
    sim = scenarios.build(sc, nodes=4, gpus=8, seed=5, start_ts=time.time(), run_id=run_id)
    actuator = testing.RecordingActuator()
    ctl = await harness.controller(actuator, straggler_window_s=0.6, jobs_refresh_s=0)
    failslow = ctl.learning.failslow
    assert failslow is not None
    fleet_bus = await natsbus.NatsBus.connect(harness.srv.url, name="fleet")
    fleet = sim_fleet.LiveFleet(sim, fleet_bus, subjects.Subjects())
    await fleet.start()
    faulty, job, t0 = sim.fleet.node_names[2], f"{run_id}-j{sim.fleet.job[2, 6]}", sim.t
    try:
        async with asyncio.timeout(60):
            while sim.t < t0 + 110:  # healthy first: the job's GPUs, no incident
                await fleet.tick(STEP_S)
                await asyncio.sleep(0.1)
            assert opened(harness) == []
            assert {failslow.jobs.job_of(n, g) for n in sim.fleet.node_names for g in range(8)} == {job}
            while not opened(harness):
                await fleet.tick(STEP_S)
                await asyncio.sleep(0.1)
            for _ in range(30):  # and for a while after: nobody else becomes a straggler
                await fleet.tick(STEP_S)
                await asyncio.sleep(0.1)
    finally:
        await fleet.close()
        await fleet_bus.close()
    (inc,) = opened(harness)
    assert inc.rule_id == "gpu-straggler"
    assert (inc.node, inc.gpu_index) == (faulty, 6)
    assert inc.evidence["straggler.job"] == job
    assert "hw_slowdown" in str(inc.evidence["straggler.cause"])
    assert inc.evidence["straggler.test"] == "peers"
    assert set(failslow.scorer.stragglers) == {(faulty, 6)}
    await conftest.until(lambda: any(r.kind == "cordon" for r in actuator.requests))
    assert {r.node for r in actuator.requests if r.kind == "cordon"} == {faulty}
    assert not any(r.kind == "migrate" for r in actuator.requests)
