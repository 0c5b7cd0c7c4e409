"""Small recordings and a small trained model, built once per test session (seconds, not minutes)."""

from __future__ import annotations

import pathlib

import pytest

from healer.anomaly import dataset, training
from healer.anomaly import model as anomaly_model
from healer.sim import recording, scenarios

SETTINGS = anomaly_model.TrainSettings(n_estimators=30, max_rows=5_000, seed=3)


def record(path: pathlib.Path, scenario: str, *, nodes: int, minutes: float, seed: int) -> pathlib.Path:
    sim = scenarios.build(scenarios.load(scenario), nodes=nodes, gpus=8, seed=seed)
    recording.record(sim, path, duration_s=minutes * 60, interval_s=5.0)
    return path


@pytest.fixture(scope="session")
def healthy_recording(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return record(tmp_path_factory.mktemp("rec") / "healthy.npz", "healthy", nodes=8, minutes=60, seed=11)


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory, healthy_recording: pathlib.Path) -> pathlib.Path:
    out = tmp_path_factory.mktemp("model") / "small"
    training.train([dataset.from_recording(healthy_recording)], out, SETTINGS, "test")
    return out
