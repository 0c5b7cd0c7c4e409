"""Per-GPU thermal baselines: a GPU is learned from its own first busy minutes, a GPU that always ran hot
is absorbed from the start, a fresh rise is not, idle time is ignored, and a GPU is not compared with
its own past until it has one."""

from __future__ import annotations

import numpy as np
import pytest

from healer.anomaly import baseline

HOUR_S = 3600.0


def _feed(b: baseline.GpuBaseline, residual: list[float], power: list[float], seconds: float) -> None:
    for _ in range(round(seconds / 30)):
        b.update(np.array([residual]), np.array([power]), 30.0)


def test_a_new_gpu_is_not_ready_until_it_has_been_watched_busy_for_init_s() -> None:
    b = baseline.GpuBaseline(gpus=2, tau_s=6 * HOUR_S, init_s=900.0)
    _feed(b, [8.0, 8.0], [0.9, 0.2], 870.0)
    assert b.ready.tolist() == [[False, False]]
    assert np.isnan(b.offset(np.array([[0.9, 0.9]]))).all()
    _feed(b, [8.0, 8.0], [0.9, 0.2], 30.0)
    assert b.ready.tolist() == [[True, False]]  # the idle GPU has seen nothing yet


def test_a_gpu_that_always_runs_hot_is_its_own_baseline_once_ready() -> None:
    b = baseline.GpuBaseline(gpus=2, tau_s=6 * HOUR_S, init_s=900.0)
    _feed(b, [8.0, 0.0], [0.9, 0.9], 900.0)
    # learned from the GPU itself, not pulled towards the fleet (0) for hours
    assert b.offset(np.array([[0.9, 0.9]]))[0].tolist() == pytest.approx([8.0, 0.0])


def test_the_excess_is_learned_per_unit_of_power() -> None:
    b = baseline.GpuBaseline(gpus=1, tau_s=6 * HOUR_S, init_s=900.0)
    _feed(b, [4.0], [0.5], 900.0)  # 4 °C too hot at half power
    assert b.offset(np.array([[1.0]]))[0, 0] == pytest.approx(8.0)  # is 8 °C at full power


def test_a_rise_after_the_first_minutes_keeps_most_of_its_size() -> None:
    steps = 120  # one hour of 30 s windows, after 15 minutes flat
    flat = np.zeros(30)
    residual = np.concatenate([flat, np.linspace(0.0, 10.0, steps)])[:, None, None]
    offsets = baseline.replay(residual, np.ones_like(residual), 30.0, 6 * HOUR_S, 900.0)
    assert residual[-1, 0, 0] - offsets[-1, 0, 0] > 0.9 * 10.0


def test_after_init_the_baseline_follows_slowly() -> None:
    b = baseline.GpuBaseline(gpus=1, tau_s=6 * HOUR_S, init_s=900.0)
    _feed(b, [0.0], [1.0], 900.0)
    _feed(b, [6.0], [1.0], 6 * HOUR_S)
    assert b.offset(np.array([[1.0]]))[0, 0] == pytest.approx(6.0 * (1 - np.exp(-1)), rel=1e-2)


def test_idle_and_unscored_windows_leave_the_baseline_alone() -> None:
    b = baseline.GpuBaseline(gpus=2, tau_s=HOUR_S, init_s=0.0)
    b.update(np.array([[5.0, np.nan]]), np.array([[0.1, 0.9]]), 600.0)
    assert b.rate.tolist() == [[0.0, 0.0]]
    assert b.busy_s.tolist() == [[0.0, 0.0]]


def test_replay_gives_each_window_the_baseline_from_before_it() -> None:
    residual = np.full((3, 1, 1), 6.0)
    offsets = baseline.replay(residual, np.ones_like(residual), 600.0, HOUR_S, 600.0)
    assert np.isnan(offsets[0, 0, 0])  # nothing seen yet
    assert offsets[1, 0, 0] == pytest.approx(6.0)


def test_tau_zero_turns_it_off() -> None:
    b = baseline.GpuBaseline(gpus=1, tau_s=0, init_s=0.0)
    b.update(np.array([[5.0]]), np.array([[1.0]]), 30.0)
    assert b.ready.tolist() == [[False]]
