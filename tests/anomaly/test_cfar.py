"""A constant false-alarm rate: thresholds from the watched fleet's own tail, shadow until calibrated."""

from __future__ import annotations

import json
import math
import pathlib

import numpy as np
import pytest

from healer import cli
from healer.anomaly import cfar

NODE = cfar.DECIDING.index("thermal_node")


def test_the_tail_fit_recovers_an_exponential_scale() -> None:
    levels = cfar.LEVELS[(cfar.LEVELS >= 1.0) & (cfar.LEVELS <= 20.0)]
    counts = np.round(1e5 * np.exp(-(levels - levels[0]) / 2.0))
    sigma, xi = cfar.gpd_fit(levels, counts)
    assert xi <= 0.1
    assert sigma == pytest.approx(2.0, rel=0.15)


def test_a_quiet_component_keeps_the_models_own_edge() -> None:
    fit = cfar.threshold_for(cfar.LEVELS, np.zeros(len(cfar.LEVELS)), 50.0, 1e-4, cfar.CfarSettings())
    assert fit.threshold == 1.0


def test_the_threshold_sits_where_the_fleets_own_tail_meets_the_budget() -> None:
    """i.i.d. exponential values (scale 1) per node and instant: the rate above x is 2880 e^-x per
    node-day, so a budget of 0.01 per node-day for the component sits at ln(288,000) = 12.6."""
    s = cfar.CfarSettings(budget_per_1000_node_days=50.0, min_node_days=20.0, hold_steps=1, gap_steps=1)
    cal = cfar.Calibration(s)
    rng = np.random.default_rng(7)
    nodes, gpus = 200, 2
    cal.ensure(nodes)
    for i in range(nodes):
        cal.assign(i, "H|5s")
    caps = []
    for step in range(3000):
        lifted = np.zeros((len(cfar.DECIDING), nodes, gpus))
        lifted[NODE, :, 0] = rng.exponential(1.0, nodes)
        _, cap = cal.decide(lifted, np.ones(nodes, dtype=bool), 1_000_000.0 + 30 * step, 30.0)
        caps.append(float(cap[0]))
    cal.refit()
    days = cal.node_s[0] / 86400
    assert days == pytest.approx(200 * 3000 * 30 / 86400)
    exact = math.log(2880 / (50.0 / 1000 / len(cfar.DECIDING)))
    assert exact - 1.0 <= cal.thresholds[0, NODE] <= exact + 3.0
    others = [k for k in range(len(cfar.DECIDING)) if k != NODE]
    assert np.all(cal.thresholds[0, others] == 1.0)
    # shadow (capped) until 20 node-days were scored, live afterwards
    first_live = caps.index(1.0)
    assert set(caps[:first_live]) == {cfar.SHADOW_CAP}
    assert first_live * nodes * 30 / 86400 == pytest.approx(20.0, abs=0.1)
    assert cal.shadow[0] > 0
    status = cal.status()[0]
    assert status["state"] == "live"
    assert status["thresholds"]["thermal_node"] == pytest.approx(cal.thresholds[0, NODE], abs=1e-3)


def test_a_restored_calibration_fits_the_same_thresholds() -> None:
    cal = cfar.Calibration()
    cal.ensure(4)
    for i in range(4):
        cal.assign(i, cfar.pool_key("NVIDIA H200", 2.2))
    rng = np.random.default_rng(3)
    for step in range(400):
        lifted = np.zeros((len(cfar.DECIDING), 4, 8))
        lifted[NODE] = rng.exponential(0.6, (4, 8))
        cal.decide(lifted, np.ones(4, dtype=bool), 2_000_000.0 + 30 * step, 30.0)
    cal.refit()
    other = cfar.Calibration()
    assert other.import_(cal.export()) == 1
    assert other.pools == ["NVIDIA H200|2s"]
    np.testing.assert_array_equal(other.thresholds, cal.thresholds)
    np.testing.assert_array_equal(other.counts, cal.counts)
    assert other.import_({"format": "something else"}) == 0


