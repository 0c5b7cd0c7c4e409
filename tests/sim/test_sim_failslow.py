"""The simulator's jobs and fail-slow faults (#28): frames carry each GPU's job, multi-node jobs run as
one, and a clock-limited GPU, a down-trained link, a congested port or a job-level stall slow the whole
job: the faulty GPU shows the cause, its healthy peers wait at lower power. The controller's straggler
scorer, fed the decoded frames, names the faulty GPU and no other."""

from __future__ import annotations

import pathlib
import zipfile
from typing import Any

import numpy as np
import pytest

from healer import errors
from healer.controller.failslow import detector
from healer.schemas import codec, fields
from healer.sim import faults, recording, repair, scenarios, simulation, workloads

HW_SLOWDOWN = int(fields.ClocksEventReason.HW_SLOWDOWN)


def _build(text: str, nodes: int = 8, seed: int = 3) -> simulation.Simulation:
    return scenarios.build(scenarios.parse(text), nodes=nodes, gpus=8, seed=seed)


def _steps(sim: simulation.Simulation, n: int, dt: float = 5.0) -> None:
    for _ in range(n):
        sim.step(dt)


TWO_JOBS = """
name: t
workload: {training: 1.0}
job_nodes: 4
"""


def test_frames_carry_each_gpus_job_and_a_gang_of_nodes_runs_one_job() -> None:
    sim = _build(TWO_JOBS)
    _steps(sim, 3)
    decoded = [codec.decode_frame(b) for _, b in sim.frames()]
    jobs = {f.node: {tuple(g.jobs or ()) for g in f.gpus} for f in decoded}
    assert all(len(per_node) == 1 for per_node in jobs.values()), jobs
    by_node = [next(iter(jobs[name])) for name in sim.fleet.node_names]
    assert all(len(j) == 1 for j in by_node)
    assert len(set(by_node[:4])) == 1
    assert len(set(by_node[4:])) == 1
    assert by_node[0] != by_node[4]
    assert by_node[0][0].startswith(f"{sim.fleet.run_id}-j")
    # one fatal fault ends the job on every node of the gang: all four go idle and report no job
    sim.fleet.work.crash(1, sim.t)
    _steps(sim, 1)
    by_name = {f.node: f for f in (codec.decode_frame(b) for _, b in sim.frames())}
    names = sim.fleet.node_names
    assert all(g.jobs == [] for n in names[:4] for g in by_name[n].gpus)
    assert all(g.jobs == list(by_node[4]) for n in names[4:] for g in by_name[n].gpus)


def test_without_job_nodes_every_node_runs_its_own_job_and_idle_gpus_report_none() -> None:
    sim = _build("name: t\nworkload: {training: 0.5, idle: 0.5}\n", nodes=16)
    _steps(sim, 3)
    decoded = [codec.decode_frame(b) for _, b in sim.frames()]
    ids = [g.jobs for f in decoded for g in f.gpus]
    assert all(j is not None and len(j) <= 1 for j in ids)
    per_node = [{tuple(g.jobs or ()) for g in f.gpus} for f in decoded]
    assert all(len(p) == 1 for p in per_node)
    named = [next(iter(p)) for p in per_node if next(iter(p))]
    assert len(set(named)) == len(named) > 0  # no two nodes share a job
    assert any(next(iter(p)) == () for p in per_node)  # idle nodes: []


def _gang_sizes(text: str, nodes: int, seed: int) -> np.ndarray:
    gang = _build(text, nodes=nodes, seed=seed).fleet.work.gang
    assert gang is not None
    return np.bincount(gang, minlength=nodes)[gang]  # each node's job size (its gang's)


def test_a_job_size_range_drawn_with_an_exponent_gives_many_small_jobs_and_a_few_large() -> None:
    sizes = _gang_sizes("name: t\njob_nodes: [1, 64]\njob_nodes_exponent: 1.5\n", 2000, 5)
    share = {k: float(np.mean((sizes >= lo) & (sizes <= hi))) for k, (lo, hi) in
             {"1": (1, 1), "2-7": (2, 7), "8-31": (8, 31), "32-64": (32, 64)}.items()}  # fmt: skip
    # by nodes, n ** -1.5: about 6 % on single nodes, 18 % in 2-7, 37 % in 8-31, 38 % in 32-64
    assert 0.03 < share["1"] < 0.1, share
    assert 0.1 < share["2-7"] < 0.3, share
    assert 0.27 < share["8-31"] < 0.47, share
    assert 0.27 < share["32-64"] < 0.5, share
    assert sizes.max() >= 60
    # uniform (the default) puts almost every node in a large job: a single node is 1 gang in 64
    uniform = _gang_sizes("name: t\njob_nodes: [1, 64]\n", 2000, 5)
    assert np.mean(uniform == 1) < 0.01
    assert np.mean(uniform >= 32) > 0.6


