"""The fail-slow scorer's own-history reference (controller/failslow/own_history.py)."""

from __future__ import annotations

import numpy as np
import pytest

from healer.controller.failslow import own_history


def test_the_reference_is_the_median_of_the_latest_windows_learned_per_slot() -> None:
    rng = np.random.default_rng(7)
    h = own_history.OwnHistory(span=5, alpha=0.05)
    h.grow(3)
    seen: list[list[float]] = [[], [], []]
    for _ in range(12):
        learn = rng.random(3) < 0.7
        clock = rng.uniform(0.8, 1.0, 3)
        h.learn(learn, clock, clock / 2)
        for i in np.flatnonzero(learn).tolist():
            seen[i].append(float(clock[i]))
    ref_clock, ref_power = h.reference(3)
    for i in range(3):
        assert ref_clock[i] == pytest.approx(np.median(seen[i][-5:]), rel=1e-6)
        assert ref_power[i] == pytest.approx(np.median(seen[i][-5:]) / 2, rel=1e-6)
    assert h.count.tolist() == [len(x) for x in seen]


def test_a_restarted_slot_forgets_its_past_and_the_others_keep_theirs() -> None:
    h = own_history.OwnHistory(span=4, alpha=0.05)
    h.grow(2)
    for v in (0.9, 0.9, 1.0):
        h.learn(np.array([True, True]), np.array([v, v]), np.array([v, v]))
    h.restart(np.array([1]))
    clock, _ = h.reference(2)
    assert clock[0] == pytest.approx(0.9)
    assert np.isnan(clock[1])
    h.learn(np.array([False, True]), np.array([0.0, 0.7]), np.array([0.0, 0.7]))
    clock, _ = h.reference(2)
    assert clock.tolist() == pytest.approx([0.9, 0.7])
    assert h.count.tolist() == [3, 1]


def test_span_zero_is_the_exponentially_weighted_mean() -> None:
    h = own_history.OwnHistory(span=0, alpha=0.5)
    h.grow(1)
    for v in (1.0, 0.0, 0.0):
        h.learn(np.array([True]), np.array([v]), np.array([v]))
    clock, _ = h.reference(1)
    assert clock[0] == pytest.approx(0.25)
