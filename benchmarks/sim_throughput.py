"""Simulator throughput: node-frames per second per core, in record mode and in live mode.

Record mode: ``recording.record`` of the ``mixed`` scenario for fleets of several sizes (physics,
faults and compressed columnar writes; no JSON). Live mode: a ``LiveFleet`` of N nodes on a real
nats-server started for the run, ticked back to back; one tick = one interval's work (step, encode N
NodeFrames as JSON, publish them). Reported: wall and CPU seconds of this process per tick, and the
number of nodes one core could drive at a 1 s interval at that cost. Targets (issue 3): live >= 2,000
nodes at 1 Hz on one core; record >= 50,000 node-frames/s.

    .venv/bin/python benchmarks/sim_throughput.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import tempfile
import time

from healer.agent import sim_fleet
from healer.bus import embedded, subjects
from healer.bus import nats as natsbus
from healer.sim import recording, scenarios

RECORD_TARGET = 50_000
LIVE_TARGET_NODES = 2_000


def bench_record(nodes: int, sim_s: float, tmp: pathlib.Path) -> float:
    sim = scenarios.build(scenarios.load("mixed"), nodes=nodes, gpus=8, seed=1)
    cpu0, t0 = time.process_time(), time.perf_counter()
    writer = recording.record(sim, tmp / f"r{nodes}.npz", duration_s=sim_s, interval_s=1.0)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    rate = writer.frames / cpu
    size_mb = (tmp / f"r{nodes}.npz").stat().st_size / 1e6
    print(
        f"record  {nodes:5d} nodes x 8 GPUs, {sim_s / 3600:.2f} sim-h: {writer.frames:8d} node-frames "
        f"in {wall:6.2f} s wall / {cpu:6.2f} s CPU = {rate:9.0f} node-frames/s/core "
        f"({rate / RECORD_TARGET:.1f}x target), {size_mb:.1f} MB, "
        f"fleet-day in {86400 * nodes / rate / 60:.1f} min"
    )
    return rate


async def bench_live(nodes: int, ticks: int, url: str) -> float:
    subj = subjects.Subjects("bench")
    bus = await natsbus.NatsBus.connect(url, name="bench")
    sim = scenarios.build(scenarios.load("mixed"), nodes=nodes, gpus=8, seed=1, start_ts=time.time())
    fleet = sim_fleet.LiveFleet(sim, bus, subj, interval_s=1.0)
    sim.take_events()  # no events stream on this prefix: measure the frame path
    await fleet.start()
    await fleet.tick(1.0)
    cpu0, t0 = time.process_time(), time.perf_counter()
    for _ in range(ticks):
        await fleet.tick(1.0)
        sim.take_events()
    await bus.flush()
    wall, cpu = (time.perf_counter() - t0) / ticks, (time.process_time() - cpu0) / ticks
    await fleet.close()
    await bus.close()
    capacity = nodes / max(wall, cpu)
    print(
        f"live    {nodes:5d} nodes x 8 GPUs at 1 Hz: {wall * 1e3:6.1f} ms wall / "
        f"{cpu * 1e3:6.1f} ms CPU per tick "
        f"= {cpu:.0%} of a core; one core drives ~{capacity:,.0f} nodes at 1 Hz "
        f"({capacity / LIVE_TARGET_NODES:.1f}x target)"
    )
    return capacity


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller runs")
    args = parser.parse_args()
    sim_s = 600.0 if args.quick else 1800.0
    with tempfile.TemporaryDirectory() as d:
        tmp = pathlib.Path(d)
        for nodes in (100, 500, 2000):
            bench_record(nodes, sim_s if nodes < 2000 else sim_s / 4, tmp)
        with embedded.EmbeddedServer(tmp / "nats") as srv:
            for nodes in (2000, 5000):
                asyncio.run(bench_live(nodes, 10 if args.quick else 30, srv.url))


if __name__ == "__main__":
    main()
