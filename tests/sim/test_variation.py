"""Fleet variation: each effect does what docs/simulator.md says, and without it nothing changes."""

from __future__ import annotations

from typing import Any

import numpy as np

from healer.sim import scenarios, workloads


def _build(variation: dict[str, Any], *, nodes: int = 8, seed: int = 3, **extra: Any) -> Any:
    sc = scenarios.Scenario.model_validate(
        {"name": "v", "workload": {"training": 1.0}, "variation": variation, **extra}
    )
    return scenarios.build(sc, nodes=nodes, gpus=8, seed=seed)


def test_no_variation_block_gives_the_same_fleet_as_before() -> None:
    a = scenarios.build(scenarios.Scenario(name="v", workload={"training": 1.0}), nodes=4, seed=3)
    b = _build({}, nodes=4)
    for _ in range(30):
        a.step(5.0)
        b.step(5.0)
    assert a.frames() == b.frames()
    assert isinstance(b.fleet.work, workloads.Workloads)


def test_resistance_spread_is_lognormal_with_the_given_sigma() -> None:
    sim = _build({"resistance_sigma": 0.07}, nodes=200)
    log_r = -np.log(sim.fleet.cool_base)
    assert abs(float(log_r.std()) - 0.07) < 0.005


def test_the_rear_row_breathes_air_the_front_row_heated() -> None:
    sim = _build({"rear_preheat_c": 2.0})
    for _ in range(60):
        sim.step(5.0)
    inlet = sim.fleet._inlet()
    rear_extra = inlet[:, 4:].mean(axis=1) - inlet[:, :4].mean(axis=1)
    assert (rear_extra > 0.5).all()
    assert (rear_extra <= 2.0).all()


def test_racks_share_an_inlet_that_swings_through_the_day() -> None:
    sim = _build({"rack_nodes": 4, "rack_inlet_spread_c": 3, "daily_swing_c": 3}, nodes=8)
    before = sim.fleet._inlet()[:, 0].copy()
    spread_in_rack = np.ptp(before[:4])
    assert spread_in_rack <= 1.0  # nodes of one rack within ± 0.5 °C
    for _ in range(6 * 60):
        sim.step(60.0)  # six hours
    moved = sim.fleet._inlet()[:, 0] - before
    assert np.abs(moved).max() > 1.0
    assert np.ptp(moved[:4]) < 1e-9  # a rack moves as one


def test_split_nodes_run_two_jobs_and_training_power_oscillates() -> None:
    sim = _build({"split_share": 1.0, "iteration_period_s": [2, 10], "iteration_low_frac": 0.5}, nodes=16)
    work = sim.fleet.work
    assert isinstance(work, workloads.VariedWorkloads)
    assert work.split.all()
    utils = []
    for _ in range(60):
        sim.step(5.0)
        utils.append(sim.fleet.util.copy())
    u = np.array(utils)
    training = (work.kind == workloads.TRAINING).all(axis=1)
    assert training.any()
    # sample to sample, oscillating GPUs swing by tens of percent
    assert np.abs(np.diff(u[:, training], axis=0)).max() > 30


def test_model_pools_put_one_gpu_model_on_contiguous_nodes() -> None:
    sim = _build({"model_pools": 2}, nodes=10, models={"H100": 0.5, "A100": 0.5})
    names = [p.key for p in sim.fleet.profiles]
    assert len(set(names[:5])) == 1
    assert len(set(names[5:])) == 1


def test_fault_parameters_may_be_ranges_drawn_per_target() -> None:
    sc = scenarios.Scenario.model_validate(
        {
            "name": "f",
            "faults": [
                {"kind": "cooling_degradation", "nodes": 4, "params": {"final_efficiency": [0.5, 0.7]}}
            ],
        }
    )
    sim = scenarios.build(sc, nodes=4, seed=1)
    for _ in range(20):
        sim.step(5.0)
    drawn = [t["params"]["final_efficiency"] for t in sim.take_truth()]
    assert len(drawn) == 4
    assert len(set(drawn)) == 4
    assert all(0.5 <= v <= 0.7 for v in drawn)
