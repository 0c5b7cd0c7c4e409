"""The controller's API: observe frames cheaply, score the fleet in one batch, as {node: {gpu: score}}."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

from healer.anomaly import scoring
from healer.schemas import codec
from healer.sim import recording
from tests.anomaly import conftest


def test_scorer_flags_the_overheating_gpu_from_frames(trained: pathlib.Path, tmp_path: pathlib.Path) -> None:
    rec_path = conftest.record(tmp_path / "o.npz", "overheat", nodes=4, minutes=25, seed=7)
    scorer = scoring.load(trained)
    last = 0.0
    next_score: float | None = None
    peak: dict[tuple[str, int], float] = {}
    with recording.Recording(rec_path) as rec:
        last_5min = float(rec.meta["start_ts"]) + 20 * 60
        truth = [t for t in rec.truth() if t["kind"] == "cooling_degradation"]
        for ts, frames in rec.frames():
            for _, data in frames:
                scorer.observe(codec.decode_frame(data))
            last = ts
            next_score = ts + 30 if next_score is None else next_score
            if ts >= next_score:  # the controller's cadence: one batch every 30 s
                scored = scorer.score(ts)
                next_score += 30
                if ts > last_5min:
                    for node, per_gpu in scored.items():
                        for g, v in per_gpu.items():
                            peak[(node, g)] = max(peak.get((node, g), 0.0), v)
    scores = scorer.score(last)
    assert sorted(scores) == sorted(rec.node_names)
    assert all(set(gpus) == set(range(8)) for gpus in scores.values())
    for t in truth:  # in the last five minutes the GPU is past 87 °C and throttling
        mine = peak[(t["node"], t["gpu"])]
        assert mine >= 0.75  # only the wide fleet check watches it: it never had a baseline of its own
        assert max(v for (n, g), v in peak.items() if n == t["node"] and g != t["gpu"]) < mine
    assert scorer.last_cost_s > 0
    explained = scorer.explain(truth[0]["node"], truth[0]["gpu"])
    assert explained["component"] in ("thermal_gpu", "thermal_rise", "forest")
    assert explained["anomaly_score"] == round(scores[truth[0]["node"]][truth[0]["gpu"]], 4)
    top = float(explained[f"component_{explained['component']}"])  # 1.0 = this component alone scores 0.9
    assert explained["anomaly_score"] == pytest.approx(
        0.9 * top if top <= 1 else 1 - 0.1 * np.exp(1 - top), abs=1e-3
    )
    assert scorer.explain("no-such-node", 0) == {}


def test_a_node_that_stopped_sending_is_not_scored(trained: pathlib.Path, tmp_path: pathlib.Path) -> None:
    rec_path = conftest.record(tmp_path / "h.npz", "healthy", nodes=2, minutes=6, seed=4)
    scorer = scoring.load(trained)
    with recording.Recording(rec_path) as rec:
        for _, frames in rec.frames():
            for node, data in frames:
                scorer.observe(codec.decode_frame(data))
                end = codec.decode_frame(data).ts
                del node
    arr, valid = scorer.score_array(end)
    assert valid.all()
    later = scorer.score(end + 3600)
    assert later == {name: {} for name in scorer.window.node_names}
    assert np.all((arr >= 0) & (arr <= 1))


def test_an_empty_fleet_is_scored_without_broadcasting_the_thermal_state() -> None:
    """Regression: a controller with the model ticks before any frame has arrived. The thermal state
    was stepped with a (0,) class index against (0, gpus) sums and raised ValueError on every tick."""
    scorer = scoring.load_or_null("models/default", gpus_per_node=8)
    assert isinstance(scorer, scoring.Scorer)
    assert scorer.score(1000.0) == {}
    assert scorer.score(1001.0) == {}
    assert scorer.last_thermal is not None
    assert scorer.last_thermal.rise_c.shape == (0, 8)
