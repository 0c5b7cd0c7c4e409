"""``healer bench stragglers``: the fail-slow scorer's figures on a fleet it was not written against (#28).

The fleet is the shared independent H100 generator (its ``gen.py``, given by path: it is not part of
healer): 8-GPU and 4+4-GPU single-node jobs, power as a square wave at the iteration period (2-10 s),
checkpoints, init phases, idle gaps, crash restarts, chips that hit their power cap and clock lower.
Its readings go straight into ``stragglers.Scorer.observe_arrays`` (the decoder is measured elsewhere);
each generator slot is one job, known while it is allocated (as a Slurm prolog's job map would say).

- false stragglers: healthy runs, every confirmed straggler episode (one per GPU or node per hour, as
  the ``gpu-straggler`` rule's cooldown makes it) per 1,000 node-days, with the exact 95 % upper bound;
- detection: fail-slow faults this module injects on top of the generator's readings (the generator
  has none): a GPU clock-limited by 10-20 % (power down with it, HW slowdown reason), a PCIe link
  trained down to gen 3, and a whole node clock-limited by 10-20 %, at a random time in a job; found
  when the scorer names the right GPU (or, for the node fault, the node or one of its GPUs) within
  5 minutes of onset; the share with its exact 95 % lower bound;
- cost: the scorer's CPU time per simulated second, as a share of one core, and scaled to 10,000 nodes.

Seeds below 1000 are for tuning, 1000 and up for a final figure (the generator's README); the report
says which were used.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import pathlib
import sys
import time
from types import ModuleType
from typing import Any, Final

import numpy as np

from healer.anomaly import backtest
from healer.controller import stragglers

DETECT_S = 300.0
EPISODE_S = 3600.0
FAULT_KINDS = ("clock_limited_gpu", "pcie_down_trained", "clock_limited_node")


def load_generator(path: str | pathlib.Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("h100_independent_gen", str(path))
    if spec is None or spec.loader is None:
        raise FileNotFoundError(f"{path}: not a Python file")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@dataclasses.dataclass
class Fault:
    kind: str
    node: int
    gpu: int | None
    onset_s: float
    magnitude: float
    found_s: float | None = None
    loaded_s: float | None = None
    """Seconds from onset to the faulty GPU's (node's first GPU's) first loaded sample: a fault that
    starts in a checkpoint, an init phase or an idle gap cannot show before it."""


def lower95(k: int, n: int) -> float:
    """Exact (Clopper-Pearson) two-sided 95 % lower bound of a share: ``k`` of ``n``."""
    if n == 0 or k == 0:
        return 0.0

    def tail(p: float) -> float:  # P(X >= k) for X ~ Binomial(n, p)
        return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1))

    lo, hi = 0.0, k / n
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if tail(mid) > 0.025 else (mid, hi)
    return lo


def run_seed(
    gen: ModuleType, nodes: int, hours: float, seed: int, faults: int, settings: stragglers.Settings
) -> dict[str, Any]:
    rng = np.random.default_rng(seed + 7919)
    chosen = [int(x) for x in rng.choice(nodes, size=min(faults, nodes), replace=False)] if faults else []
    plan = [
        Fault(
            kind=FAULT_KINDS[k % len(FAULT_KINDS)],
            node=n,
            gpu=None
            if FAULT_KINDS[k % len(FAULT_KINDS)] == "clock_limited_node"
            else int(rng.integers(0, 8)),
            onset_s=float(rng.uniform(1800.0, max(1900.0, hours * 3600.0 - 900.0))),
            magnitude=float(rng.uniform(0.10, 0.20)),
        )
        for k, n in enumerate(chosen)
    ]
    fleet = gen.Fleet(nodes, seed, interval=5.0, busy_start=bool(plan), long_jobs_on=set(chosen))
    scorer = stragglers.Scorer(settings)
    idx = np.array([scorer.slot(f"n{i}", g) for i in range(nodes) for g in range(8)])
    gpus = nodes * 8
    t, cost_s, steps = 0.0, 0.0, int(hours * 3600 / fleet.interval)
    last_episode: dict[tuple[str, int | None], float] = {}
    confirmed_before: set[tuple[str, int | None]] = set()
    episodes = 0
    for _ in range(steps):
        fleet.step()
        t += fleet.interval
        rd = fleet.readings()
        clock = rd["sm_clock_mhz"] / gen.SM_MAX
        power = rd["power_w"] / gen.P_DEFAULT
        reasons = rd["clocks_event_reasons"].astype(np.int64)
        link = np.zeros((nodes, 8), dtype=bool)
        for f in plan:
            if t < f.onset_s:
                continue
            if f.loaded_s is None and rd["util_gpu_pct"][f.node, f.gpu or 0] >= stragglers.LOAD_UTIL_PCT:
                f.loaded_s = t - f.onset_s
            cols = slice(None) if f.gpu is None else f.gpu
            if f.kind == "pcie_down_trained":
                link[f.node, cols] = rd["util_gpu_pct"][f.node, cols] >= stragglers.LOAD_UTIL_PCT
            else:
                clock[f.node, cols] *= 1 - f.magnitude
                power[f.node, cols] *= 1 - 0.7 * f.magnitude
                reasons[f.node, cols] |= 0x8
        started = time.process_time()
        scorer.observe_arrays(
            idx, rd["util_gpu_pct"].ravel(), clock.ravel(), power.ravel(), reasons.ravel(), link.ravel()
        )
        if scorer.due(t):
            job_of = _job_map(gen, fleet)
            scorer.score(t, job_of)
            cost_s += time.process_time() - started
            now_confirmed = set(scorer.stragglers)
            for key in now_confirmed - confirmed_before:
                node_i = int(key[0][1:])
                fault = next((f for f in plan if f.node == node_i and t >= f.onset_s), None)
                if fault is not None and _names(fault, key):
                    if fault.found_s is None:
                        fault.found_s = t - fault.onset_s
                    continue
                if fault is not None:
                    continue  # another GPU of a faulty node: not counted as healthy
                if t - last_episode.get(key, -math.inf) >= EPISODE_S:
                    episodes += 1
                    last_episode[key] = t
            confirmed_before = now_confirmed
        else:
            cost_s += time.process_time() - started
    healthy_node_s = nodes * hours * 3600.0 - sum(hours * 3600.0 - f.onset_s for f in plan)
    return {
        "seed": seed,
        "nodes": nodes,
        "hours": hours,
        "gpus": gpus,
        "false_episodes": episodes,
        "healthy_node_days": healthy_node_s / 86400.0,
        "faults": [dataclasses.asdict(f) for f in plan],
        "cpu_s": cost_s,
        "sim_s": hours * 3600.0,
    }


SIM_SCENARIO: Final = {
    "name": "bench-stragglers",
    "workload": {"training": 0.8, "inference": 0.1, "idle": 0.1},
    "job_nodes": (1, 8),
    "variation": {
        "split_share": 0.2,
        "iteration_period_s": (0.5, 10.0),
        "iteration_low_frac": (0.5, 0.9),
        "checkpoint_period_s": (1200.0, 2400.0),
        "checkpoint_s": (20.0, 180.0),
        "restarts_per_hour": (0.1, 1.0),
    },
}
"""healer's own simulator for ``--simulator``: jobs on 1 to 8 nodes (gangs of consecutive nodes), a
fifth of the single nodes split 4+4, training power oscillating every 0.5-10 s, checkpoints, restarts."""


def run_sim_seed(
    nodes: int, hours: float, seed: int, faults: int, settings: stragglers.Settings
) -> dict[str, Any]:
    """One run on healer's own simulator (``SIM_SCENARIO``) with ``faults`` clock-limited GPUs
    (``clock_limit``, 10-20 %, whose jobs wait for them, on every node of the job), as ``run_seed``."""
    from healer.sim import scenarios

    rng = np.random.default_rng(seed + 7919)
    chosen = [int(x) for x in rng.choice(nodes, size=min(faults, nodes), replace=False)] if faults else []
    plan = [
        Fault(
            kind="clock_limited_gpu",
            node=n,
            gpu=int(rng.integers(0, 8)),
            onset_s=float(rng.uniform(1800.0, max(1900.0, hours * 3600.0 - 900.0))),
            magnitude=float(rng.uniform(0.10, 0.20)),
        )
        for n in chosen
    ]
    entries = [
        {
            "kind": "clock_limit",
            "at_s": f.onset_s,
            "nodes": [f.node],
            "gpu": f.gpu,
            "params": {"drop": f.magnitude},
        }
        for f in plan
    ]
    sc = scenarios.Scenario.model_validate({**SIM_SCENARIO, "faults": entries})
    sim = scenarios.build(sc, nodes=nodes, gpus=8, seed=seed)
    fl = sim.fleet
    scorer = stragglers.Scorer(settings)
    names = [f"n{i}" for i in range(nodes)]
    keys = [(names[i], g) for i in range(nodes) for g in range(8)]
    idx = np.array([scorer.slot(*k) for k in keys])
    t, cost_s, steps, interval = 0.0, 0.0, int(hours * 3600 / 5.0), 5.0
    last_episode: dict[tuple[str, int | None], float] = {}
    confirmed_before: set[tuple[str, int | None]] = set()
    episodes = 0
    for _ in range(steps):
        sim.step(interval)
        t += interval
        util = fl.util
        for f in plan:
            if t >= f.onset_s and f.loaded_s is None and util[f.node, f.gpu or 0] >= stragglers.LOAD_UTIL_PCT:
                f.loaded_s = t - f.onset_s
        link = (fl.pcie_gen < fl.pcie_gen_max) | (fl.nvlink_up < fl.nvlink_total)
        started = time.process_time()
        scorer.observe_arrays(
            idx,
            util.ravel(),
            (fl.sm_clock / fl.sm_max).ravel(),
            (fl.power / fl.power_limit).ravel(),
            fl.reasons.ravel(),
            link.ravel().astype(np.float64),
        )
        if scorer.due(t):
            jobs = fl.job.ravel().tolist()
            job_of = {k: (None if j < 0 else f"j{j}") for k, j in zip(keys, jobs, strict=True)}
            scorer.score(t, job_of)
            cost_s += time.process_time() - started
            now_confirmed = set(scorer.stragglers)
            for key in now_confirmed - confirmed_before:
                node_i = int(key[0][1:])
                fault = next((f for f in plan if f.node == node_i and t >= f.onset_s), None)
                if fault is not None and _names(fault, key):
                    if fault.found_s is None:
                        fault.found_s = t - fault.onset_s
                    continue
                if fault is not None:
                    continue  # another GPU of a faulty node: not counted as healthy
                if t - last_episode.get(key, -math.inf) >= EPISODE_S:
                    episodes += 1
                    last_episode[key] = t
            confirmed_before = now_confirmed
        else:
            cost_s += time.process_time() - started
    healthy_node_s = nodes * hours * 3600.0 - sum(hours * 3600.0 - f.onset_s for f in plan)
    return {
        "seed": seed,
        "nodes": nodes,
        "hours": hours,
        "gpus": nodes * 8,
        "false_episodes": episodes,
        "healthy_node_days": healthy_node_s / 86400.0,
        "faults": [dataclasses.asdict(f) for f in plan],
        "cpu_s": cost_s,
        "sim_s": hours * 3600.0,
    }


def _names(fault: Fault, key: tuple[str, int | None]) -> bool:
    if fault.kind == "clock_limited_node":
        return True  # the node, or any of its GPUs (the rule folds them into one node incident)
    return key[1] == fault.gpu


def _job_map(gen: ModuleType, fleet: Any) -> dict[tuple[str, int], str | None]:
    out: dict[tuple[str, int], str | None] = {}
    for i, row in enumerate(fleet.slots):
        for k, slot in enumerate(row):
            # one job from its start to its end (a crash restart inside it keeps the job, as a requeue
            # keeps a Slurm job id): the generator makes a new parameter dict per job
            job = None if slot.mode == gen.IDLE else f"n{i}.{k}.{id(slot.job)}"
            for g in slot.gpus:
                out[(f"n{i}", g)] = job
    return out


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    episodes = sum(r["false_episodes"] for r in results)
    node_days = sum(r["healthy_node_days"] for r in results)
    faults = [f for r in results for f in r["faults"]]
    found = [f for f in faults if f["found_s"] is not None and f["found_s"] <= DETECT_S]
    loaded = [f for f in faults if f.get("loaded_s") is not None]
    found_loaded = [
        f for f in loaded if f["found_s"] is not None and f["found_s"] - f["loaded_s"] <= DETECT_S
    ]
    # no telemetry test can see a fault before the faulty GPU computes again (a job that ended, a restart)
    idle = [f for f in faults if f.get("loaded_s") is None or f["loaded_s"] > DETECT_S]
    upper = backtest.upper95(episodes, node_days / 1000.0) if node_days else None
    cpu_s = sum(r["cpu_s"] for r in results)
    sim_s = sum(r["sim_s"] for r in results)
    gpus = results[0]["gpus"] if results else 0
    share = cpu_s / sim_s if sim_s else 0.0
    by_kind = {
        kind: f"{sum(1 for f in found if f['kind'] == kind)}/{sum(1 for f in faults if f['kind'] == kind)}"
        for kind in FAULT_KINDS
    }
    return {
        "seeds": [r["seed"] for r in results],
        "healthy_node_days": round(node_days, 1),
        "false_stragglers": episodes,
        "false_per_1000_node_days": round(1000 * episodes / node_days, 2) if node_days else None,
        "false_per_1000_upper95": round(upper, 2) if upper is not None else None,
        "faults": len(faults),
        "found_within_5min": len(found),
        "found_share": round(len(found) / len(faults), 3) if faults else None,
        "found_share_lower95": round(lower95(len(found), len(faults)), 3) if faults else None,
        "found_by_kind": by_kind,
        "loaded_faults": len(loaded),
        "found_within_5min_of_load": len(found_loaded),
        "idle_through_5min": len(idle),
        "found_of_load_lower95": round(lower95(len(found_loaded), len(loaded)), 3) if loaded else None,
        "median_found_s": float(np.median([f["found_s"] for f in found])) if found else None,
        "cpu_share_of_a_core": round(share, 6),
        "cpu_share_at_10000_nodes": round(share * 80_000 / gpus, 4) if gpus else None,
    }


def main(
    generator: str | None,
    nodes: int,
    hours: float,
    seeds: list[int],
    faults: int,
    as_json: bool = False,
) -> int:
    """``generator`` None: healer's own simulator (``run_sim_seed``): a hypothesis, not an independent
    fleet."""
    import json

    settings = stragglers.Settings()
    if generator is None:
        results = [run_sim_seed(nodes, hours, s, faults, settings) for s in seeds]
        fleet = "healer's own simulator (multi-node jobs of 1-8 nodes; its physics, a hypothesis)"
    else:
        gen = load_generator(generator)
        results = [run_seed(gen, nodes, hours, s, faults, settings) for s in seeds]
        fleet = "shared independent H100 generator"
    summary = summarize(results)
    if as_json:
        print(json.dumps({"fleet": fleet, "summary": summary, "runs": results}, indent=2))
        return 0
    tuning = "tuning seeds (< 1000)" if all(s < 1000 for s in seeds) else "final seeds (>= 1000)"
    print(f"fleet: {fleet}, {nodes} nodes x {hours:g} h, seeds {seeds} ({tuning})")
    print(
        f"false stragglers: {summary['false_stragglers']} in {summary['healthy_node_days']} healthy node-days"
        f" ({summary['false_per_1000_node_days']} per 1,000;"
        f" 95 % upper bound {summary['false_per_1000_upper95']})"
    )
    if summary["faults"]:
        print(
            f"fail-slow faults found within 5 min, naming the GPU/node: {summary['found_within_5min']}/"
            f"{summary['faults']} (share {summary['found_share']}, 95 % lower bound"
            f" {summary['found_share_lower95']}); by kind {summary['found_by_kind']};"
            f" median {summary['median_found_s']} s after onset"
        )
        print(
            "counted from the faulty GPU's first loaded sample after onset:"
            f" {summary['found_within_5min_of_load']}/{summary['loaded_faults']}"
            f" (95 % lower bound {summary['found_of_load_lower95']});"
            f" {summary['idle_through_5min']} faults had no loaded sample within 5 min of onset"
        )
    print(
        f"scorer CPU: {summary['cpu_share_of_a_core']:.5f} of a core for {nodes} nodes"
        f" (scaled linearly to 10,000 nodes: {summary['cpu_share_at_10000_nodes']})"
    )
    return 0
