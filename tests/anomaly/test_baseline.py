"""Per-GPU thermal baselines: a GPU that always ran hot is absorbed, a fresh rise is not, idle time is
ignored."""

from __future__ import annotations

import numpy as np
import pytest

from healer.anomaly import baseline


def test_a_gpu_that_always_runs_hot_is_absorbed_within_hours() -> None:
    b = baseline.GpuBaseline(gpus=2, tau_s=6 * 3600)
    residual = np.array([[8.0, 0.0]])
    busy = np.array([[0.9, 0.9]])
    for _ in range(int(24 * 3600 / 30)):
        b.update(residual, busy, 30.0)
    assert b.offset[0, 0] == pytest.approx(8.0 * (1 - np.exp(-4)), rel=1e-3)
    assert b.offset[0, 1] == 0.0


def test_a_rise_over_one_hour_keeps_most_of_its_size() -> None:
    steps = 120  # one hour of 30 s windows
    residual = np.linspace(0.0, 10.0, steps)[:, None, None]
    offsets = baseline.replay(residual, np.ones_like(residual), 30.0, 6 * 3600)
    assert residual[-1, 0, 0] - offsets[-1, 0, 0] > 0.9 * 10.0


def test_idle_and_unscored_windows_leave_the_baseline_alone() -> None:
    b = baseline.GpuBaseline(gpus=2, tau_s=3600)
    b.update(np.array([[5.0, np.nan]]), np.array([[0.1, 0.9]]), 600.0)
    assert b.offset.tolist() == [[0.0, 0.0]]


def test_replay_gives_each_window_the_baseline_from_before_it() -> None:
    residual = np.full((3, 1, 1), 6.0)
    offsets = baseline.replay(residual, np.ones_like(residual), 3600.0, 3600.0)
    assert offsets[0, 0, 0] == 0.0
    assert offsets[1, 0, 0] == pytest.approx(6.0 * (1 - np.exp(-1)))


def test_tau_zero_turns_it_off() -> None:
    b = baseline.GpuBaseline(gpus=1, tau_s=0)
    b.update(np.array([[5.0]]), np.array([[1.0]]), 30.0)
    assert b.offset.tolist() == [[0.0]]
