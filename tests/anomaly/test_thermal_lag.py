"""Temperature follows power through a first-order lag, learned per GPU from its own load changes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from healer.anomaly import thermal_lag


def simulate(
    r: np.ndarray, tau: np.ndarray, hours: float, seed: int, window_s: float = 30.0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-second physics, window means out: (temp, power, lagged power at the true tau), each
    (windows, gpus). Power steps between loads every few minutes; the inlet swings 1 °C slowly."""
    rng = np.random.default_rng(seed)
    g = len(r)
    steps = int(hours * 3600)
    levels = rng.choice([0.1, 0.5, 0.9], size=(steps // 240 + 1, g))
    p_lag = np.full(g, 0.1)
    temps, powers, lags = [], [], []
    acc_t, acc_p, acc_l = np.zeros(g), np.zeros(g), np.zeros(g)
    for t in range(steps):
        p = levels[t // 240]
        p_lag += (p - p_lag) * (1 - np.exp(-1.0 / tau))
        inlet = 30.0 + math.sin(2 * math.pi * t / 7200)
        acc_t += inlet + 5.0 + r * p_lag
        acc_p += p
        acc_l += p_lag
        if (t + 1) % int(window_s) == 0:
            temps.append(np.round(acc_t / window_s))  # whole degrees, as NVML reports
            powers.append(acc_p / window_s)
            lags.append(acc_l / window_s)
            acc_t, acc_p, acc_l = np.zeros(g), np.zeros(g), np.zeros(g)
    return np.array(temps), np.array(powers), np.array(lags)


def test_each_gpu_learns_its_own_resistance_and_time_constant_from_load_changes() -> None:
    r = np.array([20.0, 30.0, 45.0, 60.0])
    tau = np.array([10.0, 20.0, 40.0, 80.0])
    temp, power, true_lag = simulate(r, tau, hours=3, seed=1)
    fit = thermal_lag.LagFit(gpus=4)
    fit.ensure(["n0"])
    valid = np.ones((1, 4), dtype=bool)
    out = []
    for k in range(len(temp)):
        out.append(fit.step(temp[k][None], power[k][None], valid, 30.0, valid)[0])
    got_r = fit.resistance(1)[0]
    np.testing.assert_allclose(got_r, r, rtol=0.1)
    np.testing.assert_array_equal(fit.tau_s(1)[0], tau)
    # the lagged power the thermal fit compares with is the one the temperature followed
    late = np.array(out[len(out) // 2 :])
    assert np.abs(late - true_lag[len(out) // 2 :]).max() < 0.02
    # what a window after a load change leaves unexplained: far less than the raw power leaves
    resid_lag = temp[1:] - r * np.array(out[1:])
    resid_raw = temp[1:] - r * power[1:]
    lag_sd = np.std(np.diff(resid_lag, axis=0), axis=0)
    raw_sd = np.std(np.diff(resid_raw, axis=0), axis=0)
    assert np.all(lag_sd < 0.25 * raw_sd)


def test_a_gpu_that_has_not_moved_has_no_resistance_of_its_own_and_the_state_survives_a_restart() -> None:
    fit = thermal_lag.LagFit(gpus=2)
    fit.ensure(["n0"])
    valid = np.ones((1, 2), dtype=bool)
    for k in range(100):
        fit.step(np.array([[60.0, 61.0 + k % 2]]), np.array([[0.9, 0.9]]), valid, 30.0, valid)
    assert np.isnan(fit.resistance(1)).all()
    r = np.array([25.0, 50.0])
    temp, power, _ = simulate(r, np.array([20.0, 40.0]), hours=2, seed=2)
    for k in range(len(temp)):
        fit.step(temp[k][None], power[k][None], valid, 30.0, valid)
    doc = fit.export()
    again = thermal_lag.LagFit(gpus=2)
    assert again.import_(doc) == 1
    again.ensure(["n0"])  # restored when the node first reports
    np.testing.assert_allclose(again.resistance(1), fit.resistance(1))
    assert again.import_({"format": "other"}) == 0
    with pytest.raises(ValueError, match="GPUs"):
        thermal_lag.LagFit(gpus=4).import_(doc)
