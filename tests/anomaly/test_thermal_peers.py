"""Peers that share the cause (#39 item 2, eighth round): nodes are compared within their cooling domain
(rack, CDU) where the deployment says which, a pool of a few nodes (a CDU's) is compared at all, and a
node's own offset from its peers does not learn a fault that builds over an hour."""

from __future__ import annotations

import numpy as np
import orjson

from healer.anomaly import thermal, thermal_peers

GPUS = 8
R = 25.0


def _state(n: int) -> tuple[thermal.ThermalState, np.ndarray]:
    st = thermal.ThermalState(GPUS, ["liquid"], [R])
    st.ensure([f"n{i}" for i in range(n)])
    return st, np.zeros((n, GPUS), dtype=np.intp)


def test_a_node_is_compared_with_the_nodes_of_its_cooling_domain() -> None:
    # two CDUs of 6 nodes; CDU b's supply has drifted 4 °C above CDU a's, and one node of CDU a has
    # lost 5 °C of its coolant's margin: against the whole pool it hides in the spread of the two
    # CDUs, against its own CDU it stands out and the drift cancels
    n = 12
    p = np.full((n, GPUS), 0.8)
    supply = np.where(np.arange(n) < 6, 32.0, 36.0)
    temp = supply[:, None] + R * p
    temp[2] += 5.0
    ok = np.ones((n, GPUS), dtype=bool)
    st, cls = _state(n)
    pooled = thermal_peers.peer_z(st, n, temp, p, ok, cls, 0.0)
    assert pooled[2] < 1.0
    st, cls = _state(n)
    st.set_domains({f"n{i}": "cdu-a" if i < 6 else "cdu-b" for i in range(n)})
    z = thermal_peers.peer_z(st, n, temp, p, ok, cls, 0.0)
    assert z[2] >= 1.5
    assert np.all(np.abs(np.delete(z, 2)) < 0.2)


def test_a_domain_with_too_few_nodes_falls_back_to_its_gpu_models_nodes() -> None:
    n = 8
    p = np.full((n, GPUS), 0.8)
    temp = 32.0 + R * p + np.zeros((n, GPUS))
    temp[0] += 6.0
    st, cls = _state(n)
    # racks of 2: never enough nodes for a group of their own, so the pool is compared as one
    st.set_domains({f"n{i}": f"r{i // 2}" for i in range(n)})
    z = thermal_peers.peer_z(st, n, temp, p, np.ones((n, GPUS), dtype=bool), cls, 0.0)
    assert z[0] >= 1.5
    assert np.all(np.abs(z[1:]) < 0.2)


def test_a_pool_of_six_nodes_is_compared() -> None:
    n = 6  # the liquid nodes of one CDU
    p = np.full((n, GPUS), 0.8)
    temp = 32.0 + R * p + np.zeros((n, GPUS))
    temp[4] += 5.0
    st, cls = _state(n)
    z = thermal_peers.peer_z(st, n, temp, p, np.ones((n, GPUS), dtype=bool), cls, 0.0)
    assert z[4] >= 1.5
    assert np.isfinite(z).all()


def test_a_coolant_fault_building_over_an_hour_is_not_absorbed_into_the_nodes_offset() -> None:
    n = 6
    rng = np.random.default_rng(3)
    p = np.full((n, GPUS), 0.8)
    ok = np.ones((n, GPUS), dtype=bool)
    st, cls = _state(n)
    z = np.zeros(n)
    for k in range(240):  # 2 h of 30 s steps: an hour healthy, then 6 °C over an hour
        supply = 32.0 + 0.5 * np.sin(k / 20.0)  # the CDU's own swing: every node moves
        temp = supply + R * p + rng.normal(0, 0.2, (n, GPUS))
        temp[1] += 6.0 * min(1.0, max(0.0, (k - 120) / 120.0))
        z = thermal_peers.peer_z(st, n, temp, p, ok, cls, 30.0 if k else 0.0)
    assert z[1] >= 1.7
    assert abs(st.peer_off[1]) < 0.3  # at the full pace it would have learned about 1 °C of it
    assert np.all(np.abs(np.delete(z, 1)) < 0.3)


def test_the_domains_are_set_by_name_and_nodes_without_one_read_minus_one() -> None:
    st, _ = _state(3)
    st.set_domains({"n0": "cdu-1", "n2": "cdu-0", "elsewhere": "cdu-9"})
    assert st.domain_index(3).tolist() == [1, -1, 0]
    assert orjson.loads(orjson.dumps(st.export()))  # domains are configuration, not learned state


def test_only_gpus_whose_own_slope_is_known_are_compared() -> None:
    # in a fleet's first hour the trained slope can be off by half: a node at another load than its
    # peers would read the slope's error times the difference of load, so until its GPUs' own slopes
    # are known (``thermal_lag``) it is not compared
    n = 6
    p = np.full((n, GPUS), 0.9)
    p[0] = 0.5
    temp = 32.0 + 0.5 * R * p  # the true slope is half the seed
    st, cls = _state(n)
    st.gpu_r = np.full((n, GPUS), 0.5 * R)
    st.gpu_r[0] = np.nan
    z = thermal_peers.peer_z(st, n, temp, p, np.ones((n, GPUS), dtype=bool), cls, 0.0)
    assert np.isnan(z[0])
    assert np.all(np.abs(z[1:]) < 0.1)
    st.gpu_r[0] = 0.5 * R  # known: the node at half load is no different from its peers
    z = thermal_peers.peer_z(st, n, temp, p, np.ones((n, GPUS), dtype=bool), cls, 0.0)
    assert np.all(np.abs(z) < 0.1)


def _fleet_run(hold: bool) -> float:
    """Six nodes at one load on a CDU whose supply swings; after two hours node 0's coolant loses 6 °C
    over an hour. Returns node 0's ``node_c`` at the end of the ramp."""
    n = 6
    rng = np.random.default_rng(5)
    st = thermal.ThermalState(GPUS, ["liquid"], [R], thermal.ThermalSettings(), edges=(4.0, 0.8, 4.0))
    st.ensure([f"n{i}" for i in range(n)])
    st.gpu_r = np.full((n, GPUS), R)
    if not hold:  # the peers are not consulted: each node's level follows its own inlet
        st.s = thermal.ThermalSettings(peer_min_nodes=99)
    cls = np.zeros((n, GPUS), dtype=np.intp)
    p = np.full((n, GPUS), 0.8)
    ok = np.ones((n, GPUS), dtype=bool)
    node_c = np.nan
    for k in range(360):  # 3 h of 30 s steps
        supply = 32.0 + 0.4 * np.sin(k / 30.0) + 0.3 * k / 120.0  # every node moves
        temp = supply + R * p + rng.normal(0, 0.15, (n, GPUS))
        temp[0] += 6.0 * min(1.0, max(0.0, (k - 240) / 120.0))
        step = st.step(temp, p.copy(), ok, cls, 1000.0 + 30.0 * k, 30.0 if k else 0.0)
        node_c = float(step.node_c[0, 0])
    return node_c


def test_a_node_standing_out_from_its_peers_holds_its_inlet_level() -> None:
    # alone, a node's level follows its inlet at up to node_rate_c_per_h (2.5 °C/h), so a coolant
    # fault over an hour reads 2.5 °C less than it is; its peers say the inlet that moved is its own
    alone, held = _fleet_run(hold=False), _fleet_run(hold=True)
    assert held >= 4.5  # held once it is half its peer edge out (1.5 °C)
    assert alone < held - 1.0
