"""Backtests on recorded NodeFrames (``healer rules backtest``, ``healer model eval --recorded``), and
the parts of the model that learn this fleet's normal: the forest only corroborates, the thermal
baselines read the energy counter, nodes are compared with their peers."""

from __future__ import annotations

import gzip
import io
import json
import pathlib
import sys
from collections.abc import Mapping, Sequence

import numpy as np
import orjson
import pytest

from healer import cli
from healer.anomaly import features, thermal, window
from healer.anomaly import model as anomaly_model
from healer.evals import backtest, backtest_figures, backtest_input
from healer.schemas import codec, telemetry
from healer.sim import recording, scenarios


@pytest.fixture(scope="module")
def nvlink_lines(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, pathlib.Path, int]:
    """A gzip JSON-lines recording of healer's nvlink scenario (4 nodes, 25 min) with one bad line, its
    ground truth in the shared generator's --truth format, and the number of good frames."""
    d = tmp_path_factory.mktemp("bt")
    sim = scenarios.build(scenarios.load("nvlink"), nodes=4, gpus=8, seed=5)
    npz = d / "nvlink.npz"
    recording.record(sim, npz, duration_s=25 * 60, interval_s=5.0)
    good = 0
    with recording.Recording(npz) as rec, gzip.open(d / "frames.jsonl.gz", "wb") as out:
        truth = rec.truth()
        for k, (_, frames) in enumerate(rec.frames()):
            for _, data in frames:
                out.write(data + b"\n")
                good += 1
            if k == 3:
                out.write(b'{"schema": "healer.frame/1", "node": 7}\n')  # undecodable: counted, skipped
    rows = [
        {"kind": f["kind"], "node": f["node"], "gpu": f.get("gpu"), "onset_ts": f["start"]}
        for f in truth
        if f["kind"] == "nvlink_crc_rising"
    ]
    (d / "truth.json").write_text(json.dumps({"faults": rows}))
    return d / "frames.jsonl.gz", d / "truth.json", good


