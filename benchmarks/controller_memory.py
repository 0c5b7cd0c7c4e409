"""Controller memory at fleet scale: the rule engine (default rule pack: instant columns, window rings,
hysteresis) and the anomaly scorer (models/default) holding N nodes x 8 GPUs (default 12,500 x 8 =
100,000 GPUs), fed synthetic decoded frames straight from the strict decoder, no NATS.

Frames are the wire bytes of a simulated 8-GPU node (one per node, its name and readings varied),
decoded by ``codec.decode_frame_view`` as the controller does and ingested by ``Engine.ingest`` and
``Scorer.observe``; windows are filled across the longest window (ticks ``--step`` seconds apart),
then the process's peak RSS and the engine's own array bytes are reported, per node too. Also kept,
as ingest keeps it: each node's newest power limits (a dict per node).

    .venv/bin/python benchmarks/controller_memory.py [--nodes 12500] [--ticks 45] [--step 15]
"""

from __future__ import annotations

import argparse
import pathlib
import resource
import time

import orjson

from healer.anomaly import scoring
from healer.rules import engine, loader
from healer.schemas import codec, telemetry
from healer.sim import node_source

REPO = pathlib.Path(__file__).resolve().parents[1]
T0 = 1_700_000_000.0


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def templates(variants: int) -> list[dict[str, object]]:
    """Decoded-JSON frame documents of simulated nodes (the wire shape), to vary per node cheaply."""
    out = []
    for v in range(variants):
        gpus = node_source.SimSource(f"v{v}", gpus=8, seed=v).sample().gpus
        frame = telemetry.NodeFrame(
            node=f"v{v}", ts=T0, seq=0, boot_id="mem", agent_version="mem", source="sim",
            gpus_expected=8, gpus=gpus,
        )  # fmt: skip
        out.append(orjson.loads(codec.encode(frame)))
    return out


def wire(doc: dict[str, object], node: str, ts: float) -> bytes:
    return orjson.dumps({**doc, "node": node, "ts": ts})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=12_500)
    ap.add_argument("--ticks", type=int, default=45, help="ticks to fill the windows (default 45)")
    ap.add_argument("--step", type=float, default=15.0, help="seconds between ticks (default 15)")
    ap.add_argument("--no-model", action="store_true", help="leave the anomaly scorer out")
    args = ap.parse_args()
    base = rss_mib()
    rules = loader.load_paths([REPO / "rules"]).ruleset
    assert rules is not None
    eng = engine.Engine(rules, gpus_per_node=8, capacity=args.nodes)
    scorer = None if args.no_model else scoring.load(REPO / "models" / "default", gpus_per_node=8)
    loaded = rss_mib()
    docs = templates(16)
    names = [f"gpu-{i:05d}" for i in range(args.nodes)]
    power_limits: dict[str, tuple[float, dict[int, float | None]]] = {}
    started = time.process_time()
    for k in range(args.ticks):
        now = T0 + k * args.step
        for i, node in enumerate(names):
            frame = codec.decode_frame_view(wire(docs[i % len(docs)], node, now))
            eng.ingest(frame, at=now)
            if scorer is not None:
                scorer.observe(frame, at=now)
            power_limits[node] = (frame.ts, {g.index: g.power_limit_w for g in frame.gpus})
        eng.evaluate(now)
        if scorer is not None:
            scorer.score(now)
    cpu = time.process_time() - started
    peak = rss_mib()
    frames = args.nodes * args.ticks
    gpus = args.nodes * 8
    print(
        f"controller memory: {args.nodes} nodes x 8 GPUs = {gpus:,} GPUs, default rule pack "
        f"({len(rules.rules)} rules), anomaly model {'off' if scorer is None else 'models/default'}"
    )
    print(
        f"  {args.ticks} ticks {args.step:g} s apart ({args.ticks * args.step / 60:.0f} min of windows), "
        f"{frames:,} frames decoded and ingested in {cpu:.1f} CPU s ({frames / cpu:,.0f} frames/CPU s)"
    )
    print(
        f"  peak RSS                 : {peak:8.0f} MiB (interpreter + imports: {base:.0f} MiB, "
        f"+ rules and model: {loaded:.0f} MiB)"
    )
    print(f"  engine arrays            : {eng.memory_bytes() / 2**20:8.0f} MiB")
    print(f"  per node (peak RSS - imports, rules and model): {(peak - loaded) * 1024 / args.nodes:.1f} KiB")
    print(f"  under 2 GB               : {'yes' if peak < 2048 else 'NO'}")


if __name__ == "__main__":
    main()
