"""`healer bench controller` end to end at toy scale: every figure it prints comes from a real run (the
speed itself is the benchmark's business, not a test's)."""

from __future__ import annotations

import pytest

from healer import bench


async def test_the_controller_benchmark_measures_every_figure_it_reports() -> None:
    report = await bench.run(
        nodes=40, seconds=1.0, latency_nodes=20, faults=2, rules_dir="rules", rounds=1, latency_shards=2,
        xid_events=3,
    )  # fmt: skip
    assert report.bare_frames_per_s > 0
    assert report.bare_frames_per_cpu_s > 0
    assert report.controller_frames_per_s > 0
    assert report.controller_frames_per_cpu_s > 0
    assert report.shard_of_2_fleet_frames_per_cpu_s > 0
    per_cpu = report.controller_frames_per_cpu_s / report.bare_frames_per_cpu_s
    assert report.ratio == pytest.approx(per_cpu, abs=0.01)
    assert report.latency_faults_detected == 2, "both faults, injected on shard 0's nodes, became actions"
    assert report.latency_frames_dropped == 0
    assert report.latency_p50_s is not None
    assert report.latency_p99_s is not None
    assert 0 < report.latency_p50_s <= report.latency_p99_s, "a latency runs forward from the fault"
    assert report.frame_bytes > 5000
    assert report.xid_acted == 3, "every XID on shard 0's nodes got its first action"
    assert report.xid_first_kinds == {"cordon": 3}
    assert report.xid_p50_s is not None
    assert report.xid_p99_s is not None
