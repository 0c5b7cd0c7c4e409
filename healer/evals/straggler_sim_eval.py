"""``healer bench stragglers --simulator``: the fail-slow detection on healer's own simulator (#28).

healer's simulator (docs/simulator.md) has what the shared independent fleet lacks: jobs on several
nodes, RDMA ports and their counters, pipeline stages and a rank 0 that do different work per step, and
step times the jobs report (``healer.steps``). Its physics is healer's own hypothesis of how a fail-slow
fault looks, so these figures show the multi-node, port and step-time paths work as designed, not that
they work on real fleets.

The fleet is ``SIM_SCENARIO``. Faults, one kind per fault in rotation (``SIM_KINDS``), on top of it:

- ``clock_limit``: a GPU clock-limited by 10-20 %: found when the GPU is named;
- ``nvlink_degraded``: two NVLinks of a GPU out, the GPU communicating 5-15 % slower: the GPU named;
- ``port_congestion``: an RDMA port of a node in a multi-node job congested (``port_xmit_wait`` 1.5-5
  x 10^7 ticks a second), the node communicating 5-15 % slower: the node named (any of its GPUs too);
- ``job_slowdown``: a node's ranks waiting on their host 10-20 % of the time, every rank of the job with
  them: no GPU or node may be named; found when ``FailSlow.job_level`` reports the job from its step
  times, counted from when it makes the job's step 5 % longer (a pipeline stage with slack absorbs a
  smaller stall: then no job runs slower and it is not counted).

Each fault starts at a drawn time and lasts to the run's end; detection is counted from its onset (the
first sample at which the faulty GPU's job computes), from the drawn time and from the first loaded
sample, as on the shared fleet (``straggler_eval``). Every run also counts false stragglers (a GPU or
node named on a node with no fault, the waiting peers of a faulty job's other nodes included) and false
job-level reports (a job reported slower that has no fault).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Final, NamedTuple

import numpy as np

from healer.controller.failslow import detector, steptimes, straggler_settings, stragglers
from healer.evals import straggler_tally
from healer.sim import faults, scenarios

SIM_SCENARIO: Final = {
    "name": "bench-stragglers",
    "workload": {"training": 0.8, "inference": 0.1, "idle": 0.1},
    "job_nodes": (1, 64),
    "job_nodes_exponent": 1.5,
    "ports": 8,
    "steps": True,
    "variation": {
        "split_share": 0.5,
        "iteration_period_s": (0.5, 10.0),
        "iteration_low_frac": (0.5, 0.9),
        "checkpoint_period_s": (1200.0, 2400.0),
        "checkpoint_s": (20.0, 180.0),
        "restarts_per_hour": (0.1, 1.0),
        "pipeline_stages": (1, 8),
        "stage_work_spread": 0.1,
        "rank0_extra": 0.1,
    },
}
"""healer's own simulator for ``--simulator``, the varied jobs of #28's false-straggler target: jobs on
1 to 64 nodes (gangs of consecutive nodes; a size n drawn as n ** -1.5: about 6 % of the nodes on single
nodes, 18 % in jobs of 2-7 nodes, 37 % in 8-31, 38 % in 32-64, as far as the fleet holds them), half of
the single nodes split 4+4, training power oscillating every 0.5-10 s, checkpoints, restarts, 8 RDMA
ports per node, 1 to 8 pipeline stages per training job whose work per step differs by up to 10 %, a
rank 0 that computes 10 % more, and every training rank reporting its step times."""
SIZE_CLASSES: Final = ("1", "2-3", "4-7", "8-15", "16-31", "32-64")
"""Job sizes (nodes) the healthy node-days are told by: each doubling, the last up to 64."""
SIM_KINDS: Final = ("clock_limit", "nvlink_degraded", "port_congestion", "job_slowdown")


class _Report(NamedTuple):
    """A step report as ``StepTimes.observe`` reads it (no wire decoding in the bench)."""

    job: str
    rank: int
    step_time_s: float
    compute_s: float | None
    node: str | None
    gpu: int | None
    ts: float


ALONE: Final = frozenset({"port_congestion", "job_slowdown"})
"""Kinds placed on a job (gang) with no other fault: a second congested port in a two-node job leaves
no healthy port to compare with, and a culprit named in a job holds its job-level report back."""


def _plan(
    rng: np.random.Generator, nodes: int, hours: float, faults_n: int, gang: np.ndarray
) -> list[straggler_tally.Fault]:
    """``faults_n`` faults, ``SIM_KINDS`` in rotation, each on its own node: a port congestion on a node
    of a multi-node gang, and ``ALONE`` kinds on a gang no other fault is on (fewer when none is left)."""
    plan: list[straggler_tally.Fault] = []
    used: set[int] = set()
    taken: dict[int, str] = {}  # gang leader -> "alone" or "shared"
    size = np.bincount(gang, minlength=nodes)[gang]
    for k in range(min(faults_n, nodes)):
        kind = SIM_KINDS[k % len(SIM_KINDS)]
        alone = kind in ALONE
        pool = [
            n
            for n in range(nodes)
            if n not in used
            and (kind != "port_congestion" or size[n] >= 2)
            and (int(gang[n]) not in taken if alone else taken.get(int(gang[n]), "shared") == "shared")
        ]
        if not pool:
            continue
        node = int(rng.choice(pool))
        used.add(node)
        taken[int(gang[node])] = "alone" if alone else "shared"
        gpu = int(rng.integers(0, 8)) if faults.KINDS[kind].scope == "gpu" else None
        drawn = float(rng.uniform(1800.0, max(1900.0, hours * 3600.0 - 900.0)))
        lo, hi = (0.10, 0.20) if kind in ("clock_limit", "job_slowdown") else (0.05, 0.15)
        plan.append(straggler_tally.Fault(kind, node, gpu, drawn, float(rng.uniform(lo, hi))))
    return plan


def _params(f: straggler_tally.Fault, rng: np.random.Generator) -> dict[str, float]:
    if f.kind == "clock_limit":
        return {"drop": f.magnitude}
    if f.kind == "nvlink_degraded":
        return {"links": 2.0, "slowdown": f.magnitude}
    if f.kind == "port_congestion":
        return {
            "port": float(rng.integers(0, 8)),
            "wait_per_s": float(rng.uniform(1.5e7, 5e7)),
            "slowdown": f.magnitude,
            "duration_s": 0.0,
        }
    return {"slowdown": f.magnitude, "duration_s": 0.0}


def run_sim_seed(
    nodes: int, hours: float, seed: int, faults_n: int, settings: straggler_settings.Settings
) -> dict[str, Any]:
    """One run of ``SIM_SCENARIO`` with ``faults_n`` faults (``SIM_KINDS`` in rotation)."""
    sc = scenarios.Scenario.model_validate(SIM_SCENARIO)
    sim = scenarios.build(sc, nodes=nodes, gpus=8, seed=seed)
    fl = sim.fleet
    gang = fl.work.gang if fl.work.gang is not None else np.arange(nodes)
    rng = np.random.default_rng(seed + 7919)
    plan = _plan(rng, nodes, hours, faults_n, gang)
    for f in plan:
        params = faults.validate_params(f.kind, _params(f, rng))
        sim.injector.schedule(faults.Fault(f.kind, f.node, f.gpu, fl.t + f.drawn_at, params))
    fs = detector.FailSlow(settings)
    steps_src = sim.steps
    assert steps_src is not None, "SIM_SCENARIO reports step times"
    assert fl.ports is not None, "SIM_SCENARIO has ports"
    short = [f"n{i}" for i in range(nodes)]
    short_of = dict(zip(fl.node_names, short, strict=True))
    keys = [(short[i], g) for i in range(nodes) for g in range(8)]
    idx = np.array([fs.scorer.slot(*k) for k in keys])
    t0, t, cost_s, steps_cpu_s, interval = fl.t, 0.0, 0.0, 0.0, 5.0
    tally = straggler_tally.Tally(plan)
    size_class = np.minimum(np.log2(np.bincount(gang, minlength=nodes)[gang]).astype(np.int64), 5)
    split = np.asarray(getattr(fl.work, "split", np.zeros(nodes, dtype=bool)), dtype=bool)
    busy_s = np.zeros(len(SIZE_CLASSES) + 2)  # by size class, then split nodes, then training
    job_level_false: dict[str, float] = {}
    fault_jobs: dict[str, straggler_tally.Fault] = {}
    for _ in range(int(hours * 3600 / interval)):
        sim.step(interval)
        t += interval
        util, computing = fl.util, fl.work.computing(fl.t)
        _mark_faults(plan, t, fl, computing, steps_src, fault_jobs)
        busy_s += interval * _busy_nodes(computing, fl.ranks.rank >= 0, size_class, split, plan, t)
        reports = steps_src.reports(interval)
        link = (fl.pcie_gen < fl.pcie_gen_max) | (fl.nvlink_up < fl.nvlink_total)
        started = time.process_time()
        for r in reports:
            node = short_of[r["node"]]
            fs.steps.observe(
                _Report(r["job"], r["rank"], r["step_time_s"], r["compute_s"], node, r["gpu"], r["ts"] - t0)
            )
        steps_cpu_s += time.process_time() - started
        started = time.process_time()
        fs.scorer.observe_arrays(
            idx,
            util.ravel(),
            (fl.sm_clock / fl.sm_max).ravel(),
            (fl.power / fl.power_limit).ravel(),
            fl.reasons.ravel(),
            link.ravel().astype(np.float64),
        )
        if not fs.scorer.due(t):
            cost_s += time.process_time() - started
            continue
        _record_ports(fs, fl.ports, short, t)
        jobs = fl.job.ravel().tolist()
        job_of = {k: (None if j < 0 else steps_src.job_id(j)) for k, j in zip(keys, jobs, strict=True)}
        detector.score(fs.scorer, fs.port_test, fs.ports, t, job_of)
        level = fs.job_level(t)
        cost_s += time.process_time() - started
        tally.window(t, set(fs.scorer.stragglers))
        _tally_job_level(level, t, fault_jobs, job_level_false, tally)
    healthy_node_s = nodes * hours * 3600.0 - sum(hours * 3600.0 - f.drawn_at for f in plan)
    return {
        "seed": seed,
        "nodes": nodes,
        "hours": hours,
        "gpus": nodes * 8,
        "false_episodes": tally.episodes,
        "false_job_level": tally.job_level_false,
        "healthy_node_days": healthy_node_s / 86400.0,
        "computing_node_days": _node_days(busy_s),
        "faults": [dataclasses.asdict(f) for f in plan],
        "cpu_s": cost_s,
        "steps_cpu_s": steps_cpu_s,
        "step_reports": fs.steps.accepted,
        "sim_s": hours * 3600.0,
    }


def _mark_faults(
    plan: list[straggler_tally.Fault],
    t: float,
    fl: Any,
    computing: np.ndarray,
    steps_src: Any,
    fault_jobs: dict[str, straggler_tally.Fault],
) -> None:
    """For each fault drawn by ``t``: when its GPU was first loaded, when it first slowed a computing
    GPU, and the jobs it runs under (a job-level slowdown of those is found, not false)."""
    util = fl.util
    for f in plan:
        if t < f.drawn_at:
            continue
        cols = slice(None) if f.gpu is None else f.gpu
        if f.loaded_at is None and util[f.node, f.gpu or 0] >= stragglers.LOAD_UTIL_PCT:
            f.loaded_at = t
        if f.onset_at is None and computing[f.node, cols].any() and _slows(fl, f):
            f.onset_at = t
        for j in set(fl.job[f.node, cols].ravel().tolist()) - {-1}:
            fault_jobs[steps_src.job_id(int(j))] = f


def _tally_job_level(
    level: Any,
    t: float,
    fault_jobs: dict[str, straggler_tally.Fault],
    job_level_false: dict[str, float],
    tally: straggler_tally.Tally,
) -> None:
    """A job-level slowdown of a job no fault runs under is false (once per episode); of a faulty job's,
    it finds that fault."""
    for slow in level:
        had = fault_jobs.get(slow.job)
        if had is None:
            if t - job_level_false.get(slow.job, -math.inf) >= straggler_tally.EPISODE_S:
                job_level_false[slow.job] = t
                tally.job_level_false += 1
        elif had.kind in straggler_tally.JOB_LEVEL_KINDS and had.found_at is None:
            had.found_at = t


def _busy_nodes(
    computing: np.ndarray,
    training: np.ndarray,
    size_class: np.ndarray,
    split: np.ndarray,
    plan: list[straggler_tally.Fault],
    t: float,
) -> np.ndarray:
    """Healthy nodes (no fault drawn yet) with a job computing now: how many by their job's size class
    (``SIZE_CLASSES``), then how many of them are split 4+4, then how many compute in a training job."""
    faulty = np.zeros(computing.shape[0], dtype=bool)
    faulty[[f.node for f in plan if t >= f.drawn_at]] = True
    busy = np.asarray(computing.any(axis=1), dtype=bool) & ~faulty
    by_size = np.bincount(size_class[busy], minlength=len(SIZE_CLASSES))
    out: np.ndarray = np.append(
        by_size, [np.count_nonzero(busy & split), np.count_nonzero(busy & (computing & training).any(axis=1))]
    )
    return out


def _node_days(busy_s: np.ndarray) -> dict[str, float]:
    """``_busy_nodes`` summed over a run (node-seconds) as node-days, by name."""
    names = [f"jobs of {c} node{'' if c == '1' else 's'}" for c in SIZE_CLASSES] + ["split 4+4", "training"]
    return {name: round(float(v) / 86400.0, 4) for name, v in zip(names, busy_s.tolist(), strict=True)}


def _slows(fl: Any, f: straggler_tally.Fault) -> bool:
    """A job-level stall counts from when it makes its job's step ``STEP_SLOWER`` (5 %) longer: a stage
    with slack (less work per step than the job's slowest rank) absorbs a smaller stall, and then no job
    runs slower. Every other kind: from when its GPU's job computes."""
    if f.kind not in straggler_tally.JOB_LEVEL_KINDS:
        return True
    job = int(fl.job[f.node, 0])
    if job < 0:
        return False
    mine = fl.job == job
    return bool(fl.job_time[mine].max() / fl.ranks.work[mine].max() - 1 >= steptimes.STEP_SLOWER)


def _record_ports(fs: detector.FailSlow, ports: Any, short: list[str], t: float) -> None:
    """Each node's port counters into the port watch, once a window (what the port test reads)."""
    wait = ports.counters["port_xmit_wait"].tolist()
    errors = sum(ports.counters[k] for k in ("symbol_error", "link_downed", "port_rcv_errors")).tolist()
    present = ports.present.tolist()
    for i, node in enumerate(short):
        counters = {
            f"mlx5_{p}/1": {"port_xmit_wait": wait[i][p], "symbol_error": errors[i][p]}
            for p in range(ports.ports)
            if present[i][p]
        }
        fs.ports.record(node, t, counters, {})
