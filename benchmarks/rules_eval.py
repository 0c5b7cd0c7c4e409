"""Rule engine cost at fleet scale: the default rule pack over N nodes x 8 GPUs (default 10,000 x 8).

Prints, from one run: ingest time per tick (N frames, queued and flushed), evaluation time per tick,
state memory, and a bare numpy pass over the same arrays (one comparison per instant column the rules
read, one reduction per window ring) so the engine's overhead shows as a ratio. ``--hot-pct`` of the
nodes run hot, so the thermal rule fires on their GPUs and the per-firing cost is included. Windows
are filled first (ticks 15 s apart across the longest window), then measured at 1 s ticks. Then the
same seconds with the rules without ``for`` read as frames arrive (``Engine.evaluate_frames``, ten times
a second over a tenth of the nodes each, as ``controller.frame_arrivals_s`` 0.1 s does with agents on
their own clocks) and the tick after: the second's cost both ways, as a ratio.

    .venv/bin/python benchmarks/rules_eval.py [--nodes 10000] [--ticks 10] [--hot-pct 1]
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import time

from healer.rules import baseline, engine, loader
from healer.schemas import telemetry

REPO = pathlib.Path(__file__).resolve().parents[1]
T0 = 1_700_000_000.0


def gpu_variants(gpus: int, variants: int, hot: int) -> list[list[telemetry.GpuSample]]:
    """Sets of GPU samples shared by many nodes (building 80k pydantic objects per tick would measure
    pydantic, not the engine); the first ``hot`` sets run at 88 C, so their nodes fire the thermal rule."""
    out = []
    for v in range(variants):
        values = baseline.healthy(None)
        values["temp_c"] = 88.0 if v < hot else 60.0 + v % 10
        out.append([telemetry.GpuSample(index=g, uuid=f"GPU-{v}-{g}", **values) for g in range(gpus)])
    return out


def frames(nodes: int, t: float, variants: list[list[telemetry.GpuSample]]) -> list[telemetry.NodeFrame]:
    return [
        telemetry.NodeFrame.model_construct(
            node=f"node-{i:05d}",
            ts=T0 + t,
            seq=int(t),
            boot_id="bench",
            agent_version="bench",
            source="sim",
            gpus_expected=8,
            gpus=variants[i % len(variants)],
        )
        for i in range(nodes)
    ]


def bare_pass(eng: engine.Engine, now: float) -> None:
    st = eng.state
    n = st.n
    for c in range(st.latest.shape[0]):
        _ = st.latest[c, :n] > 0.0
    for hist in st.history.values():
        for ring in hist.rings.values():
            _ = ring.data[:, :n].sum(axis=0)  # one pass over every bucket plane


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--ticks", type=int, default=10)
    ap.add_argument("--hot-pct", type=int, default=1, help="percent of nodes whose GPUs run hot (firing)")
    args = ap.parse_args()

    result = loader.load_paths([REPO / "rules"])
    assert result.ruleset is not None, [str(e) for e in result.errors]
    rules = result.ruleset
    eng = engine.Engine(rules, gpus_per_node=args.gpus, capacity=args.nodes)
    variants = gpu_variants(args.gpus, 100, args.hot_pct)
    longest = max(w for kinds in eng.state.needs.windows.values() for ws in kinds.values() for w in ws)

    t = 0.0
    while t <= longest:  # fill every window ring
        eng.ingest_many(frames(args.nodes, t, variants))
        eng.evaluate(T0 + t)
        t += 15.0

    ingest_s, eval_s, bare_s = [], [], []
    for _ in range(args.ticks):
        t += 1.0
        batch = frames(args.nodes, t, variants)
        start = time.perf_counter()
        eng.ingest_many(batch)
        eng.state.flush()
        ingest_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        fired = eng.evaluate(T0 + t)
        eval_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        bare_pass(eng, T0 + t)
        bare_s.append(time.perf_counter() - start)

    # The same seconds with the rules without ``for`` read as frames arrive (controller.frame_arrivals_s):
    # each second's frames in ten slices, each ingested and evaluated at once, then the tick.
    arrivals_s, arrival_tick_s, arrival_total_s = [], [], []
    for _ in range(args.ticks):
        t += 1.0
        batch = frames(args.nodes, t, variants)
        tenth = max(1, len(batch) // 10)
        start = time.perf_counter()
        spent = 0.0
        for k in range(0, len(batch), tenth):
            eng.ingest_many(batch[k : k + tenth])
            at = time.perf_counter()
            eng.evaluate_frames(T0 + t - 1.0 + (k + tenth) / len(batch))
            spent += time.perf_counter() - at
        at = time.perf_counter()
        eng.evaluate(T0 + t)
        arrival_tick_s.append(time.perf_counter() - at)
        arrival_total_s.append(time.perf_counter() - start)
        arrivals_s.append(spent)

    state_mb = eng.memory_bytes() / 2**20
    ev, ing, bare = statistics.median(eval_s), statistics.median(ingest_s), statistics.median(bare_s)
    rings = sum(len(h.rings) for h in eng.state.history.values())
    print(
        f"fleet: {args.nodes} nodes x {args.gpus} GPUs, {len(rules.rules)} rules "
        f"({len(rules.condition_rules)} condition, {len(rules.event_rules)} event)"
    )
    print(f"state: {len(eng.state.col)} instant columns, {rings} window rings, {state_mb:.1f} MiB")
    print(f"evaluate per tick (median of {args.ticks}): {ev * 1000:.1f} ms  ({len(fired)} firings reported)")
    print(f"ingest + flush per tick ({args.nodes} frames): {ing * 1000:.1f} ms")
    print(f"bare numpy pass over the same arrays: {bare * 1000:.1f} ms")
    print(f"ratio evaluate / bare pass: {ev / bare:.1f}x")
    arr, arr_tick, arr_total = (statistics.median(x) for x in (arrivals_s, arrival_tick_s, arrival_total_s))
    print(
        f"with frame arrivals (10 a second, a tenth of the nodes each): {arr * 1000:.1f} ms of arrival "
        f"evaluations (their frames' flush included) + {arr_tick * 1000:.1f} ms tick; the second in all "
        f"{arr_total * 1000:.1f} ms against {(ing + ev) * 1000:.1f} ms ingest + flush + evaluate without: "
        f"{arr_total / (ing + ev):.2f}x"
    )


if __name__ == "__main__":
    main()
