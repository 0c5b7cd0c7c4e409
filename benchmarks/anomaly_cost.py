"""Anomaly scoring cost at fleet scale: N nodes x 8 GPUs (default 10,000 x 8), default model.

Prints, from one run: ingest cost per frame (``Scorer.observe``), the per-batch fold of one bucket of
frames into the rings (``flush``, N nodes x one frame per second for ``--bucket`` seconds), the scoring
call (window features + the thermal state's step and learning + the forest + calibration for every
GPU, timed on the scorer's second call, the first one that learns), and a bare numpy
pass over the same ring (one reduction of the window and one comparison per feature) so the model's
overhead shows as a ratio. The controller scores once per bucket (30 s by default), so the share of
one core is (flush + score) / bucket seconds, plus ingest x frames per second.

    .venv/bin/python benchmarks/anomaly_cost.py [--nodes 10000] [--model models/default] [--frames struct]

Frames are decoded as the controller decodes them (``--frames struct``: the strict decoder's structs,
``codec.decode_frame_view``) or as pydantic NodeFrames (``--frames model``: the lax path, and what rounds
before the seventh measured).
"""

from __future__ import annotations

import argparse
import pathlib
import time

import numpy as np

from healer.anomaly import cfar, features, scoring
from healer.schemas import codec, telemetry
from healer.sim import scenarios

REPO = pathlib.Path(__file__).resolve().parents[1]


def cpu(fn, *args):  # type: ignore[no-untyped-def]
    t = time.process_time()
    out = fn(*args)
    return time.process_time() - t, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--model", default=str(REPO / "models" / "default"))
    ap.add_argument("--calibration", choices=("on", "off"), default="on", help="per-pool thresholds (cfar)")
    ap.add_argument(
        "--variants", type=int, default=500, help="distinct simulated nodes whose frames are reused"
    )
    ap.add_argument(
        "--frames",
        choices=("struct", "model"),
        default="struct",
        help="decode frames as the controller does (struct) or as NodeFrame models",
    )
    args = ap.parse_args()

    calibration = cfar.CfarSettings() if args.calibration == "on" else None
    scorer = scoring.load(args.model, calibration=calibration)
    bucket_s = scorer.window.bucket_s
    sim = scenarios.build(scenarios.load("mixed"), nodes=args.variants, gpus=8, seed=1)
    sim.step(1.0)
    proto = [codec.decode_frame(data) for _, data in sim.frames()]
    frames: list[telemetry.FrameView] = [
        proto[i % len(proto)].model_copy(update={"node": f"node-{i:05d}"}) for i in range(args.nodes)
    ]
    if args.frames == "struct":
        frames = [codec.decode_frame_view(codec.encode(f)) for f in frames]
    t0 = 1_767_225_600.0
    # fill the window (untimed), one bucket at a time
    for b in range(round(scorer.window.window_s / bucket_s)):
        for s in range(0, int(bucket_s), 5):
            for f in frames:
                scorer.observe(f, at=t0 + b * bucket_s + s)
        scorer.window.flush()
    t1 = t0 + scorer.window.window_s
    # ingest: one bucket of 1 Hz frames
    n_obs = args.nodes * int(bucket_s)
    started = time.process_time()
    for s in range(int(bucket_s)):
        at = t1 + s
        for f in frames:
            scorer.observe(f, at=at)
    ingest_s = time.process_time() - started
    flush_s, _ = cpu(scorer.window.flush)
    # untimed: from the second scoring instant on, the thermal state learns too (scoring instants are
    # on the bucket grid, each scores the complete buckets before it)
    scorer.score_array(t1)
    score_s, scores = cpu(scorer.score_array, t1 + bucket_s)
    _, valid = scores
    # bare numpy: the window reduction and one comparison per feature over the same shapes
    ring = scorer.window._sums[: args.nodes]

    def bare() -> None:
        win = ring.sum(axis=1, dtype=np.float64)
        x = win[..., : len(features.BASE_FEATURES)]
        for k in range(x.shape[-1]):
            _ = x[..., k] > 1.0

    bare_s, _ = cpu(bare)
    gpus = args.nodes * 8
    batch_s = flush_s + score_s
    print(
        f"fleet: {args.nodes} nodes x 8 GPUs = {gpus} GPUs scored ({int(valid.sum())} valid), "
        f"frames as {type(frames[0].gpus[0]).__name__}"
    )
    print(f"ingest: {1e6 * ingest_s / n_obs:.1f} us per frame (observe), {n_obs} frames")
    print(f"flush of one {bucket_s:g} s bucket ({n_obs} frames): {flush_s * 1e3:.0f} ms")
    print(
        f"score (features + model, one batch): {score_s * 1e3:.0f} ms, {1e6 * score_s / gpus:.2f} us per GPU"
    )
    print(
        f"bare numpy pass over the same ring: {bare_s * 1e3:.1f} ms; score / bare = {score_s / bare_s:.0f}x"
    )
    share_batch = batch_s / bucket_s
    share_ingest = ingest_s / bucket_s
    print(
        f"one core at 1 Hz frames, scoring every {bucket_s:g} s: batch {100 * share_batch:.1f} %, "
        f"ingest {100 * share_ingest:.1f} %, total {100 * (share_batch + share_ingest):.1f} %"
    )
    print(f"ring memory: {scorer.window._sums.nbytes / 1e6:.0f} MB")


if __name__ == "__main__":
    main()
