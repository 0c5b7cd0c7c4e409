"""`healer bench controller` end to end at toy scale: every figure it prints comes from a real run (the
speed itself is the benchmark's business, not a test's)."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from healer.bus import embedded
from healer.bus import nats as natsbus
from healer.evals import controller_bench, frame_publisher


async def test_the_controller_benchmark_measures_every_figure_it_reports() -> None:
    """Each figure is there and sane; a comparison is made only between figures on one clock (wall with
    wall, CPU with CPU over the same window), so a loaded machine slows the run but cannot fail it."""
    report = await controller_bench.run(
        nodes=40, seconds=1.0, latency_nodes=20, faults=2, rules_dir="rules", rounds=1, latency_shards=2,
        xid_events=3, agent_xid_n=2,
    )  # fmt: skip
    assert report.nodes == 40
    assert report.frame_bytes > 5000
    assert report.bare_frames_per_s > 0
    assert report.bare_frames_per_cpu_s > 0
    assert report.controller_frames_per_s > 0
    assert report.controller_frames_per_cpu_s > 0
    assert report.controller_frames_dropped >= 0
    assert report.shard_of_2_fleet_frames_per_cpu_s > 0
    assert report.tick_mean_s > 0, "the controller ticked under the flood"
    per_cpu = report.controller_frames_per_cpu_s / report.bare_frames_per_cpu_s
    assert report.ratio == pytest.approx(per_cpu, abs=0.01), "CPU over CPU"
    per_wall = report.controller_frames_per_s / report.bare_frames_per_s
    assert report.ratio_wall == pytest.approx(per_wall, abs=0.01), "wall over wall"
    assert report.latency_faults_detected == 2, "both faults, injected on shard 0's nodes, became actions"
    assert report.latency_frames_dropped == 0
    assert report.latency_p50_s is not None
    assert report.latency_p99_s is not None
    assert 0 < report.latency_p50_s <= report.latency_p99_s, "a latency runs forward from the fault"
    assert report.latency_core is not None
    assert report.latency_frame_arrivals_core is not None
    assert 0 < report.latency_core <= (os.cpu_count() or 1), "a process's CPU per wall second"
    assert report.frame_arrivals_s == controller_bench.FRAME_ARRIVALS_S > 0
    assert 0 < report.latency_frame_arrivals_core < report.latency_core, "CPU time, part of the process's"
    assert report.xid_events == 3
    assert report.xid_acted == 3, "every XID on shard 0's nodes got its first action"
    assert report.xid_first_kinds == {"cordon": 3}
    assert report.xid_p50_s is not None
    assert report.xid_p99_s is not None
    assert 0 < report.xid_p50_s <= report.xid_p99_s
    assert report.agent_xid is not None, "--agent-xid 2: from the agents' NVML event to the cordon"
    assert (report.agent_xid["faults"], report.agent_xid["acted"]) == (2, 2)
    assert 0 < report.agent_xid["p50_s"] <= report.agent_xid["p99_s"]


async def test_the_spread_publisher_sends_each_second_over_the_second(
    nats_server: embedded.EmbeddedServer,
) -> None:
    """``--spread``: the paced fleet's frames arrive over the whole second (agents on their own clocks),
    not in one burst; by construction a round of 3 chunks takes at least 2/3 of its second."""
    nodes = 3 * frame_publisher.SPREAD_CHUNK
    arrivals: list[float] = []
    close = await natsbus.bare_subscriber(
        nats_server.url, "healer.telemetry.*", lambda _: arrivals.append(time.monotonic())
    )
    proc, queue = frame_publisher.start_publisher(nats_server.url, nodes, 1.5, 1.0, 0, 1, spread=True)
    try:
        await asyncio.to_thread(proc.join, 60)
        done = queue.get(timeout=10)
    finally:
        await close()
    assert done["sent"] >= nodes, "a whole round at least"
    first = arrivals[:nodes]
    assert len(first) == nodes
    assert first[-1] - first[0] >= 0.6, "the first round's frames spread over its second"
