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
  trained down to gen 3, and a whole node clock-limited by 10-20 %, from a drawn time; found when the
  scorer names the right GPU (or, for the node fault, the node or one of its GPUs) within 5 minutes of
  onset; the share with its exact 95 % lower bound. The onset is when the fault starts to slow a job:
  the first sample at or after the drawn time at which the faulty GPU's job computes, by the
  generator's own job state. A fail-slow fault is one that makes a job slow; drawn while the GPU is
  idle (its job ended, restarting, in a checkpoint) it slows nothing, and no telemetry can show it,
  until a job computes there. The old counting, from the drawn time, and the count from the first
  loaded sample (healer's own load threshold) are reported beside it;
- cost: the scorer's CPU time per simulated second, as a share of one core, and scaled to 10,000 nodes.

Seeds below 1000 are for tuning, 1000 and up for a final figure (the generator's README); the report
says which were used. ``--simulator`` runs healer's own simulator instead (``straggler_sim_eval``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import pathlib
import sys
import time
from types import ModuleType
from typing import Any

import numpy as np

from healer.controller.failslow import straggler_settings, stragglers
from healer.evals import backtest_figures, straggler_sim_eval
from healer.evals.straggler_tally import JOB_LEVEL_KINDS, Fault, Tally

DETECT_S = 300.0
FAULT_KINDS = ("clock_limited_gpu", "pcie_down_trained", "clock_limited_node")


def load_generator(path: str | pathlib.Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("h100_independent_gen", str(path))
    if spec is None or spec.loader is None:
        raise FileNotFoundError(f"{path}: not a Python file")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _within(f: dict[str, Any], start: str) -> bool:
    """Found within ``DETECT_S`` of the fault's ``start`` (``drawn_at``, ``onset_at``, ``loaded_at``)."""
    at = f.get(start)
    return at is not None and f["found_at"] is not None and f["found_at"] - at <= DETECT_S


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
    gen: ModuleType, nodes: int, hours: float, seed: int, faults: int, settings: straggler_settings.Settings
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
            drawn_at=float(rng.uniform(1800.0, max(1900.0, hours * 3600.0 - 900.0))),
            magnitude=float(rng.uniform(0.10, 0.20)),
        )
        for k, n in enumerate(chosen)
    ]
    fleet = gen.Fleet(nodes, seed, interval=5.0, busy_start=bool(plan), long_jobs_on=set(chosen))
    scorer = stragglers.Scorer(settings)
    idx = np.array([scorer.slot(f"n{i}", g) for i in range(nodes) for g in range(8)])
    gpus = nodes * 8
    t, cost_s, steps = 0.0, 0.0, int(hours * 3600 / fleet.interval)
    tally = Tally(plan)
    for _ in range(steps):
        fleet.step()
        t += fleet.interval
        rd = fleet.readings()
        clock = rd["sm_clock_mhz"] / gen.SM_MAX
        power = rd["power_w"] / gen.P_DEFAULT
        reasons = rd["clocks_event_reasons"].astype(np.int64)
        link = np.zeros((nodes, 8), dtype=bool)
        util = rd["util_gpu_pct"]
        for f in plan:
            if t < f.drawn_at:
                continue
            cols = slice(None) if f.gpu is None else f.gpu
            if f.loaded_at is None and util[f.node, f.gpu or 0] >= stragglers.LOAD_UTIL_PCT:
                f.loaded_at = t
            if f.onset_at is None and (fleet.mode[f.node, cols] == gen.TRAIN).any():
                f.onset_at = t  # the generator's own job state: the job computes on the faulty GPU(s)
            if f.kind == "pcie_down_trained":
                link[f.node, cols] = util[f.node, cols] >= stragglers.LOAD_UTIL_PCT
            else:
                clock[f.node, cols] *= 1 - f.magnitude
                power[f.node, cols] *= 1 - 0.7 * f.magnitude
                reasons[f.node, cols] |= 0x8
        started = time.process_time()
        scorer.observe_arrays(idx, util.ravel(), clock.ravel(), power.ravel(), reasons.ravel(), link.ravel())
        if scorer.due(t):
            scorer.score(t, _job_map(gen, fleet))
            cost_s += time.process_time() - started
            tally.window(t, set(scorer.stragglers))
        else:
            cost_s += time.process_time() - started
    healthy_node_s = nodes * hours * 3600.0 - sum(hours * 3600.0 - f.drawn_at for f in plan)
    return {
        "seed": seed,
        "nodes": nodes,
        "hours": hours,
        "gpus": gpus,
        "false_episodes": tally.episodes,
        "healthy_node_days": healthy_node_s / 86400.0,
        "faults": [dataclasses.asdict(f) for f in plan],
        "cpu_s": cost_s,
        "sim_s": hours * 3600.0,
    }


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


def counted(faults: list[dict[str, Any]], start: str, kinds: tuple[str, ...]) -> dict[str, Any]:
    """Faults named within ``DETECT_S`` of ``start`` (``drawn_at``, ``onset_at`` or ``loaded_at``): of
    those that have that start at least ``DETECT_S`` before their run's end (``end_at``), with the exact
    95 % lower bound of the share, per kind, and the median delay."""
    have = [f for f in faults if f.get(start) is not None and f[start] + DETECT_S <= f["end_at"]]
    found = [f for f in have if _within(f, start)]
    by_kind = {
        kind: f"{sum(1 for f in found if f['kind'] == kind)}/{sum(1 for f in have if f['kind'] == kind)}"
        for kind in kinds
    }
    return {
        "faults": len(have),
        "found": len(found),
        "share": round(len(found) / len(have), 3) if have else None,
        "lower95": round(lower95(len(found), len(have)), 3) if have else None,
        "by_kind": by_kind,
        "median_s": round(float(np.median([f["found_at"] - f[start] for f in found])), 1) if found else None,
        "without_start": sum(1 for f in faults if f.get(start) is None),
        "start_in_last_5min": sum(1 for f in faults if f.get(start) is not None) - len(have),
    }


def summarize(results: list[dict[str, Any]], kinds: tuple[str, ...] = FAULT_KINDS) -> dict[str, Any]:
    """Three countings of the same runs (docs/fail-slow.md, "Figures"): from the fault's onset (the first
    sample at which the faulty GPU's job computes: the target's), from the drawn time (the old counting:
    a fault drawn while its GPU is idle counts from then), and from its first loaded sample."""
    episodes = sum(r["false_episodes"] for r in results)
    node_days = sum(r["healthy_node_days"] for r in results)
    every = [{**f, "end_at": r["hours"] * 3600.0} for r in results for f in r["faults"]]
    faults = [f for f in every if f["kind"] not in JOB_LEVEL_KINDS]
    job_level = [f for f in every if f["kind"] in JOB_LEVEL_KINDS]
    upper = backtest_figures.upper95(episodes, node_days / 1000.0) if node_days else None
    cpu_s = sum(r["cpu_s"] for r in results)
    sim_s = sum(r["sim_s"] for r in results)
    gpus = results[0]["gpus"] if results else 0
    share = cpu_s / sim_s if sim_s else 0.0
    named = tuple(k for k in kinds if k not in JOB_LEVEL_KINDS)
    out: dict[str, Any] = {
        "seeds": [r["seed"] for r in results],
        "healthy_node_days": round(node_days, 1),
        "false_stragglers": episodes,
        "false_per_1000_node_days": round(1000 * episodes / node_days, 2) if node_days else None,
        "false_per_1000_upper95": round(upper, 2) if upper is not None else None,
        "faults": len(faults),
        "from_onset": counted(faults, "onset_at", named),
        "from_drawn": counted(faults, "drawn_at", named),
        "from_loaded": counted(faults, "loaded_at", named),
        "cpu_share_of_a_core": round(share, 6),
        "cpu_share_at_10000_nodes": round(share * 80_000 / gpus, 4) if gpus else None,
    }
    if any("computing_node_days" in r for r in results):
        out["computing_node_days"] = {
            name: round(sum(r["computing_node_days"][name] for r in results), 1)
            for name in results[0]["computing_node_days"]
        }
    if any("false_job_level" in r for r in results):
        out["false_job_level"] = sum(r.get("false_job_level", 0) for r in results)
    if job_level:
        out["job_level"] = {
            "faults": len(job_level),
            "named_nobody": sum(1 for f in job_level if not f["wrongly_named"]),
            "reported_from_steps": counted(job_level, "onset_at", tuple(sorted(JOB_LEVEL_KINDS))),
        }
    return out


def _line(name: str, c: dict[str, Any]) -> str:
    return (
        f"{name}: {c['found']}/{c['faults']} (share {c['share']}, 95 % lower bound {c['lower95']});"
        f" by kind {c['by_kind']}; median {c['median_s']} s"
    )


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

    settings = straggler_settings.Settings()
    kinds: tuple[str, ...] = FAULT_KINDS
    if generator is None:
        results = [straggler_sim_eval.run_sim_seed(nodes, hours, s, faults, settings) for s in seeds]
        fleet = (
            "healer's own simulator (jobs of 1-64 nodes, 4+4 split nodes, RDMA ports, pipeline stages,"
            " a heavier rank 0, step times; its physics, a hypothesis)"
        )
        kinds = straggler_sim_eval.SIM_KINDS
    else:
        gen = load_generator(generator)
        results = [run_seed(gen, nodes, hours, s, faults, settings) for s in seeds]
        fleet = "shared independent H100 generator"
    summary = summarize(results, kinds)
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
    if "computing_node_days" in summary:
        told = ", ".join(f"{k} {v}" for k, v in summary["computing_node_days"].items())
        print(f"  healthy node-days with a job computing: {told}")
    if summary["faults"]:
        onset = summary["from_onset"]
        print("fail-slow faults named (the GPU, or the node for a node fault) within 5 min:")
        print("  " + _line("of onset (the faulty GPU's job computes)", onset))
        print(
            f"    ({onset['without_start']} never had a job computing on the faulty GPU after the fault"
            f" began, {onset['start_in_last_5min']} only in the run's last 5 min: not counted)"
        )
        print("  " + _line("of the drawn time (old counting, all faults)", summary["from_drawn"]))
        loaded = summary["from_loaded"]
        print("  " + _line("of the first loaded sample", loaded))
    if "false_job_level" in summary:
        print(
            f"false job-level slowdowns (a job with no fault reported slower from its step times):"
            f" {summary['false_job_level']}"
        )
    if "job_level" in summary:
        jl = summary["job_level"]
        rep = jl["reported_from_steps"]
        print(
            f"job-level slowdowns (no culprit GPU): {jl['named_nobody']}/{jl['faults']} named nobody;"
            f" reported as a job-level slowdown from step times within 5 min of slowing their job by 5 %"
            f" or more: {rep['found']}/{rep['faults']} (95 % lower bound {rep['lower95']}; median"
            f" {rep['median_s']} s; {rep['without_start']} never slowed their job that much)"
        )
    print(
        f"scorer CPU: {summary['cpu_share_of_a_core']:.5f} of a core for {nodes} nodes"
        f" (scaled linearly to 10,000 nodes: {summary['cpu_share_at_10000_nodes']})"
    )
    return 0
