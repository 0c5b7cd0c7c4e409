"""Training is reproducible, scores stay in [0, 1] and low on healthy GPUs, and faulty GPUs score high."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

from healer.anomaly import dataset, persist, training
from healer.anomaly import model as anomaly_model
from healer.evals import model_eval as evaluation
from tests.anomaly import conftest


def _scores(m: anomaly_model.Model, w: dataset.Windows) -> np.ndarray:
    _, _, scores = evaluation.model_incidents(m, w, hold_s=600)
    return scores


def test_same_data_and_seed_give_the_same_model(
    healthy_recording: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    w = dataset.from_recording(healthy_recording)
    a, _ = training.train([w], tmp_path / "a", conftest.SETTINGS, "test")
    b, _ = training.train([w], tmp_path / "b", conftest.SETTINGS, "test")
    assert a.calib == b.calib
    np.testing.assert_array_equal(_scores(a, w), _scores(b, w))


def test_healthy_gpus_on_unseen_seed_stay_below_the_threshold(
    trained: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    m, _ = persist.load(trained)
    rec = conftest.record(tmp_path / "h.npz", "healthy", nodes=4, minutes=30, seed=99)
    scores = _scores(m, dataset.from_recording(rec))
    assert scores.min() >= 0.0
    assert scores.max() <= 1.0
    assert np.mean(scores >= anomaly_model.SCORE_THRESHOLD) < 0.01


def test_degrading_cooling_scores_high_and_its_healthy_neighbours_do_not(
    trained: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    m, _ = persist.load(trained)
    rec = conftest.record(tmp_path / "o.npz", "overheat", nodes=4, minutes=25, seed=7)
    w = dataset.from_recording(rec)
    from healer.sim import recording

    with recording.Recording(rec) as r:
        truth = [t for t in r.truth() if t["kind"] == "cooling_degradation"]
    scores = _scores(m, w)
    assert truth
    for t in truth:
        node = w.node_names.index(t["node"])
        last = scores[-10:]  # the last five minutes: the GPU is past 87 °C and throttling
        assert last[:, node, t["gpu"]].max() >= anomaly_model.SCORE_THRESHOLD
        others = [g for g in range(8) if g != t["gpu"]]
        assert last[:, node, others].max() < last[:, node, t["gpu"]].max()


def test_components_are_scaled_so_one_is_the_edge_of_healthy(trained: pathlib.Path) -> None:
    m, card = persist.load(trained)
    assert card["calibration"]["threshold"] >= m.settings.threshold_margin
    assert anomaly_model.to_score(np.array([m.calib["threshold"]]), m.calib["threshold"])[0] == pytest.approx(
        0.9
    )
    assert anomaly_model.to_score(np.array([1e9]), 1.0)[0] <= 1.0
