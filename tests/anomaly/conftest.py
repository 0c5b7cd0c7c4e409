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


@pytest.fixture(scope="session")
def overheat_lines(tmp_path_factory: pytest.TempPathFactory) -> list[bytes]:
    """healer's overheat scenario, 8 nodes x 40 min, as NodeFrame JSON lines: a node-wide inlet
    failure and cooling faults."""
    npz = tmp_path_factory.mktemp("overheat") / "overheat.npz"
    sim = scenarios.build(scenarios.load("overheat"), nodes=8, gpus=8, seed=5)
    recording.record(sim, npz, duration_s=40 * 60, interval_s=5.0)
    with recording.Recording(npz) as rec:
        return [data for _, frames in rec.frames() for _, data in frames]
