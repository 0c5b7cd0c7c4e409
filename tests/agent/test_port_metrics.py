"""The agent's /metrics serves the RDMA ports under node_exporter's infiniband collector names."""

from __future__ import annotations

import pathlib

import prometheus_client
from prometheus_client import parser

from healer.agent import exposition
from healer.schemas import telemetry
from healer.telemetry import rdma

FIXTURES = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "sysfs"


def scrape(fixture: str, tmp_path: pathlib.Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    root = rdma.write_tree((FIXTURES / fixture).read_text(), tmp_path / "sys")
    metrics = exposition.AgentMetrics()
    frame = telemetry.NodeFrame(
        node="n1", ts=1.0, seq=0, boot_id="b", agent_version="t", source="sim", gpus=[],
        ports=rdma.PortReader(root).read(), schema=telemetry.SCHEMA_V2,
    )  # fmt: skip
    metrics.ports.observe(frame)
    text = prometheus_client.generate_latest(metrics.registry).decode()
    out = {}
    for family in parser.text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_infiniband_ports_under_node_exporter_names(tmp_path: pathlib.Path) -> None:
    got = scrape("cx7-ib-link-down.txt", tmp_path)
    port = (("device", "mlx5_3"), ("port", "1"))
    assert got[("node_infiniband_state_id", port)] == 1
    assert got[("node_infiniband_physical_state_id", port)] == 2
    assert got[("node_infiniband_rate_bytes_per_second", port)] == 10e9 / 8
    ok = (("device", "mlx5_0"), ("port", "1"))
    assert got[("node_infiniband_state_id", ok)] == 4
    assert got[("node_infiniband_rate_bytes_per_second", ok)] == 50e9
    assert got[("node_infiniband_link_downed_total", ok)] == 0
    assert got[("node_infiniband_port_data_transmitted_bytes_total", ok)] == 81_234_567_890 * 97 * 4
    assert got[("node_infiniband_port_transmit_wait_total", ok)] == 4_210_337
    assert ("node_network_carrier_changes_total", (("device", "ib0"),)) not in got
    assert len([k for k in got if k[0] == "node_infiniband_state_id"]) == 8


def test_roce_ports_add_their_netdev_flaps_and_driver_counters(tmp_path: pathlib.Path) -> None:
    got = scrape("cx6dx-roce-flap.txt", tmp_path)
    assert got[("node_network_carrier_changes_total", (("device", "ens2f0np0"),))] == 14
    key = (("counter", "roce_adp_retrans"), ("device", "mlx5_1"), ("port", "1"))
    assert got[("healer_rdma_hw_counter_total", key)] == 88


def test_a_node_without_ports_serves_no_port_series() -> None:
    metrics = exposition.AgentMetrics()
    metrics.ports.observe(
        telemetry.NodeFrame(node="n1", ts=1.0, seq=0, boot_id="b", agent_version="t", source="sim", gpus=[])
    )
    assert "node_infiniband" not in prometheus_client.generate_latest(metrics.registry).decode()


def test_validation_needs_every_port_active_unless_disabled(tmp_path: pathlib.Path) -> None:
    from healer.agent import validation

    def verdict(fixture: str) -> tuple[bool, str]:
        root = rdma.write_tree((FIXTURES / fixture).read_text(), tmp_path / fixture)
        report = validation.check([], None, [], None, ports=rdma.PortReader(root).read())
        (check,) = [c for c in report.checks if c.name == "rdma_ports_active"]
        return report.passed, check.detail

    assert verdict("cx7-ib-healthy.txt") == (True, "8 ports")
    assert verdict("cx7-ib-link-down.txt") == (False, "not ACTIVE: mlx5_3/1")
    assert verdict("cx6dx-roce-down.txt") == (True, "2 ports"), "a disabled port is an operator's choice"
    report = validation.check([], None, [], None)
    assert "rdma_ports_active" not in {c.name for c in report.checks}, "ports not read: no check"


def test_the_fabric_rules_that_take_a_node_out_walk_the_link_reset_then_reboot_ladder() -> None:
    from healer.rules import loader

    pack = loader.load_paths([pathlib.Path(__file__).resolve().parents[2] / "rules"]).ruleset
    assert pack is not None
    for rule in ("rdma-port-down", "rdma-ports-missing-8x400g"):
        ladder = pack.ladder_for(rule)
        assert ladder is not None
        assert ladder.id == "fabric"
        assert tuple(ladder.steps) == ("reset_port", "reboot_node")
