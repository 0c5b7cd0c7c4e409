"""`healer bench burst` at toy scale: every figure it reports comes from a real run on a real nats-server
(the speed itself is the benchmark's business, not a test's)."""

from __future__ import annotations

import pathlib

from healer import testing
from healer.evals import burst_bench


async def test_the_burst_benchmark_times_every_node_through_both_stages(tmp_path: pathlib.Path) -> None:
    result = await burst_bench.fresh_server_burst(
        6, testing.RecordingActuator, "recording", tmp_path, fleet=60, timeout_s=60.0
    )
    assert result.n == 6
    assert result.contained.done == 6, "every node of the burst contained"
    assert result.contained.statuses == {"done": 6}
    assert result.ladders.done == 6, "every node's ladder started"
    assert result.contained.p50_s is not None
    assert result.contained.all_s is not None
    assert result.ladders.p50_s is not None
    assert 0 < result.contained.p50_s <= result.contained.all_s
    assert result.ladders.all_s is not None
    assert result.contained.all_s < result.ladders.all_s, "a ladder starts once its node is contained"
    assert result.cpu_s > 0
    assert "published: NVSentinel" in burst_bench.table([result])
    assert burst_bench.victims(4, 60) == ["gpu-00000", "gpu-00015", "gpu-00030", "gpu-00045"]