def test_the_default_exponent_draws_job_sizes_as_before() -> None:
    seed, nodes = 7, 64
    drawn = np.random.default_rng([seed, 0x70B5]).integers(1, 9, nodes)
    want = np.bincount(workloads.gangs([int(x) for x in drawn], nodes), minlength=nodes)
    gang = _build("name: t\njob_nodes: [1, 8]\n", nodes=nodes, seed=seed).fleet.work.gang
    assert gang is not None
    assert np.array_equal(np.bincount(gang, minlength=nodes), want)


def test_a_negative_job_size_exponent_is_refused() -> None:
    with pytest.raises(errors.HealerError, match="job_nodes_exponent"):
        scenarios.parse("name: t\njob_nodes: [1, 8]\njob_nodes_exponent: -1\n")


def test_a_recording_replays_the_jobs_and_an_older_one_without_them_still_reads(
    tmp_path: pathlib.Path,
) -> None:
    sim = _build(TWO_JOBS)
    live: list[bytes] = []
    path = tmp_path / "r.npz"
    writer = recording.Writer(path, sim, interval_s=5.0)
    for _ in range(4):
        sim.step(5.0)
        cols = {k: v.copy() for k, v in sim.fleet.columns().items()}
        nodes, seq = sim.take_report()
        sim.fleet.seq[nodes] -= 1  # the writer takes the report itself
        boots = [sim.fleet.boot_id(i) for i in range(sim.fleet.nodes)]
        live.extend(b for _, b in sim.encoder.encode(cols, nodes, seq, boots, sim.t))
        writer.add_step()
    writer.close()
    with recording.Recording(path) as rec:
        replayed = [b for _, out in rec.frames() for _, b in out]
    assert replayed == live
    assert all(g.jobs for g in codec.decode_frame(replayed[0]).gpus)
    # an older recording: the same without the job arrays
    old = tmp_path / "old.npz"
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(old, "w") as dst:
        for item in src.infolist():
            if not item.filename.endswith("/job.npy"):
                dst.writestr(item, src.read(item.filename))
    with recording.Recording(old) as rec:
        frames = [codec.decode_frame(b) for _, out in rec.frames() for _, b in out]
    assert len(frames) == len(live)
    assert all(g.jobs is None for f in frames for g in f.gpus)


def _job_run(fault: str, *, ports: int = 0, steps: int = 60) -> simulation.Simulation:
    text = f"""
name: t
workload: {{training: 1.0}}
job_nodes: 4
ports: {ports}
faults:
  - {fault}
"""
    sim = _build(text)
    _steps(sim, steps)
    return sim


def _power_ratio(sim: simulation.Simulation) -> Any:
    fl = sim.fleet
    return fl.power / fl.power_limit


def test_a_clock_limited_gpu_lags_and_its_healthy_peers_wait_at_lower_power() -> None:
    sim = _job_run("{kind: clock_limit, at_s: 60, nodes: [1], gpu: 3, params: {drop: 0.15}}")
    fl = sim.fleet
    clock, power = fl.sm_clock / fl.sm_max, _power_ratio(sim)
    assert 0.8 < clock[1, 3] < 0.9
    assert fl.reasons[1, 3] & HW_SLOWDOWN
    peers = np.ones((8, 8), dtype=bool)
    peers[1, 3] = False
    assert (clock[peers] > 0.97).all()  # peers' clocks (and the other job's) stay up
    assert not (fl.reasons[peers] & HW_SLOWDOWN).any()
    job_peers, other_job = power[:4][peers[:4]], power[4:]
    assert power[1, 3] < job_peers.min()  # the faulty GPU draws least: its clock is low
    assert np.median(job_peers) < np.median(other_job) - 0.05  # its peers, on all four nodes, wait
    for node in (0, 2, 3):
        assert np.median(power[node]) < np.median(other_job) - 0.05
    # a reset ends it: the clock comes back and the peers stop waiting
    fl.reset_gpu(1, 3)
    _steps(sim, 4)
    assert fl.sm_clock[1, 3] / fl.sm_max[1, 3] > 0.97
    assert not fl.wait.any()