def test_rules_backtest_replays_a_gzip_recording_and_counts_what_it_could_not_read(
    nvlink_lines: tuple[pathlib.Path, pathlib.Path, int], capsys: pytest.CaptureFixture[str]
) -> None:
    path, truth, good = nvlink_lines
    assert cli.main(["rules", "backtest", str(path), "--truth", str(truth), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["frames"] == good
    assert sum(out["bad_frames"].values()) == 1
    assert out["models"] == {}
    kind = out["rules_per_kind"]["nvlink_crc_rising"]
    assert kind == {
        "faults": 1,
        "static_rule": "nvlink-crc-storm",
        "static_rule_caught": 1,
        "any_rule_caught": 1,
    }
    assert out["rules"]["nvlink-crc-storm"]["false"] == 0
    assert out["healthy_node_days"] == pytest.approx(3 * 25 / 1440 + 60 / 86400 * 0, rel=0.05, abs=0.01)


def test_model_eval_replays_standard_input_for_two_models_at_once(
    nvlink_lines: tuple[pathlib.Path, pathlib.Path, int],
    trained: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path, truth, good = nvlink_lines
    plain = gzip.decompress(path.read_bytes())
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(io.BytesIO(plain))))
    rc = cli.main(
        [
            "model",
            "eval",
            "--model",
            str(trained),
            "--compare",
            "models/default",
            "--recorded",
            "-",
            "--truth",
            str(truth),
            "--json",
            "--calibration",  # 25 minutes: every pool would still be in shadow (test_phase.py)
            "off",
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["frames"] == good
    assert set(out["models"]) == {str(trained), "models/default"}
    shipped = out["models"]["models/default"]
    assert shipped["per_kind"]["nvlink_crc_rising"]["caught"] == 1
    assert shipped["per_kind"]["nvlink_crc_rising"]["before_static"] == 1
    assert shipped["false_incidents"]["count"] == 0
    assert shipped["false_incidents"]["upper95_per_1000_node_days"] > 0


def test_the_text_form_names_each_model_rule_and_bound(
    nvlink_lines: tuple[pathlib.Path, pathlib.Path, int], capsys: pytest.CaptureFixture[str]
) -> None:
    path, truth, _ = nvlink_lines
    rc = cli.main(
        ["model", "eval", "--model", "models/default", "--recorded", str(path), "--truth", str(truth)]
    )
    assert rc == 0
    text = capsys.readouterr().out
    assert "model models/default" in text
    assert "95 % upper bound" in text
    assert "nvlink-crc-storm" in text


def test_a_truth_file_without_an_onset_is_refused(tmp_path: pathlib.Path) -> None:
    bad = tmp_path / "t.json"
    bad.write_text(json.dumps({"faults": [{"kind": "x", "node": "n"}]}))
    with pytest.raises(Exception, match="without kind, node or onset"):
        backtest_input.load_truth(bad)


def test_the_upper_bound_is_garwoods() -> None:
    assert backtest_figures.upper95(0, 1.0) == pytest.approx(3.689, abs=1e-3)
    assert backtest_figures.upper95(1, 1.0) == pytest.approx(5.572, abs=1e-3)
    assert backtest_figures.upper95(10, 2.0) == pytest.approx(18.390 / 2, abs=1e-3)
    assert backtest_figures.upper95(0, 0.0) is None
    assert backtest.SCORE_THRESHOLD == anomaly_model.SCORE_THRESHOLD


def test_the_tracker_holds_resolves_and_cools_down_as_the_rule_does() -> None:
    ep = backtest.Episodes(hold_s=60, resolve_below=0.6, resolve_s=60, cooldown_s=300)
    tr = backtest._Tracker(ep, 1)
    series = [0.95, 0.95, 0.95, 0.95, 0.5, 0.5, 0.5, 0.95, 0.95, 0.95, 0.95]
    opened = [
        t for t, v in zip(range(0, 30 * len(series), 30), series, strict=True) if tr.step(np.array([[v]]), t)
    ]
    assert opened == [60]  # held 60 s; resolved at 180 s; the second run falls in the cooldown
    assert tr.step(np.array([[0.95]]), 450) == []  # the second run, held since 210 s: cooling down
    assert tr.step(np.array([[0.95]]), 480) == [(0, 0)]  # ... and opens once the cooldown is over
    tr2 = backtest._Tracker(ep, 1)
    for t, v in ((0, 0.95), (30, 0.95), (60, 0.5), (90, 0.95), (120, 0.95)):
        assert tr2.step(np.array([[v]]), t) == []  # never held 60 s in a row


def test_the_forest_alone_never_reaches_the_level_it_only_corroborates() -> None:
    z = np.zeros(3)
    comps = {k: z.copy() for k in anomaly_model.COMPONENTS}
    comps["forest"] = np.array([9.0, 9.0, 0.2])
    comps["thermal_rise"] = np.array([0.0, 0.9, 0.9])
    out = anomaly_model.combine(comps, corroborate=True)
    assert out.tolist() == pytest.approx([0.0, 0.9 * anomaly_model.CORROBORATE_GAIN, 0.9])
    assert anomaly_model.combine(comps, corroborate=False).tolist() == pytest.approx([9.0, 9.0, 0.9])


def _frame(node: str, ts: float, power: float, energy: float) -> telemetry.FrameView:
    gpus = [
        {
            "index": g,
            "temp_c": 60.0,
            "power_w": power,
            "power_default_w": 700.0,
            "util_gpu_pct": 90.0,
            "sm_clock_mhz": 1900.0,
            "sm_clock_max_mhz": 1980.0,
            "energy_j": energy,
        }
        for g in range(8)
    ]
    return codec.decode_frame_view(orjson.dumps(_doc(node, ts, gpus)))


def _doc(node: str, ts: float, gpus: Sequence[Mapping[str, object]]) -> dict[str, object]:
    return {
        "schema": "healer.telemetry.v1",
        "node": node,
        "ts": ts,
        "seq": int(ts),
        "boot_id": "676a9a92-82e6-4cfa-41f6-301fbc0356e0",
        "agent_version": "test",
        "source": "sim",
        "gpus_expected": len(gpus),
        "gpus": gpus,
    }


def test_heat_comes_from_the_energy_counter_not_from_an_aliased_reading() -> None:
    fw = window.FleetWindow(window_s=300.0, bucket_s=30.0)
    energy = 1e6
    for k in range(80):  # 500 W true mean; the 5 s readings catch one phase of a square wave
        energy += 500.0 * 5.0
        fw.observe(_frame("n1", 1000.0 + 5 * k, 700.0 if k % 12 < 10 else 300.0, energy))
    base, valid = fw.features(1000.0 + 5 * 79 + 1)
    heat = base[0, :, features.BASE_FEATURES.index("heat_frac")]
    reading = base[0, :, features.BASE_FEATURES.index("power_frac")]
    assert valid.all()
    assert heat == pytest.approx(500.0 / 700.0, rel=0.02)
    assert abs(reading[0] - 500.0 / 700.0) > 0.1


def test_without_an_energy_counter_heat_is_the_mean_reading() -> None:
    fw = window.FleetWindow(window_s=300.0, bucket_s=30.0)
    for k in range(70):
        gpus: list[dict[str, object]] = [
            {"index": g, "temp_c": 60.0, "power_w": 350.0, "power_default_w": 700.0, "util_gpu_pct": 50.0}
            for g in range(8)
        ]
        fw.observe(codec.decode_frame_view(orjson.dumps(_doc("n1", 1000.0 + 5 * k, gpus))))
    base, _ = fw.features(1000.0 + 5 * 69 + 1)
    assert base[0, :, features.BASE_FEATURES.index("heat_frac")] == pytest.approx(0.5)


def test_a_node_far_hotter_than_its_peers_stands_out_from_the_first_window() -> None:
    n, g = 12, 8
    st = thermal.ThermalState(g, ["m"], [45.0])
    st.ensure([f"n{i}" for i in range(n)])
    rng = np.random.default_rng(1)
    cls = np.zeros((n, g), dtype=np.intp)
    power = np.full((n, g), 0.9)
    valid = np.ones((n, g), dtype=bool)
    inlet = 24.0 + rng.normal(0, 1.0, n)
    peer = None
    for k in range(10):
        room = 1.0 * k  # the whole room warms: every node moves, none stands out
        temp = (inlet + room)[:, None] + 45.0 * power + rng.normal(0, 0.5, (n, g))
        temp[3] += 20.0 if k >= 8 else 0.0  # node 3's inlet fails
        peer = st.step(temp, power, valid, cls, 1000.0 + 30 * k, 30.0 if k else 0.0).peer_z
        assert peer is not None
        if 3 <= k < 8:  # steady from the fourth window (thermal.ThermalSettings.steady_windows)
            # the edge is 6 robust standard deviations of the nodes' spread (the 3 °C floor is under
            # it here): a node 2-3 sd out reads about half of it
            assert np.abs(peer).max() < 0.75
    assert peer is not None
    assert peer[3, 0] > 1.5
    others = np.delete(peer[:, 0], 3)
    assert np.nanmax(np.abs(others)) < 0.5


def test_each_nodes_offset_from_its_peers_survives_a_restart() -> None:
    n, g = 10, 8
    st = thermal.ThermalState(g, ["m"], [45.0])
    names = [f"n{i}" for i in range(n)]
    st.ensure(names)
    cls = np.zeros((n, g), dtype=np.intp)
    power = np.full((n, g), 0.9)
    temp = (24.0 + np.arange(n, dtype=float))[:, None] + 45.0 * power + np.zeros((n, g))
    for k in range(8):
        st.step(temp, power, np.ones((n, g), dtype=bool), cls, 1000.0 + 30 * k, 30.0 if k else 0.0)
    assert np.abs(st.peer_off).max() > 0
    again = thermal.ThermalState(g, ["m"], [45.0])
    again.import_(orjson.loads(orjson.dumps(st.export())))
    again.ensure(names)
    assert again.peer_off.tolist() == pytest.approx(st.peer_off.tolist())


def test_rules_backtest_runs_the_fail_slow_part_as_the_controller_does(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """#39 item 7: the replay feeds the controller's fail-slow part, whose verdicts reach the pack's
    ``gpu-straggler`` rule: a clock-limited GPU of a multi-node job is caught, and nothing else is."""
    sc = scenarios.Scenario.model_validate(
        {
            "name": "one-slow-gpu",
            "models": {"H100": 1.0},
            "workload": {"training": 1.0},
            "job_nodes": 4,
            "faults": [
                {"kind": "clock_limit", "at_s": 120, "nodes": [2], "gpu": 6, "params": {"drop": 0.15}}
            ],
        }
    )
    sim = scenarios.build(sc, nodes=4, gpus=8, seed=5)
    npz = tmp_path / "slow.npz"
    recording.record(sim, npz, duration_s=12 * 60, interval_s=5.0)
    with recording.Recording(npz) as rec:
        truth = rec.truth()
        lines = [data for _, frames in rec.frames() for _, data in frames]
    (tmp_path / "frames.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    rows = [
        {"kind": "fail_slow", "node": f["node"], "gpu": f.get("gpu"), "onset_ts": f["start"]} for f in truth
    ]
    assert [(r["node"], r["gpu"]) for r in rows] == [(sim.fleet.node_names[2], 6)]
    (tmp_path / "truth.json").write_text(json.dumps({"faults": rows}))
    args = [
        "rules",
        "backtest",
        str(tmp_path / "frames.jsonl"),
        "--truth",
        str(tmp_path / "truth.json"),
        "--json",
    ]
    assert cli.main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rules_per_kind"]["fail_slow"]["static_rule"] == "gpu-straggler"
    assert out["rules_per_kind"]["fail_slow"]["static_rule_caught"] == 1
    assert out["rules"]["gpu-straggler"]["false"] == 0
    assert sum(v["false"] for v in out["rules"].values()) == 0