def test_pools_tell_frame_intervals_apart() -> None:
    assert cfar.pool_key("NVIDIA A100", 9.6) == "NVIDIA A100|10s"
    assert cfar.pool_key("NVIDIA A100", 2.1) == "NVIDIA A100|2s"
    assert cfar.pool_key(None, 5.0) == "unknown|5s"


def test_model_status_shows_each_pool_from_a_saved_state(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cal = cfar.Calibration(cfar.CfarSettings(min_node_days=2.0))
    cal.ensure(2)
    cal.assign(0, cfar.pool_key("NVIDIA H200", 2.0))
    cal.assign(1, cfar.pool_key("NVIDIA A100", 10.0))
    for step in range(3000):  # 2 nodes x 3000 x 30 s = 2.08 node-days: 1.04 per pool
        cal.decide(np.zeros((len(cfar.DECIDING), 2, 8)), np.array([True, True]), 1e6 + 30 * step, 30.0)
    (tmp_path / "state.json").write_text(json.dumps({"cfar": cal.export()}))
    args = ["model", "status", "--state", str(tmp_path / "state.json"), "--json"]
    assert cli.main(args) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["pool"] for r in rows] == ["NVIDIA H200|2s", "NVIDIA A100|10s"]
    assert [r["state"] for r in rows] == ["shadow", "shadow"]
    assert rows[0]["node_days"] == pytest.approx(3000 * 30 / 86400, abs=0.01)
    assert cli.main([*args[:-1]]) == 0
    assert "NVIDIA A100|10s" in capsys.readouterr().out


def test_a_fault_seen_while_live_counts_once_when_it_opens_not_for_its_whole_course() -> None:
    s = cfar.CfarSettings(min_node_days=1.0, hold_steps=1, gap_steps=1, refit_s=30.0)
    cal = cfar.Calibration(s)
    nodes = 40
    cal.ensure(nodes)
    for i in range(nodes):
        cal.assign(i, "H|5s")
    rng = np.random.default_rng(5)
    t = 3_000_000.0

    def run(steps: int, faulty: int) -> None:
        nonlocal t
        for _ in range(steps):
            lifted = np.zeros((len(cfar.DECIDING), nodes, 1))
            lifted[NODE, :, 0] = rng.exponential(0.5, nodes)
            lifted[NODE, :faulty, 0] = 30.0  # far past any healthy value, and staying there
            cal.decide(lifted, np.ones(nodes, dtype=bool), t, 30.0)
            t += 30.0

    run(2200, 0)  # 1.02 node-days: live
    assert cal.live[0]
    high = cfar.LEVELS >= 15.0
    assert cal.counts[0, NODE, high].sum() == 0
    run(960, 3)  # three nodes faulty for 8 hours: past the 6 h quarantine, still high
    assert cal.opened[0] == 3
    # each fault counted once, at its crossing, at every level up to what it reached then
    assert cal.counts[0, NODE, cfar.LEVELS <= 30.0][-1] == 3
    assert cal.counts[0, NODE, high].max() == 3
    assert cal.counts[0, NODE, cfar.LEVELS > 30.0].sum() == 0
    # and only while it was not in quarantine
    assert cal.watched_s[0, NODE, 0] == pytest.approx(cal.node_s[0] - 3 * 720 * 30.0)


def test_the_threshold_is_never_under_a_level_the_pool_has_reached() -> None:
    """A light bulk and one excursion to 8 in 3 node-days: the exponential fitted to the bulk would
    put the threshold near 3, but at the budget less than one excursion past it is allowed in those
    node-days, and one went to 8."""
    counts = np.where(cfar.LEVELS <= 1.0, 400.0, np.where(cfar.LEVELS <= 1.5, 25.0, 0.0))
    counts[(cfar.LEVELS > 1.5) & (cfar.LEVELS <= 8.0)] = 1.0
    fit = cfar.threshold_for(cfar.LEVELS, counts, 3.0, 2e-4, cfar.CfarSettings())
    assert fit.threshold > 8.0
    light = np.where(cfar.LEVELS <= 1.0, 400.0, np.where(cfar.LEVELS <= 1.5, 25.0, 0.0))
    assert cfar.threshold_for(cfar.LEVELS, light, 3.0, 2e-4, cfar.CfarSettings()).threshold < 8.0