def test_a_down_trained_link_slows_the_job_without_a_clock_lag() -> None:
    for fault, link in (
        (
            "{kind: nvlink_degraded, at_s: 60, nodes: [2], gpu: 5, params: {links: 2, slowdown: 0.1}}",
            "nvlink",
        ),
        ("{kind: pcie_downtrain, at_s: 60, nodes: [2], gpu: 5, params: {slowdown: 0.1}}", "pcie"),
    ):
        sim = _job_run(fault)
        fl, power = sim.fleet, _power_ratio(sim)
        if link == "nvlink":
            assert fl.nvlink_up[2, 5] == fl.nvlink_total[2, 5] - 2
            assert not [e for e in sim.take_events() if e["kind"] == "xid"]  # no XID: it keeps running
        else:
            assert (fl.pcie_gen[2, 5], fl.pcie_width[2, 5]) == (3, 8)
        assert (fl.sm_clock / fl.sm_max)[:4].min() > 0.97  # nobody clocks low ...
        assert np.median(power[:4]) < np.median(power[4:]) - 0.04  # ... the whole job waits
        assert np.isclose(fl.wait[:4], 0.1).all()


def test_pcie_downtrain_without_a_slowdown_is_what_it_was() -> None:
    sim = _job_run("{kind: pcie_downtrain, at_s: 60, nodes: [2], gpu: 5}")
    assert (sim.fleet.pcie_gen[2, 5], sim.fleet.pcie_width[2, 5]) == (3, 8)
    assert not sim.fleet.wait.any()


def test_a_congested_port_rises_port_xmit_wait_and_the_job_waits() -> None:
    sim = _job_run("{kind: port_congestion, at_s: 60, nodes: [3], params: {port: 2}}", ports=8, steps=30)
    ports = sim.fleet.ports
    assert ports is not None
    before = ports.counters["port_xmit_wait"].copy()
    _steps(sim, 6)
    rate = (ports.counters["port_xmit_wait"] - before) / 30.0
    assert rate[3, 2] > 1e7 > 100 * rate[3, 1]
    assert rate[np.arange(8) != 3].max() < 1e4
    power = _power_ratio(sim)
    assert np.median(power[:4]) < np.median(power[4:]) - 0.04
    _steps(sim, 360)  # past its 30 minutes: the wait rate and the job's speed are back
    assert not [f for f in sim.injector.active if f.kind == "port_congestion"]
    assert not sim.fleet.wait.any()
    assert ports.wait_rate[3, 2] < 1e4


def test_a_job_level_stall_lowers_every_ranks_power_and_no_clock() -> None:
    sim = _job_run("{kind: job_slowdown, at_s: 60, nodes: [0], params: {slowdown: 0.15}}")
    fl, power = sim.fleet, _power_ratio(sim)
    assert (fl.sm_clock / fl.sm_max)[:4].min() > 0.97
    assert np.isclose(fl.wait[:4], 0.15).all()
    assert not fl.wait[4:].any()
    assert np.median(power[:4]) < np.median(power[4:]) - 0.05


def _scored(sim: simulation.Simulation, minutes: int) -> detector.FailSlow:
    fs = detector.FailSlow()
    for _ in range(minutes * 12):
        sim.step(5.0)
        for _, data in sim.frames():
            fs.observe(codec.decode_frame(data))
        fs.tick(sim.t)
    return fs


def test_the_straggler_scorer_names_the_clock_limited_gpu_and_none_of_its_waiting_peers() -> None:
    sim = _build(
        TWO_JOBS + "faults:\n  - {kind: clock_limit, at_s: 120, nodes: [2], gpu: 6, params: {drop: 0.12}}\n"
    )
    fs = _scored(sim, 7)
    assert set(fs.scorer.stragglers) == {("sim-00002", 6)}
    found = fs.scorer.stragglers[("sim-00002", 6)]
    assert found.job == f"{sim.fleet.run_id}-j{sim.fleet.job[2, 6]}"
    assert "hw_slowdown" in str(fs.explain("sim-00002", 6).get("straggler.cause"))


def test_the_straggler_scorer_names_no_gpu_for_a_job_level_stall() -> None:
    sim = _build(TWO_JOBS + "faults:\n  - {kind: job_slowdown, at_s: 120, nodes: [1]}\n")
    fs = _scored(sim, 7)
    assert fs.scorer.stragglers == {}


def test_the_failslow_scenario_shows_every_fail_slow_kind() -> None:
    sim = scenarios.build(scenarios.load("failslow"), nodes=16, gpus=8, seed=11)
    _steps(sim, 90)
    truth = sim.take_truth()
    assert {t["kind"] for t in truth} == {"clock_limit", "pcie_downtrain", "port_congestion", "job_slowdown"}
    assert {t["kind"] for t in truth} <= faults.FAIL_SLOW_KINDS | {"pcie_downtrain"}
    assert sim.fleet.wait.any()
    assert (sim.fleet.reasons & HW_SLOWDOWN).any()


def test_every_fail_slow_kind_has_a_repair_row_and_a_ladder_or_none() -> None:
    for kind in faults.FAIL_SLOW_KINDS:
        assert kind in repair.MODEL
    assert repair.MODEL["clock_limit"].ladder == "reset-then-reboot"
