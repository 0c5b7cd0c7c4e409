"""A rack over its power budget, end to end (#30): the simulator's fleet (two nodes of four GPUs, every job
training at full load) publishes frames on a real nats-server and answers power commands through the
agents' own executor; a controller with a budget for ``rack=r1`` below the rack's draw caps its GPUs
through the real power actuator (confirmed from telemetry), as one domain incident on the feed with the
per-GPU limits as evidence; when the jobs end it restores every limit, step by step, and resolves."""

from __future__ import annotations

import asyncio
import pathlib
import time

import numpy as np

from healer import testing
from healer.actuators import power
from healer.agent import sim_fleet
from healer.bus import nats as natsbus
from healer.bus import subjects
from healer.controller import power_budget, power_shell, service
from healer.schemas import incidents
from healer.sim import scenarios, simulation, workloads
from tests.controller.conftest import Harness

STEP_S = 1.0
"""Simulated seconds per fleet tick (one every 0.2 s of the controller's clock)."""


def domain_events(harness: Harness) -> list[incidents.IncidentEvent]:
    return [e for e in harness.feed.events if e.data.rule_id == power_budget.RULE_ID]


def steady(sim: simulation.Simulation, kind: int) -> None:
    """Every node runs ``kind`` for good: no job ends, no checkpoint dip (the test drives the load)."""
    work = sim.fleet.work
    work.kind[:] = kind
    work.end_t[:] = np.inf
    work.ckpt_phase[:] = workloads.CHECKPOINT_LENGTH_S + 1.0


async def test_a_rack_over_budget_is_capped_as_one_domain_incident_and_restored_when_load_drops(
    harness: Harness, tmp_path: pathlib.Path
) -> None:
    sc = scenarios.Scenario.model_validate({"name": "power", "workload": {"training": 1.0}})
    sim = scenarios.build(sc, nodes=2, gpus=4, seed=5, start_ts=time.time(), run_id=scenarios.fresh_run_id())
    names = sim.fleet.node_names
    steady(sim, workloads.TRAINING)
    for _ in range(20):  # utilisation settles at full load
        sim.step(STEP_S)
    full_w = float(sim.fleet.power.sum())
    budget_kw = round(0.8 * full_w / 1000.0, 3)
    inventory = tmp_path / "nodes.yaml"
    inventory.write_text("nodes:\n" + "".join(f"  {n}: {{rack: r1}}\n" for n in names))
    s = harness.settings(
        admission="file", inventory_file=str(inventory),
        power_budgets=[{
            "key": "rack", "value": "r1", "contract_kw": budget_kw, "hold_s": 1.0, "restore_after_s": 1.0,
            "restore_step_percent": 25.0, "hysteresis_percent": 5.0,
        }],
    )  # fmt: skip
    fleet_bus = await natsbus.NatsBus.connect(harness.srv.url, name="fleet")
    fleet = sim_fleet.LiveFleet(sim, fleet_bus, subjects.Subjects())
    await fleet.start()
    ctl_bus = await natsbus.NatsBus.connect(harness.srv.url, name="controller-power")
    ctl = await service.build(
        s, ctl_bus, scheduler=testing.RecordingActuator(),
        power=lambda c: power.PowerActuator(ctl_bus, c, c.subjects, s.actuators),
    )  # fmt: skip
    await ctl.start()
    harness.controllers.append((ctl, ctl_bus))
    budget_w = budget_kw * 1000.0
    capped_draw: list[float] = []
    try:

        def caps_done() -> bool:
            ev = domain_events(harness)
            acts = ev[-1].data.actions if ev else []
            return sum(a.kind == "power_limit" and a.status == "done" for a in acts) >= 8

        async with asyncio.timeout(60):
            while not caps_done():
                await fleet.tick(STEP_S)
                await asyncio.sleep(0.2)
        for _ in range(5):  # the capped rack, a few seconds on
            await fleet.tick(STEP_S)
            await asyncio.sleep(0.2)
            capped_draw.append(float(sim.fleet.power.sum()))
        assert ctl.power_budgets.views["rack=r1"].phase is power_budget.Phase.CAPPED
        stored = await ctl.state.get(power_shell.kv_key(s.controller.power_budgets[0]))
        assert stored is not None
        assert len(stored.value["capped_w"]) == 8, "the state is in KV for a new leader"

        steady(sim, workloads.IDLE)  # the jobs end: the rack has headroom
        async with asyncio.timeout(90):
            while not any(e.change == "resolved" for e in domain_events(harness)):
                await fleet.tick(STEP_S)
                await asyncio.sleep(0.2)
    finally:
        await fleet.close()
        await fleet_bus.close()

    events = domain_events(harness)
    assert [e.change for e in events].count("opened") == 1, "one domain incident for the episode"
    assert all(e.data.incident_id == events[0].data.incident_id for e in events)
    final = events[-1].data
    assert final.state == "resolved"
    assert final.node == "rack.r1"
    assert final.schema_ == incidents.SCHEMA_V2
    assert final.domain is not None
    assert (final.domain.key, final.domain.value) == ("rack", "r1")
    assert sorted(final.domain.members) == sorted(names)
    assert final.evidence["domain"] == "rack=r1"
    assert final.evidence["outcome"] == "restored"
    assert all(f"gpu.{n}.{g}" in final.evidence for n in names for g in range(4)), "per-GPU evidence"
    assert all(a.status == "done" for a in final.actions if a.kind == "power_limit")
    restores = [a for a in final.actions if a.kind == "restore_power_limit"]
    assert len(restores) == 8, "each GPU released once"
    assert all(a.status == "done" for a in restores)
    assert all(a.detail.startswith(tuple(names)) for a in final.actions), "each record names its GPU"
    assert max(capped_draw) <= budget_w * 1.02, f"capped under the budget: {capped_draw} vs {budget_w}"
    for n in range(2):
        for g in range(4):
            pl = sim.fleet.power_limits(n, g)
            assert pl.current_w == pl.default_w, "every GPU back at the limit it had"
    assert not [e for e in harness.feed.events if e.data.rule_id != power_budget.RULE_ID], "nothing else"
    stored = await ctl.state.get(power_shell.kv_key(s.controller.power_budgets[0]))
    assert stored is not None
    assert stored.value["capped_w"] == {}