def test_a_thin_pool_does_not_go_live_under_what_it_has_shown_and_a_quiet_one_keeps_the_edge() -> None:
    """Fewer than ``min_clusters`` clusters at every level (a pool's first node-days): the fit starts
    at the lowest level with any. The mixed fleet's H200 pool (seed 11) had shown four excursions past
    3 in 2.8 node-days of shadow, and used to go live at the model's edge (1.0)."""
    s = cfar.CfarSettings()
    share = 1.0 / 1000 / len(cfar.DECIDING)
    heavy = np.where(cfar.LEVELS <= 3.16, 4.0, 0.0)
    heavy[cfar.LEVELS <= 0.35] = 7.0
    heavy[0] = 13.0
    assert cfar.threshold_for(cfar.LEVELS, heavy, 2.8, share, s).threshold > 3.16
    quiet = np.where(cfar.LEVELS <= 0.11, 4.0, 0.0)
    fit = cfar.threshold_for(cfar.LEVELS, quiet, 2.8, share, s)
    assert 1.0 <= fit.threshold < 1.5


def test_one_nodes_lone_excursion_bounds_the_threshold_at_its_level_not_at_the_cap() -> None:
    """Tuning seed 101 of the mixed fleet (old counters): a bulk of 35 clusters at 0.32 from many
    nodes, then one node alone out to 4. Fitted from every cluster, its shape made the threshold the
    cap (50); the pool's tail is what two nodes or more reached, and the threshold stays over 4."""
    share = 1.0 / 1000 / len(cfar.DECIDING)
    counts = np.zeros(len(cfar.LEVELS))
    counts[cfar.LEVELS <= 0.33] = 35.0
    counts[(cfar.LEVELS > 0.33) & (cfar.LEVELS <= 0.41)] = 3.0
    counts[(cfar.LEVELS > 0.41) & (cfar.LEVELS <= 1.8)] = 2.0
    counts[(cfar.LEVELS > 1.8) & (cfar.LEVELS <= 4.0)] = 1.0
    lone = np.where(cfar.LEVELS <= 0.41, 5.0, np.where(counts > 0, 1.0, 0.0))
    s = cfar.CfarSettings()
    assert cfar.threshold_for(cfar.LEVELS, counts, 11.7, share, s).threshold == 50.0
    fit = cfar.threshold_for(cfar.LEVELS, counts, 11.7, share, s, lone)
    assert 4.0 < fit.threshold < 5.0
    assert fit.xi < 0.5
    # the same excursions from two nodes or more are the pool's tail: the fit extrapolates it again
    shared = np.where(counts > 0, 2.0, 0.0)
    assert cfar.threshold_for(cfar.LEVELS, counts, 11.7, share, s, shared).threshold == 50.0


def test_nodes_at_counts_each_node_once_per_level() -> None:
    s = cfar.CfarSettings(min_node_days=100.0, hold_steps=1, gap_steps=1)
    cal = cfar.Calibration(s)
    cal.ensure(3)
    for i in range(3):
        cal.assign(i, "H|5s")
    for step in range(40):
        lifted = np.zeros((len(cfar.DECIDING), 3, 1))
        lifted[NODE, 0, 0] = 5.0 if step % 4 == 0 else 0.0  # node 0: ten excursions to 5
        lifted[NODE, 1, 0] = 0.5 if step % 4 == 0 else 0.0  # node 1: ten to 0.5
        cal.decide(lifted, np.ones(3, dtype=bool), 4e6 + 30 * step, 30.0)
    at = {lvl: int(cfar.LEVELS.searchsorted(lvl, "right")) - 1 for lvl in (0.5, 5.0)}
    assert cal.counts[0, NODE, at[5.0]] == 10
    assert cal.nodes_at[0, NODE, at[5.0]] == 1
    assert cal.nodes_at[0, NODE, at[0.5]] == 2
    other = cfar.Calibration(s)
    other.import_(cal.export())
    np.testing.assert_array_equal(other.nodes_at, cal.nodes_at)
