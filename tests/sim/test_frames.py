"""Frames written straight from arrays are valid NodeFrames carrying the arrays' values; recordings
replay to the very same bytes."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from healer import errors
from healer.schemas import codec
from healer.sim import frames, recording, scenarios, simulation


def _sim(name: str = "mixed", nodes: int = 16) -> simulation.Simulation:
    return scenarios.build(scenarios.load(name), nodes=nodes, gpus=8, seed=5)


def test_frames_decode_as_node_frames_with_the_engine_values() -> None:
    sim = _sim()
    for _ in range(200):
        sim.step(5.0)
    fl = sim.fleet
    cols = {k: v.copy() for k, v in fl.columns().items()}
    seq_before = fl.seq.copy()
    out = sim.frames()
    assert len(out) == int((~fl.silent).sum())
    for n, data in out:
        frame = codec.decode_frame(data)
        assert frame.node == fl.node_names[n]
        assert frame.source == "sim"
        assert frame.seq == seq_before[n]
        assert frame.boot_id == fl.boot_id(n)
        assert frame.gpus_expected == 8
        assert frame.ts == pytest.approx(fl.t)
        assert [s.index for s in frame.gpus] == [g for g in range(8) if cols["present"][n, g]]
        for s in frame.gpus:
            g = s.index
            assert s.temp_c == round(float(cols["temp_c"][n, g]))
            assert s.power_w == pytest.approx(cols["power_w"][n, g], abs=0.051)
            assert s.energy_j == pytest.approx(cols["energy_j"][n, g], abs=0.001)
            assert s.util_gpu_pct == round(float(cols["util_gpu_pct"][n, g]))
            assert s.clocks_event_reasons == cols["clocks_event_reasons"][n, g]
            for name in frames.INT_FIELDS:
                assert getattr(s, name) == cols[name][n, g], name
            for name in frames.BOOL_FIELDS:
                assert getattr(s, name) == cols[name][n, g], name
            assert s.model == "NVIDIA H100 80GB HBM3" or s.model == "NVIDIA H200"
            assert s.uuid == fl.uuids[n][g]
    assert (fl.seq[~fl.silent] == seq_before[~fl.silent] + 1).all()


def test_a_lost_gpu_is_missing_from_its_frame_and_the_events_say_why() -> None:
    sim = _sim("fell-off-bus", nodes=2)
    sim.take_events()
    for _ in range(20):
        sim.step(5.0)
    (truth,) = sim.take_truth()
    decoded = [codec.decode_frame(b) for _, b in sim.frames()]
    frame = next(f for f in decoded if f.node == truth["node"])
    assert truth["gpu"] not in [s.index for s in frame.gpus]
    assert len(frame.gpus) == 7
    evts = [codec.decode_event(frames.encode_event(e)) for e in sim.take_events()]
    assert [(e.kind, e.xid, e.gpu_index) for e in evts] == [
        ("xid", 79, truth["gpu"]),
        ("gpu_lost", None, truth["gpu"]),
    ]


def test_events_are_valid_node_events_with_unique_ids() -> None:
    sim = _sim()
    for _ in range(150):
        sim.step(5.0)
    evts = [codec.decode_event(frames.encode_event(e)) for e in sim.take_events()]
    assert {e.kind for e in evts} >= {"agent_start", "xid", "gpu_lost"}
    assert len({e.id for e in evts}) == len(evts)


def test_a_recording_replays_to_the_same_frames_events_and_truth(tmp_path: pathlib.Path) -> None:
    live = _sim()
    live_frames, live_events, live_truth = [], live.take_events(), []
    for _ in range(300):
        live.step(2.0)
        live_events += live.take_events()
        live_truth += live.take_truth()
        live_frames.append((live.t, live.frames()))

    path = tmp_path / "rec.npz"
    writer = recording.record(
        _sim(), path, duration_s=600.0, interval_s=2.0, extra_meta={"scenario": "mixed"}
    )
    assert writer.steps == 300
    with recording.Recording(path) as rec:
        replayed = list(rec.frames())
        assert rec.events() == live_events
        assert rec.truth() == live_truth
        assert live_truth
        assert rec.meta["scenario"] == "mixed"
    assert len(replayed) == len(live_frames)
    for (ts_a, a), (ts_b, b) in zip(live_frames, replayed, strict=True):
        assert ts_a == ts_b
        assert a == b
    assert np.load(path)["c000000/temp_c.npy"].shape[1:] == (16, 8), "numpy opens it as an npz"


def test_a_file_that_is_not_a_recording_is_refused(tmp_path: pathlib.Path) -> None:
    bad = tmp_path / "x.npz"
    bad.write_bytes(b"not a zip")
    with pytest.raises(errors.PermanentError, match="not a readable simulator recording"):
        recording.Recording(bad)


@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    name=st.sampled_from(scenarios.builtin_names()),
    steps=st.integers(1, 40),
    dt=st.floats(0.05, 120.0),
    multiplier=st.sampled_from([1.0, 1e4]),
)
def test_any_scenario_seed_and_interval_gives_valid_frames_and_events(
    seed: int, name: str, steps: int, dt: float, multiplier: float
) -> None:
    sim = scenarios.build(scenarios.load(name), nodes=16, gpus=4, seed=seed, fault_rate_multiplier=multiplier)
    for _ in range(steps):
        sim.step(dt)
        for _, data in sim.frames():
            frame = codec.decode_frame(data)
            assert len(frame.gpus) <= 4
        for e in sim.take_events():
            codec.decode_event(frames.encode_event(e))
