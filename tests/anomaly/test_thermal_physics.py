"""What the mixed fleet's air-cooled nodes showed (#39): a slope far from its GPU model's is not taken,
nodes are compared with the nodes of their own GPU model, a GPU that is not ready is compared with its
node's GPUs whatever its fit's offset, and a node whose temperature is not a straight line in power
(a fan chasing its hottest GPU) is allowed what its class's line has missed between loads."""

from __future__ import annotations

import numpy as np

from healer.anomaly import thermal, thermal_lag, thermal_node, thermal_peers
from tests.anomaly.test_thermal import GPUS, Node, R, _run
from tests.anomaly.test_thermal_lag import simulate


def test_a_slope_far_from_its_models_seed_is_not_taken() -> None:
    r = np.array([20.0, 45.0])
    temp, power, _ = simulate(r, np.array([20.0, 40.0]), hours=3, seed=1)
    fit = thermal_lag.LagFit(gpus=2)
    fit.ensure(["n0"])
    valid = np.ones((1, 2), dtype=bool)
    for k in range(len(temp)):
        fit.step(temp[k][None], power[k][None], valid, 30.0, valid)
    np.testing.assert_allclose(fit.resistance(1)[0], r, rtol=0.1)
    # within a factor of four of the model's seed it is the GPU's own; past it, not known
    got = fit.resistance(1, np.full((1, 2), 10.0))[0]
    assert not np.isnan(got[0])
    assert np.isnan(got[1])
    cls = np.zeros((1, 2), dtype=np.intp)
    assert fit.class_medians(cls, 1, np.full((1, 2), 200.0)) == {}  # none within range: no median


def test_nodes_are_compared_with_the_nodes_of_their_own_gpu_model() -> None:
    # 8 liquid nodes whose GPUs imply a 32 °C coolant and 8 air nodes at a 22 °C room, cold
    st = thermal.ThermalState(GPUS, ["liquid", "air"], [R, R])
    n = 16
    st.ensure([f"n{i}" for i in range(n)])
    cls = np.repeat(np.array([0, 1]), 8)[:, None].repeat(GPUS, axis=1)
    p = np.full((n, GPUS), 0.8)
    temp = np.where(cls == 0, 32.0, 22.0) + R * p
    temp[3] += 8.0  # one liquid node whose coolant is 8 °C warm
    z = thermal_peers.peer_z(st, n, temp, p, np.ones((n, GPUS), dtype=bool), cls, 0.0)
    assert np.all(np.abs(np.delete(z, 3)) < 0.2)  # the 10 °C between the pools is no anomaly
    assert z[3] >= 1.0  # the warm node stands out against its own pool


def test_a_gpu_not_ready_is_compared_with_its_nodes_gpus_whatever_its_fits_offset() -> None:
    # for 20 minutes the GPUs' fits are pulled towards a slope three times theirs (a wrong one taken
    # from their load changes), so their offsets carry the difference, and the inlet reference with
    # them; back on the seed's slope, a GPU that cools like its peers still reads 0 (at 0.45 of the
    # limit nothing gets ready: the wide check is what watches them)
    st = thermal.ThermalState(GPUS, ["H200"], [R], thermal.ThermalSettings(), edges=(4.0, 0.8, 4.0))
    node = Node()
    node.r[:] = R / 2
    node.r[5] = R / 2 * 1.8  # one GPU cools 80 % worse than its node's others
    node.power[:] = 0.45
    st.ensure(["n0"])
    st.gpu_r = np.full((1, GPUS), 3 * R)
    _run(st, node, 20 * 60, 0.0)
    st.gpu_r = np.full((1, GPUS), np.nan)
    steps = _run(st, node, 10 * 60, 20 * 60.0)
    rel = np.array([s.gpu_rel[0] for s in steps[-5:]])
    assert np.isfinite(rel).all()
    assert np.abs(np.delete(rel, 5, axis=1)).max() < 0.2
    assert rel[:, 5].min() > 0.3  # 0.4 of the model's slope worse


def _node_at(st: thermal.ThermalState, ref: float, power: float, now: float) -> float:
    """``node_c`` of one node whose level is 20 °C and whose only learned load band is full load."""
    st.ensure(["n0"])
    st.level[0], st.level_s[0], st.level_at[0] = 20.0, st.s.init_s, now
    st.band_s[:, 0], st.band_off[:, 0] = 0.0, 0.0
    st.band_s[4, 0] = st.s.init_s
    p = np.full((1, GPUS), power)
    pick = np.ones((1, GPUS), dtype=bool)
    rf = thermal._Ref(np.zeros((1, GPUS), dtype=np.intp), pick, pick, np.ones(1, dtype=bool),
                      np.array([ref]), np.array([ref]), np.ones(1, dtype=bool))  # fmt: skip
    cls = np.zeros((1, GPUS), dtype=np.intp)
    node, _, _ = thermal_node.node_value(st, 1, p, rf, now, cls, np.full((1, GPUS), 60.0))
    return float(node[0])


def test_a_load_the_nodes_offset_has_not_learned_is_allowed_what_its_line_may_miss() -> None:
    # an air node's slope from its load changes is steeper than its steady curve (the fan catches up):
    # at a load its offset has not learned, its reference reads 8 °C over its level; its class's
    # allowance (half the slope times the change of load until the fleet has shown better) covers it,
    # while at its learned load the same 8 °C is a cooling loss
    st = thermal.ThermalState(GPUS, ["A100"], [R])
    assert _node_at(st, 28.0, 0.6, 1000.0) == 0.0
    assert _node_at(st, 28.0, 0.92, 1000.0) == 8.0
    st.curve_err[0] = 0.0  # a class whose lines have held
    assert _node_at(st, 28.0, 0.6, 1000.0) == 5.0  # less 1.5 °C per band of distance only


def test_a_class_learns_how_far_its_nodes_lines_miss_between_loads() -> None:
    st = thermal.ThermalState(GPUS, ["A100", "H200"], [R, R])
    st.ensure(["n0", "n1"])
    init = st.s.init_s
    st.band_s[4, :] = init  # both nodes know full load; band 2 is learned this window
    st.band_off[2, :] = [20.0, 0.0]  # n0 (class 0) missed by 20 °C there, n1 (class 1) by nothing
    nband = np.array([2, 2])
    before, after = np.full(2, init - 30.0), np.full(2, init)
    st.band_s[2, :] = after
    thermal_node.learn_curve(st, 2, nband, before, after, np.array([0, 1]), np.full(2, 40.0))
    assert st.curve_err[0] > st.s.curve_err0  # up fast
    assert st.s.curve_err_min <= st.curve_err[1] < st.s.curve_err0  # down slowly
