"""Fail-slow scorer cost: the share of one core that scoring 10,000 8-GPU nodes takes (#28).

Two paths, both at the controller's 1 s frame interval and the scorer's 60 s window:

- vectorised: ``Scorer.observe_arrays`` with the whole fleet's readings once a second, plus
  ``Scorer.score`` (medians/MADs per job, history, persistence) once a window: the scoring itself;
- per frame: ``FailSlow.observe(frame)`` as ingest calls it, one 8-GPU NodeFrame at a time (each
  node's frames folded every ``sample_every_s``, 5 s: the job index and the per-GPU fold in Python),
  measured on ``--frames`` 1 Hz frames of 2,000 nodes and scaled to 10,000 frames a second.

Prints CPU seconds per simulated second as a share of one core against the 5 % budget (a ratio, not a
timing test). Jobs: 8-GPU nodes in jobs of 1 to 64 nodes; 1 % of GPUs clock 15 % low.

    .venv/bin/python benchmarks/straggler_cost.py [--nodes 10000] [--windows 2] [--frames 20000]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from healer.controller import stragglers
from healer.schemas import telemetry

BUDGET = 0.05


def vectorised(nodes: int, windows: int, seed: int = 1) -> float:
    rng = np.random.default_rng(seed)
    scorer = stragglers.Scorer()
    gpus = nodes * 8
    idx = np.array([scorer.slot(f"n{i}", g) for i in range(nodes) for g in range(8)])
    sizes = rng.integers(1, 65, nodes)
    job_of: dict[tuple[str, int], str | None] = {}
    i = 0
    while i < nodes:
        size = int(sizes[i])
        for n in range(i, min(nodes, i + size)):
            for g in range(8):
                job_of[(f"n{n}", g)] = f"job{i}"
        i += size
    slow = rng.random(gpus) < 0.01
    link = np.zeros(gpus, dtype=bool)
    reasons = np.zeros(gpus, dtype=np.int64)
    cpu = 0.0
    t = 0.0
    for _ in range(windows * 60):
        util = np.clip(rng.normal(97, 3, gpus), 0, 100)
        clock = np.clip(rng.normal(0.93, 0.01, gpus), 0, 1) * np.where(slow, 0.85, 1.0)
        power = np.clip(rng.normal(0.9, 0.03, gpus), 0, 1) * np.where(slow, 0.9, 1.0)
        t += 1.0
        started = time.process_time()
        scorer.observe_arrays(idx, util, clock, power, reasons, link)
        if scorer.due(t):
            scorer.score(t, job_of)
        cpu += time.process_time() - started
    return cpu / (windows * 60)


def per_frame(frames: int) -> float:
    fs = stragglers.FailSlow()
    gpus = [
        telemetry.GpuSample(
            index=g,
            util_gpu_pct=98.0,
            sm_clock_mhz=1845.0,
            sm_clock_max_mhz=1980.0,
            power_w=690.0,
            power_limit_w=700.0,
            clocks_event_reasons=4,
            pcie_gen=5,
            pcie_gen_max=5,
            jobs=["4711"],
        )
        for g in range(8)
    ]
    nodes = 2000  # 1 Hz frames of 2,000 nodes, second after second (the cost per frame hardly depends on it)
    made = [
        telemetry.NodeFrame(
            node=f"n{i}", ts=1.0 + k // nodes, seq=k, boot_id="b", agent_version="t", source="sim", gpus=gpus
        )
        for k in range(frames)
        for i in (k % nodes,)
    ]
    started = time.process_time()
    for f in made:
        fs.observe(f)
    return (time.process_time() - started) / frames


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--windows", type=int, default=2)
    ap.add_argument("--frames", type=int, default=20_000)
    a = ap.parse_args()
    share = vectorised(a.nodes, a.windows)
    frame_s = per_frame(a.frames)
    frame_share = frame_s * a.nodes
    rows = [
        (f"vectorised scoring, {a.nodes} nodes at 1 Hz", share),
        (f"per-frame fold (ingest), scaled to {a.nodes}", frame_share),
    ]
    print(f"{'path':<44} {'share of a core':>16} {'vs 5 % budget':>14}")
    for name, value in rows:
        print(f"{name:<44} {value:>16.4f} {value / BUDGET:>13.2f}x")
    print(f"({frame_s * 1e6:.1f} us per 8-GPU frame over {a.frames} frames)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
