"""The two thermal checks: a GPU that runs hot all its life is left alone from the scorer's first minutes,
one that gets hotter than it used to be is caught by ``thermal_rise`` well before the fleet check."""

from __future__ import annotations

import pathlib
import statistics

import numpy as np
import pytest

from healer.anomaly import dataset, diagnosis, features, persist
from healer.anomaly import model as anomaly_model
from tests.anomaly import conftest

TEMP = features.BASE_FEATURES.index("temp_c")
TEMP_DEV = features.BASE_FEATURES.index("temp_node_dev_c")


@pytest.fixture(scope="module")
def unseen(tmp_path_factory: pytest.TempPathFactory) -> dataset.Windows:
    path = tmp_path_factory.mktemp("own") / "h.npz"
    return dataset.from_recording(conftest.record(path, "healthy", nodes=4, minutes=60, seed=21))


def _hotter(w: dataset.Windows, node: int, gpu: int, extra_c: np.ndarray) -> dataset.Windows:
    """The same windows with one GPU ``extra_c`` (per window) hotter than it was."""
    feats = w.feats.copy()
    feats[:, node, gpu, TEMP] += extra_c
    feats[:, node, gpu, TEMP_DEV] += extra_c
    return dataset.Windows(w.ts, feats, w.valid, w.node_names, w.models, w.source)


def _edges(m: anomaly_model.Model) -> tuple[float, float]:
    """°C above the fleet (thermal_gpu) and above the GPU's own baseline (thermal_rise) that reach 0.9."""
    c = m.calib
    return (
        c["threshold"] * c["q_thermal_gpu"] * c["gpu_scale"] + c["gpu_median"],
        c["threshold"] * c["q_thermal_rise"] * c["rise_scale"] + c["rise_median"],
    )


def _busy_gpu(w: dataset.Windows) -> tuple[int, int]:
    power = w.feats[..., features.BASE_FEATURES.index("power_frac")]
    busy = np.where(w.valid, power, 0.0).min(axis=0)
    node, gpu = np.unravel_index(int(np.argmax(busy)), busy.shape)
    assert busy[node, gpu] >= 0.5, "the test needs a GPU busy for the whole hour"
    return int(node), int(gpu)


def test_the_fleet_edge_is_never_narrower_than_the_fleet_tail(trained: pathlib.Path) -> None:
    m, _ = persist.load(trained)
    tail_z = statistics.NormalDist().inv_cdf(1.0 - m.settings.level_tail)
    assert m.calib["level_z"] == pytest.approx(tail_z)
    assert m.calib["q_thermal_gpu"] >= tail_z
    fleet_edge_c, rise_edge_c = _edges(m)
    assert rise_edge_c < fleet_edge_c / 1.5  # a GPU is measured more finely against itself


def test_a_gpu_hot_all_its_life_does_not_alert_from_the_start(
    trained: pathlib.Path, unseen: dataset.Windows
) -> None:
    m, _ = persist.load(trained)
    fleet_edge_c, rise_edge_c = _edges(m)
    node, gpu = _busy_gpu(unseen)
    extra = max(0.8 * fleet_edge_c, 2 * rise_edge_c)  # beyond what thermal_rise would let pass
    assert extra < fleet_edge_c
    scored = diagnosis.score_windows(m, _hotter(unseen, node, gpu, np.full(len(unseen.ts), extra)))
    assert scored.components["thermal_gpu"][:, node, gpu].max() < 1.0
    assert scored.components["thermal_rise"][:, node, gpu].max() < 1.0
    assert not np.isnan(scored.own_offset_c[-1, node, gpu])  # it has a baseline by the end


def test_a_gpu_getting_hotter_is_caught_by_its_own_baseline_first(
    trained: pathlib.Path, unseen: dataset.Windows
) -> None:
    m, _ = persist.load(trained)
    fleet_edge_c, rise_edge_c = _edges(m)
    node, gpu = _busy_gpu(unseen)
    minutes = (unseen.ts - unseen.ts[0]) / 60
    ramp = np.clip(minutes - 20, 0, None) * (0.9 * fleet_edge_c / 40)  # from 20 min, 0.9 x edge at 60
    scored = diagnosis.score_windows(m, _hotter(unseen, node, gpu, ramp))
    rise = scored.components["thermal_rise"][:, node, gpu]
    level = scored.components["thermal_gpu"][:, node, gpu]
    assert rise[-1] >= 1.0
    assert level.max() < 1.0
    caught = int(np.argmax(rise >= 1.0))
    assert ramp[caught] < 1.5 * rise_edge_c  # within the rise check's edge (plus what it absorbed)
