"""Window features: counter increases across resets and gaps, peers, rates, and the two ingest paths
(columnar recording vs frame-by-frame FleetWindow) giving the same numbers."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

from healer.anomaly import dataset, features, window
from healer.schemas import codec, telemetry
from healer.sim import recording
from tests.anomaly import conftest


def test_counter_increase_treats_a_drop_as_a_reset_and_skips_missing_samples() -> None:
    values = np.array([[10.0], [np.nan], [14.0], [3.0], [5.0]])
    inc, last = features.counter_increase(values, np.array([8.0]))
    assert inc[:, 0].tolist() == [2.0, 0.0, 4.0, 3.0, 2.0]
    assert last.tolist() == [5.0]


def test_counter_increase_counts_nothing_without_a_previous_value() -> None:
    inc, _ = features.counter_increase(np.array([[7.0], [9.0]]), np.array([np.nan]))
    assert inc[:, 0].tolist() == [0.0, 2.0]


def test_grouped_counter_increase_matches_per_block_computation() -> None:
    rng = np.random.default_rng(0)
    blocks = [np.cumsum(rng.integers(0, 5, (n, 3)), axis=0).astype(float) for n in (4, 1, 6)]
    blocks[2][3] = 0.0  # a reset
    blocks[0][1, 2] = np.nan
    prev = np.array([[0.0, np.nan, 1.0], [np.nan] * 3, [2.0, 2.0, 2.0]])
    starts = np.array([0, 4, 5])
    inc, last = features.grouped_counter_increase(np.concatenate(blocks), starts, prev)
    for k, block in enumerate(blocks):
        want, want_last = features.counter_increase(block, prev[k])
        end = starts[k] + len(block)
        np.testing.assert_array_equal(inc[starts[k] : end], want)
        np.testing.assert_array_equal(last[k], want_last)


def test_node_peer_features_and_rates_have_their_units() -> None:
    sums = np.zeros((1, 4, len(features.CHANNELS)))
    n = 10.0
    for g, temp in enumerate([60.0, 62.0, 64.0, 80.0]):
        sums[0, g, :8] = [n, temp * n, 700 * n, 1.0 * n, 90 * n, 0.9 * n, 0, 0]
    sums[0, 3, 8 + 3] = 150  # 150 PCIe replays in a 300 s window
    feats, valid = features.window_features(sums, 300.0)
    col = {name: feats[0, :, i] for i, name in enumerate(features.BASE_FEATURES)}
    assert valid.all()
    assert col["node_temp_c"].tolist() == [63.0] * 4
    assert col["temp_node_dev_c"].tolist() == [-3.0, -1.0, 1.0, 17.0]
    assert col["pcie_replay_per_min"].tolist() == [0.0, 0.0, 0.0, 30.0]
    assert col["power_per_util_w_per_pct"][0] == pytest.approx(700 / 90)


def test_a_gpu_without_samples_is_invalid_and_left_out_of_its_node_median() -> None:
    sums = np.zeros((1, 3, len(features.CHANNELS)))
    sums[0, 0, :3] = [1, 50, 700]
    sums[0, 1, :3] = [1, 70, 700]
    feats, valid = features.window_features(sums, 300.0)
    assert valid[0].tolist() == [True, True, False]
    assert np.isnan(feats[0, 2]).all()
    assert feats[0, 0, features.BASE_FEATURES.index("node_temp_c")] == 60.0


@pytest.fixture(scope="module")
def pcie_recording(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("rec") / "pcie.npz"
    return conftest.record(path, "pcie", nodes=3, minutes=12, seed=5)


def test_frame_by_frame_window_gives_the_columnar_features(pcie_recording: pathlib.Path) -> None:
    columnar = dataset.from_recording(pcie_recording)
    fw = window.FleetWindow(gpus_per_node=8)
    with recording.Recording(pcie_recording) as rec:
        checked = 0
        for ts, frames in rec.frames():
            for _, data in frames:
                fw.observe(codec.decode_frame(data))
            hit = np.flatnonzero(np.abs(columnar.ts - (ts + 5.0)) < 1e-6)
            if len(hit):  # the window ending with this bucket is complete
                got, valid = fw.features(ts)
                np.testing.assert_array_equal(valid, columnar.valid[hit[0]])
                np.testing.assert_allclose(got, columnar.feats[hit[0]], rtol=1e-5, atol=1e-4)
                checked += 1
    assert checked >= 10
    rates = columnar.feats[..., features.BASE_FEATURES.index("pcie_replay_per_min")]
    assert rates.max() > 100  # the storm shows up as a rate


def _frame(ts: float, replays: int, gpus: tuple[int, ...] = tuple(range(8))) -> telemetry.NodeFrame:
    return telemetry.NodeFrame(
        node="n1",
        ts=ts,
        seq=int(ts),
        boot_id="b",
        agent_version="t",
        source="sim",
        gpus=[
            telemetry.GpuSample(
                index=g,
                model="NVIDIA H100 80GB HBM3",
                temp_c=60.0,
                power_w=500.0,
                power_default_w=700.0,
                util_gpu_pct=90.0,
                sm_clock_mhz=1980.0,
                sm_clock_max_mhz=1980.0,
                clocks_event_reasons=0,
                pcie_replay_count=replays,
            )
            for g in gpus
        ],
    )


def test_thinned_ingest_keeps_counter_increases_whole() -> None:
    fw = window.FleetWindow(gpus_per_node=8, min_interval_s=5.0)
    for t in range(300):
        fw.observe(_frame(1_000_020.0 + t, replays=2 * t))
    assert fw.skipped == 240
    feats, valid = fw.features(1_000_319.0)
    assert valid.all()
    rate = feats[0, 0, features.BASE_FEATURES.index("pcie_replay_per_min")]
    assert rate == pytest.approx(2 * 295 * 60 / 300)


def test_a_missing_gpu_is_not_scored_and_the_others_are() -> None:
    fw = window.FleetWindow(gpus_per_node=8)
    for t in range(0, 300, 5):
        fw.observe(_frame(1_000_020.0 + t, replays=0, gpus=(0, 1, 2, 4, 5, 6, 7)))
    _, valid = fw.features(1_000_319.0)
    assert valid[0].tolist() == [True, True, True, False, True, True, True, True]


def test_every_kind_of_gpu_view_fills_the_window_alike(pcie_recording: pathlib.Path) -> None:
    # the controller's strict decoder (a struct), the lax one (a pydantic model) and a view of another
    # class among them are read by different paths in ``observe``; the numbers must not depend on it
    class Plain:  # no energy_j: not in the GpuView protocol, read as missing
        def __init__(self, g: telemetry.GpuView) -> None:
            self.g = g

        def __getattr__(self, name: str) -> object:
            if name == "energy_j":
                raise AttributeError(name)
            return getattr(self.g, name)

    struct, model, mixed = (window.FleetWindow(gpus_per_node=8, min_interval_s=5.0) for _ in range(3))
    with recording.Recording(pcie_recording) as rec:
        for _, frames in rec.frames():
            for _, data in frames:
                struct.observe(codec.decode_frame_view(data))
                frame = codec.decode_frame(data)
                model.observe(frame)
                g3 = frame.gpus[3].model_copy(update={"energy_j": None})
                gpus = [*frame.gpus[:3], Plain(g3), *frame.gpus[4:]]
                mixed.observe(frame.model_copy(update={"gpus": gpus}))
                struct_gpu = codec.decode_frame_view(data).gpus[0]
                assert type(struct_gpu) is not type(frame.gpus[0])  # two classes, two ways of reading
    end = max(struct.latest_ts)
    a, b, c = (w.window_sums(end) for w in (struct, model, mixed))
    np.testing.assert_array_equal(a, b)
    energy = features.CHANNELS.index("energy_j")
    assert b[:, 3, energy].sum() > 0
    assert (c[:, 3, energy] == 0).all()  # GPU 3 read without its counter
    others = [k for k in range(8) if k != 3]
    np.testing.assert_array_equal(c[:, others], b[:, others])


def test_a_gpu_back_from_a_gap_counts_no_energy_over_the_gap() -> None:
    # a missing GPU's row has no time: its energy increase on return covers the whole gap (over the
    # 2-minute limit) and is left out, not read as that increase over the last few seconds
    def frame(ts: float, gpus: tuple[int, ...]) -> telemetry.NodeFrame:
        f = _frame(ts, replays=0, gpus=gpus)
        return f.model_copy(update={"gpus": [g.model_copy(update={"energy_j": 5.0 * ts}) for g in f.gpus]})

    fw = window.FleetWindow(gpus_per_node=8)
    t0 = 1_000_020.0
    for t in range(0, 600, 5):
        gone = 150 <= t < 450
        fw.observe(frame(t0 + t, gpus=(0, 1, 2, 4, 5, 6, 7) if gone else tuple(range(8))))
        if t % 30 == 25:
            fw.flush()  # as the scorer does at each scoring instant
    sums = fw.window_sums(t0 + 599)
    seconds = features.CHANNELS.index("energy_s")
    assert sums[0, 0, seconds] == pytest.approx(300.0)  # always there: every 5 s of the window
    # GPU 3 came back at t0 + 450 after 305 s unseen: the window holds the 145 s since, not the gap
    assert sums[0, 3, seconds] == pytest.approx(145.0)


def test_one_flush_of_more_buckets_than_the_ring_holds_keeps_only_the_ring() -> None:
    # scoring stalled for 20 minutes while frames came in: the older buckets have no slot left and
    # are dropped, not added into the newer buckets that share their slot
    t0 = 1_000_020.0
    stalled, scored = window.FleetWindow(gpus_per_node=8), window.FleetWindow(gpus_per_node=8)
    for t in range(0, 1200, 5):
        for fw in (stalled, scored):
            fw.observe(_frame(t0 + t, replays=0))
        if t % 30 == 25:
            scored.flush()
    np.testing.assert_array_equal(stalled.window_sums(t0 + 1199), scored.window_sums(t0 + 1199))
    samples = features.CHANNELS.index("samples")
    assert stalled.window_sums(t0 + 1199)[0, 0, samples] == 60  # 300 s at one frame per 5 s
    assert stalled.dropped == (1200 - 30 * stalled.slots) // 5
