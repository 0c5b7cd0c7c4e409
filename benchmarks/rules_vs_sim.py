"""The default rule pack against the fleet simulator's fault scenarios: what fires, when, and where
nothing was wrong.

For each built-in scenario (``realistic`` excluded: it is long), a small fleet is simulated, its frames
and events go through the wire codec into the rule Engine exactly as the controller feeds it (actions
are not applied, so faults run their course), and each injected fault is matched to the rules that
fired on its node (and GPU) after it started. Rules firing on targets with no fault are listed as
false positives. One run, no assertions: a report to read next to the pack's unit tests.

    .venv/bin/python benchmarks/rules_vs_sim.py [--nodes 16] [--minutes 30] [--step 5]
"""

from __future__ import annotations

import argparse
import collections
import pathlib

import orjson

from healer.rules import engine, loader
from healer.schemas import codec
from healer.sim import scenarios

REPO = pathlib.Path(__file__).resolve().parents[1]


def run(name: str, nodes: int, minutes: float, step: float) -> None:
    result = loader.load_paths([REPO / "rules"])
    assert result.ruleset is not None
    eng = engine.Engine(result.ruleset)
    sim = scenarios.build(scenarios.load(name), nodes=nodes, seed=7)
    truth: list[dict[str, object]] = []
    fired: dict[tuple[str, str, int | None], float] = {}
    start = sim.t
    while sim.t - start < minutes * 60:
        sim.step(step)
        for _, data in sim.frames():
            eng.ingest(codec.decode_frame(data))
        for event in sim.take_events():
            eng.ingest_event(codec.decode_event(orjson.dumps(event)))
        truth += sim.take_truth()
        for f in eng.evaluate(sim.t):
            if f.status == "fired":
                fired.setdefault(f.key, sim.t)
    print(f"\n== {name}: {nodes} nodes x 8 GPUs, {minutes:g} min, {len(truth)} faults, {len(fired)} firings")
    explained: set[tuple[str, str, int | None]] = set()
    for fault in truth:
        node, gpu, t0 = str(fault["node"]), fault["gpu"], float(str(fault["start"]))
        hits = sorted(
            (t - t0, rule)
            for (rule, n, g), t in fired.items()
            if n == node and (g is None or gpu is None or g == gpu) and t >= t0
        )
        explained |= {
            (r, n, g) for (r, n, g) in fired if n == node and (g is None or gpu is None or g == gpu)
        }
        where = f"{node}/gpu{gpu}" if gpu is not None else node
        seen = ", ".join(f"{rule} +{delay:.0f}s" for delay, rule in hits) or "NOTHING FIRED"
        print(f"  {fault['kind']:<22} {where:<14} -> {seen}")
    stray = collections.Counter(rule for key in fired if key not in explained for rule in [key[0]])
    print(f"  false positives: {dict(stray) or 'none'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--step", type=float, default=5.0)
    ap.add_argument(
        "scenarios", nargs="*", default=[n for n in scenarios.builtin_names() if n != "realistic"]
    )
    args = ap.parse_args()
    for name in args.scenarios:
        run(name, args.nodes, args.minutes, args.step)


if __name__ == "__main__":
    main()
