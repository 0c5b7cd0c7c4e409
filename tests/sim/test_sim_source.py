"""SimSource is the one-node view of the fleet simulator behind the TelemetrySource Protocol."""

from __future__ import annotations

import pytest

from healer import errors
from healer.sim import node_source
from healer.telemetry import source


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _run(src: source.TelemetrySource, clock: FakeClock, seconds: int) -> list[source.Sample]:
    samples = [src.sample()]
    for _ in range(seconds):
        clock.now += 1.0
        samples.append(src.sample())
    return samples


def test_sim_source_reports_every_gpu_and_a_power_cap_cools_it() -> None:
    clock = FakeClock()
    src: source.TelemetrySource = node_source.SimSource("node-a", gpus=4, seed=1, clock=clock)
    src.open()
    hot = _run(src, clock, 300)[-1]
    assert [g.index for g in hot.gpus] == [0, 1, 2, 3]
    assert hot.gpus[0].power_w is not None
    assert hot.gpus[0].power_w > 550
    src.set_power_limit(0, 300.0)
    assert src.power_limits(0).current_w == 300.0
    capped = _run(src, clock, 300)
    cool = capped[-1]
    assert cool.gpus[0].temp_c is not None
    assert hot.gpus[0].temp_c is not None
    assert cool.gpus[0].temp_c < hot.gpus[0].temp_c - 10
    assert all((s.gpus[0].power_w or 0) < 320 for s in capped)
    assert any((s.gpus[0].clocks_event_reasons or 0) & 0x4 for s in capped)
    with pytest.raises(errors.PermanentError):
        src.set_power_limit(0, 50.0)
    src.close()


def test_sim_source_with_a_scenario_loses_the_gpu_and_reports_the_events() -> None:
    clock = FakeClock()
    src = node_source.SimSource("node-b", gpus=8, seed=2, clock=clock, scenario="fell-off-bus")
    assert all(s.events == [] for s in _run(src, clock, 30))
    clock.now += 60.0
    sample = src.sample()
    assert len(sample.gpus) == 7
    assert [(e.kind, e.xid) for e in sample.events] == [("xid", 79), ("gpu_lost", None)]
    assert all(e.node == "node-b" for e in sample.events)


def test_sim_source_is_deterministic_per_node_name() -> None:
    a, b = (node_source.SimSource("same", gpus=2, clock=FakeClock()) for _ in range(2))
    assert a.sample().gpus == b.sample().gpus
