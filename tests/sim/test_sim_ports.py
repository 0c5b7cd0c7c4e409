"""The simulator's RDMA ports and their faults (a flap, down-training, a symbol error burst, a missing
HCA), checked through the default pack's fabric rules as the controller would see them."""

from __future__ import annotations

import pytest

from healer import errors
from healer.rules import engine, loader
from healer.schemas import codec, telemetry
from healer.sim import faults, scenarios


def run_fabric(seconds: int) -> tuple[dict[str, set[str]], dict[str, str], list[telemetry.NodeFrame]]:
    """The builtin ``fabric`` scenario on 6 nodes in an 8x400g pool: rules firing per node, the kind of
    fault each faulty node got, and the last frame of every node."""
    rules = loader.load_paths(["rules/fabric.yaml"]).ruleset
    assert rules is not None
    eng = engine.Engine(rules)
    sim = scenarios.build(scenarios.load("fabric"), nodes=6, gpus=8, seed=3)
    for name in sim.fleet.node_names:
        eng.set_labels(name, {"healer.io/rdma": "8x400g"})
    fired: dict[str, set[str]] = {name: set() for name in sim.fleet.node_names}
    last: dict[str, telemetry.NodeFrame] = {}
    for step in range(seconds // 10):
        sim.step(10.0)
        for _, data in sim.frames():
            frame = codec.decode_frame(data)
            last[frame.node] = frame
            eng.ingest(frame)
        for f in eng.evaluate(sim.t):
            fired[f.node].add(f.rule_id)
        assert step < 1 or all(f.schema_ == telemetry.SCHEMA_V2 for f in last.values())
    kinds = {t["node"]: t["kind"] for t in sim.take_truth()}
    return fired, kinds, list(last.values())


def test_each_port_fault_fires_its_fabric_rule_and_healthy_nodes_fire_none() -> None:
    fired, kinds, frames = run_fabric(900)
    assert set(kinds.values()) == faults.PORT_KINDS - faults.FAIL_SLOW_KINDS  # congestion: test_sim_failslow
    expected = {
        "port_flap": {"rdma-port-flapping"},
        "port_downtrain": {
            "rdma-port-rate-below-peers",
            "rdma-port-rate-low-400g",
            "rdma-ports-missing-8x400g",
        },
        "port_symbol_burst": {"rdma-port-errors"},
        "hca_missing": {"rdma-ports-missing-8x400g"},
    }
    for node, rules_fired in fired.items():
        assert rules_fired == expected.get(kinds.get(node, ""), set()), (node, kinds.get(node))
    by_node = {f.node: f for f in frames}
    missing = next(n for n, k in kinds.items() if k == "hca_missing")
    assert len(by_node[missing].ports or ()) == 7
    busy = next(f for n, f in by_node.items() if n not in kinds)
    assert all(p.port_xmit_data_bytes and p.port_xmit_data_bytes % 4 == 0 for p in busy.ports or ())


def test_a_reboot_brings_the_hca_back_at_full_rate_with_counters_zeroed() -> None:
    sim = scenarios.build(scenarios.load("fabric"), nodes=4, gpus=8, seed=3)
    for _ in range(20):
        sim.step(10.0)
    ports = sim.fleet.ports
    assert ports is not None
    assert not ports.present.all()
    assert (ports.rate < 400).any()
    for node in range(4):
        sim.fleet.reboot_node(node)
    assert ports.present.all()
    assert (ports.rate == 400).all()
    assert (ports.counters["link_downed"] == 0).all()


def test_a_port_fault_without_ports_is_a_clear_scenario_error() -> None:
    sc = scenarios.parse("name: p\nfaults:\n  - {kind: port_flap, at_s: 10}\n")
    with pytest.raises(errors.PermanentError, match="needs RDMA ports"):
        scenarios.build(sc, nodes=2)


def test_scenarios_without_ports_still_send_v1_frames() -> None:
    sim = scenarios.build(scenarios.load("healthy"), nodes=2, gpus=2, seed=1)
    sim.step(1.0)
    assert all(b'"ports"' not in data and b"telemetry.v1" in data for _, data in sim.frames())
