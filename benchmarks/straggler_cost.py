"""Fail-slow scorer cost: the share of one core that scoring 10,000 8-GPU nodes takes (#28).

Two paths, both at the controller's 1 s frame interval and the scorer's 60 s window:

- vectorised: ``Scorer.observe_arrays`` with the whole fleet's readings once a second, plus
  ``Scorer.score`` (medians/MADs per job, history, persistence) once a window: the scoring itself;
- per frame: ``FailSlow.observe(frame)`` as ingest calls it, one 8-GPU NodeFrame at a time (each
  node's frames folded every ``sample_every_s``, 5 s: the job index and the per-GPU fold in Python),
  measured on ``--frames`` 1 Hz frames of 2,000 nodes and scaled to 10,000 frames a second; once without
  RDMA ports (v1 frames) and once with ``--ports`` (8) ports a node (v2: the port watch folds them too);
- port test: ``PortWatch.window`` and ``PortTest.score`` once a window for 10,000 nodes with 8 ports in
  jobs of 1 to 64 nodes (1 % of the nodes with a congested port).

Prints CPU seconds per simulated second as a share of one core against the 5 % budget (a ratio, not a
timing test). Jobs: 8-GPU nodes in jobs of 1 to 64 nodes; 1 % of GPUs clock 15 % low.

    .venv/bin/python benchmarks/straggler_cost.py [--nodes 10000] [--windows 2] [--frames 20000]
"""

from __future__ import annotations

import argparse
import time
import types

import numpy as np

from healer.controller.failslow import detector, straggler_ports, stragglers
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


def per_frame(frames: int, ports: int = 0) -> float:
    fs = detector.FailSlow()
    port_docs = [
        {"device": f"mlx5_{p}", "port": 1, "rate_gbps": 400.0, "symbol_error": 0, "link_downed": 0,
         "port_rcv_errors": 0, "port_xmit_discards": 0, "local_link_integrity_errors": 0,
         "port_xmit_wait": 123_456, "port_xmit_data_bytes": 10**12, "port_rcv_data_bytes": 10**12}
        for p in range(ports)
    ]  # fmt: skip
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
        telemetry.NodeFrame.model_validate(
            {
                "schema": telemetry.SCHEMA_V2 if ports else telemetry.SCHEMA,
                "node": f"n{i}",
                "ts": 1.0 + k // nodes,
                "seq": k,
                "boot_id": "b",
                "agent_version": "t",
                "source": "sim",
                "gpus": gpus,
                **({"ports": port_docs} if ports else {}),
            }
        )
        for k in range(frames)
        for i in (k % nodes,)
    ]
    # Warm-up, not timed: every node's first frame makes its GPUs' slots, job index and port entries once
    # in a controller's life; counted here, it would weigh a tenth of the run (the steady state is what
    # costs a core). One sample interval earlier, so the timed frames fold as often as ever (every 5 s).
    every = fs.scorer.s.sample_every_s
    for f in made[:nodes]:
        fs.observe(f.model_copy(update={"ts": f.ts - every}))
    started = time.process_time()
    for f in made:
        fs.observe(f)
    return (time.process_time() - started) / frames


def port_window(nodes: int, windows: int, seed: int = 2) -> float:
    """CPU seconds per second of the port test for ``nodes`` nodes of 8 ports (a window every 60 s): the
    ports each node's last folded frame left (``PortWatch.observe``) read, compared and scored."""
    rng = np.random.default_rng(seed)
    watch, test = straggler_ports.PortWatch(), straggler_ports.PortTest()
    sizes = rng.integers(1, 65, nodes)
    job_nodes: dict[str, list[str]] = {}
    i = 0
    while i < nodes:
        job_nodes[f"job{i}"] = [f"n{n}" for n in range(i, min(nodes, i + int(sizes[i])))]
        i += int(sizes[i])
    congested = rng.random(nodes) < 0.01
    names = [f"n{n}" for n in range(nodes)]
    cpu = 0.0
    for w in range(windows + 1):
        t = 1.0 + 60.0 * w
        for n, name in enumerate(names):
            wait = int(t * (3e7 if congested[n] else 2e3))
            ports = [
                types.SimpleNamespace(
                    device=f"mlx5_{p}",
                    port=1,
                    rate_gbps=400.0,
                    port_xmit_wait=wait,
                    symbol_error=0,
                    link_downed=0,
                    port_rcv_errors=0,
                    port_xmit_discards=0,
                    local_link_integrity_errors=0,
                )
                for p in range(8)
            ]
            frame = types.SimpleNamespace(node=name, ts=t, ports=ports)
            started = time.process_time()
            watch.observe(frame)
            cpu += time.process_time() - started
        started = time.process_time()
        test.score(job_nodes, watch.window())
        cpu += time.process_time() - started
    return cpu / (windows * 60.0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--windows", type=int, default=2)
    ap.add_argument("--frames", type=int, default=20_000)
    ap.add_argument("--ports", type=int, default=8)
    a = ap.parse_args()
    share = vectorised(a.nodes, a.windows)
    frame_s = per_frame(a.frames)
    frame_share = frame_s * a.nodes
    ports_frame_s = per_frame(a.frames, a.ports)
    rows = [
        (f"vectorised scoring, {a.nodes} nodes at 1 Hz", share),
        (f"per-frame fold (ingest), scaled to {a.nodes}", frame_share),
        (f"per-frame fold with {a.ports} ports, scaled", ports_frame_s * a.nodes),
        (f"port test, {a.nodes} nodes x {a.ports} ports", port_window(a.nodes, a.windows)),
    ]
    print(f"{'path':<44} {'share of a core':>16} {'vs 5 % budget':>14}")
    for name, value in rows:
        print(f"{name:<44} {value:>16.4f} {value / BUDGET:>13.2f}x")
    print(f"({frame_s * 1e6:.1f} us per 8-GPU frame over {a.frames} frames)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
