"""The recovery ladder's benefit on a simulated fleet: GPU-hours out of service per week with the ladder
against "cordon and wait for a person" (4 h and 24 h response), and time from fault to back in service.

Faults are drawn at the ``realistic`` scenario's rates (Llama 3, Table 5; healer/sim/scenarios/
realistic.yaml) on a fleet of ``--gpus`` GPUs (8 per node) for ``--weeks`` consecutive weeks; only the
kinds a ladder takes (healer/sim/repair.py ``ladder``) are counted, the rest are handled the same way
under both policies. Each fault walks the pure ladder (healer.controller.remediation.ladder) with the declared
ladders of rules/ladders.yaml and each GPU's own history (the "2 recoveries in 30 days" rule), and each
rung succeeds with the simulator's recovery model's odds. The whole node is out of service from the
fault until it returns (8 GPU-hours per hour).

Under "cordon and wait", containment is the same; then the node waits ``R`` hours for a person, who
then does exactly what the ladder would (same rungs, same durations, same odds): the difference is
the wait, and nothing else, so the comparison is generous to the person.

Durations (assumptions, flags): containment (drain + requeue) 10 min; reset 2 min; validation 12 min
(10 min quiet soak + ``dcgmi diag -r 1``); reboot 15 min (an HGX H100 boots slowly); return 1 min;
replacement 48 h once decided.

    .venv/bin/python benchmarks/recovery_week.py [--gpus 16384] [--weeks 52] [--seed 1]
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import statistics

import numpy as np
import yaml

from healer.controller.remediation import ladder
from healer.rules import loader, recovery
from healer.sim import repair

REPO = pathlib.Path(__file__).resolve().parents[1]
WEEK_H = 168.0


def quantile(values: list[float], q: float) -> float:
    return float(np.quantile(np.array(values), q)) if values else float("nan")


def walk(
    lad: recovery.Ladder,
    kind: str,
    fault_t: float,
    history: ladder.History,
    wait_s: float,
    rng: np.random.Generator,
    d: argparse.Namespace,
) -> tuple[float, ladder.LadderState]:
    """Seconds from the fault until the node is back (or replaced), and the final ladder state."""
    t = fault_t
    step = ladder.start(lad, incident_id="i", node="n", gpu_uuid="g", gpu_index=0, now=t)
    t += d.contain_min * 60 + wait_s
    step = ladder.next_step(step.state, ladder.Outcome.CONTAINED, t, history)
    fixed = False
    while step.kind not in (ladder.StepKind.NONE, ladder.StepKind.REPLACE):
        if step.kind == "reset_gpu":  # a rung: its kind's name
            t += d.reset_min * 60
            if repair.MODEL[kind].reset == 0.0:  # a lost GPU: the reset itself fails
                step = ladder.next_step(step.state, ladder.Outcome.FAILED, t, history)
                continue
            fixed = repair.fixed_by(kind, "reset_gpu", rng)
            outcome = ladder.Outcome.DONE
        elif step.kind == "reboot_node":
            t += d.reboot_min * 60
            fixed = repair.fixed_by(kind, "reboot_node", rng)
            outcome = ladder.Outcome.DONE
        elif step.kind is ladder.StepKind.VALIDATE:
            t += d.validate_min * 60
            outcome = ladder.Outcome.PASSED if fixed else ladder.Outcome.VALIDATION_FAILED
        else:  # RETURN_TO_SERVICE
            t += d.return_min * 60
            outcome = ladder.Outcome.RETURNED
        step = ladder.next_step(step.state, outcome, t, history)
    if step.kind is ladder.StepKind.REPLACE:
        t += d.replace_h * 3600
    return t - fault_t, step.state


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=16384)
    ap.add_argument("--weeks", type=int, default=52)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--contain-min", type=float, default=10.0)
    ap.add_argument("--reset-min", type=float, default=2.0)
    ap.add_argument("--validate-min", type=float, default=12.0)
    ap.add_argument("--reboot-min", type=float, default=15.0)
    ap.add_argument("--return-min", type=float, default=1.0)
    ap.add_argument("--replace-h", type=float, default=48.0)
    d = ap.parse_args()

    pack = loader.load_paths([REPO / "rules"])
    assert pack.ruleset is not None
    ladders = {lad.id: lad for lad in pack.ruleset.ladders}
    scenario = yaml.safe_load((REPO / "healer/sim/scenarios/realistic.yaml").read_text())
    rates = {e["kind"]: float(e["rate_per_gpu_hour"]) for e in scenario["random_faults"]}
    kinds = sorted(k for k in rates if repair.MODEL[k].ladder is not None)

    rng = np.random.default_rng(d.seed)
    horizon_s = d.weeks * WEEK_H * 3600
    faults: list[tuple[float, str, int]] = []
    for kind in kinds:
        n = int(rng.poisson(rates[kind] * d.gpus * WEEK_H * d.weeks))
        faults += [
            (float(t), kind, int(g))
            for t, g in zip(rng.uniform(0, horizon_s, n), rng.integers(0, d.gpus, n), strict=True)
        ]
    faults.sort()

    policies = {"ladder": 0.0, "wait 4 h": 4 * 3600.0, "wait 24 h": 24 * 3600.0}
    lost_h = dict.fromkeys(policies, 0.0)
    back: dict[str, dict[str, list[float]]] = {p: collections.defaultdict(list) for p in policies}
    endings: collections.Counter[tuple[str, str]] = collections.Counter()
    for name, wait_s in policies.items():
        histories: dict[int, ladder.History] = {}
        draw = np.random.default_rng(d.seed + 1)  # the same luck for every policy
        for fault_t, kind, gpu in faults:
            lad = ladders[str(repair.MODEL[kind].ladder)]
            history = histories.get(gpu, ladder.History())
            out_s, state = walk(lad, kind, fault_t, history, wait_s, draw, d)
            histories[gpu] = history.record(state)
            lost_h[name] += 8 * out_s / 3600.0
            back[name][kind].append(out_s / 3600.0)
            if name == "ladder":
                endings[(kind, state.phase.name.lower())] += 1

    print(
        f"fleet: {d.gpus} GPUs ({d.gpus // 8} nodes), {d.weeks} weeks, {len(faults)} ladder faults "
        f"({len(faults) / d.weeks:.1f} per week); seed {d.seed}\n"
    )
    print("| policy | GPU-hours out of service per week | vs ladder |")
    print("| --- | ---: | ---: |")
    for name in policies:
        per_week = lost_h[name] / d.weeks
        print(f"| {name} | {per_week:,.0f} | {per_week / (lost_h['ladder'] / d.weeks):.2f}x |")
    print(
        "\nTime from fault to back in service (hours; replacements included at "
        f"{d.replace_h:g} h), median / p95:\n"
    )
    print("| fault kind | faults | returned by the ladder | replaced | ladder | wait 4 h | wait 24 h |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for kind in kinds:
        n = len(back["ladder"][kind])
        cells = [
            f"{statistics.median(back[p][kind]):.2f} / {quantile(back[p][kind], 0.95):.1f}" for p in policies
        ]
        ret = endings[(kind, "returned")]
        rep = endings[(kind, "replacement")]
        print(f"| {kind} | {n} | {ret / n:.0%} | {rep / n:.0%} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
