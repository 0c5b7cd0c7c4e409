"""Rules over RDMA ports: port metrics aggregated over a node's ports (rules/port_state.py), one incident per
node and rule whose evidence names the ports, and what the checker refuses."""

from __future__ import annotations

import pathlib

import pytest

from healer.rules import engine, loader, parser
from healer.schemas import fabric, fields, telemetry
from healer.telemetry import rdma

FIXTURES = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "sysfs"
T0 = 1_700_000_000.0


def rules(text: str) -> engine.Engine:
    loaded = loader.load_text(text, "t.yaml")
    assert loaded.ruleset is not None, [str(e) for e in loaded.errors]
    return engine.Engine(loaded.ruleset)


def frame(node: str, ts: float, ports: list[fabric.PortSample] | None) -> telemetry.NodeFrame:
    return telemetry.NodeFrame(
        node=node, ts=ts, seq=0, boot_id="b", agent_version="t", source="replay", gpus=[], ports=ports,
        schema=telemetry.SCHEMA if ports is None else telemetry.SCHEMA_V2,
    )  # fmt: skip


def ports_of(fixture: str, tmp_path: pathlib.Path) -> list[fabric.PortSample]:
    root = rdma.write_tree((FIXTURES / fixture).read_text(), tmp_path / fixture)
    return rdma.PortReader(root).read()


DOWN = """
rules:
  - id: port-down
    scope: node
    when: count(port_state != 4) > 0
    severity: major
"""


def test_two_ports_down_on_one_node_are_one_firing_naming_both(tmp_path: pathlib.Path) -> None:
    eng = rules(DOWN)
    ports = ports_of("cx7-ib-healthy.txt", tmp_path)
    broken = [p.model_copy(update={"state": 1}) if p.device in ("mlx5_3", "mlx5_5") else p for p in ports]
    eng.ingest(frame("n1", T0, broken))
    eng.ingest(frame("n2", T0, ports))
    fired = eng.evaluate(T0)
    assert [(f.rule_id, f.node, f.gpu, f.status) for f in fired] == [("port-down", "n1", None, "fired")]
    assert fired[0].evidence["ports"] == "mlx5_3/1, mlx5_5/1"
    assert fired[0].evidence["count(port_state != 4)"] == 2


def test_the_recorded_link_down_tree_fires_and_names_its_port(tmp_path: pathlib.Path) -> None:
    eng = rules(DOWN)
    eng.ingest(frame("n1", T0, ports_of("cx7-ib-link-down.txt", tmp_path)))
    (fired,) = eng.evaluate(T0)
    assert fired.evidence["ports"] == "mlx5_3/1"


def test_counter_increase_per_port_and_a_reset_is_no_increase(tmp_path: pathlib.Path) -> None:
    eng = rules(
        """
rules:
  - id: errors
    scope: node
    when: max(increase(port_symbol_error[10m])) > 10
    severity: major
"""
    )
    healthy = ports_of("cx7-ib-healthy.txt", tmp_path)
    burst = ports_of("cx7-ib-symbol-errors.txt", tmp_path)
    eng.ingest(frame("n1", T0, healthy))
    assert eng.evaluate(T0) == []
    eng.ingest(frame("n1", T0 + 30, burst))
    (fired,) = eng.evaluate(T0 + 30)
    assert (fired.evidence["ports"], fired.evidence["max(increase(port_symbol_error[10m]))"]) == (
        "mlx5_1/1",
        65535,
    )
    # A driver reload zeroes the counters: the drop is a reset (increase 0), not an increase.
    eng2 = rules(
        """
rules:
  - id: errors
    scope: node
    when: max(increase(port_symbol_error[10m])) > 10
    severity: major
"""
    )
    eng2.ingest(frame("n1", T0, burst))
    eng2.evaluate(T0)
    eng2.ingest(frame("n1", T0 + 30, healthy))
    assert eng2.evaluate(T0 + 30) == []


def test_a_vanished_hca_counts_as_a_missing_port_and_ports_present_drops(tmp_path: pathlib.Path) -> None:
    eng = rules(
        """
rules:
  - id: fewer
    scope: node
    when: ports_present < 8 or count(port_state == 4) < 8
    severity: major
"""
    )
    eng.ingest(frame("n1", T0, ports_of("cx7-ib-healthy.txt", tmp_path)))
    assert eng.evaluate(T0) == []
    eng.ingest(frame("n1", T0 + 30, ports_of("cx7-ib-missing-hca.txt", tmp_path)))
    (fired,) = eng.evaluate(T0 + 30)
    assert fired.evidence["ports_present"] == 7


def test_frames_without_ports_leave_port_rules_unknown_and_empty_ports_count_zero() -> None:
    eng = rules(
        """
rules:
  - id: fewer
    scope: node
    when: count(port_state == 4) < 8
    severity: major
"""
    )
    eng.ingest(frame("old-agent", T0, None))
    eng.ingest(frame("no-rdma", T0, []))
    assert [f.node for f in eng.evaluate(T0)] == ["no-rdma"]


def test_rules_without_port_metrics_keep_no_ports(tmp_path: pathlib.Path) -> None:
    eng = rules("rules:\n  - {id: hot, scope: gpu, when: temp_c > 90, severity: major}\n")
    eng.ingest(frame("n1", T0, ports_of("cx7-ib-healthy.txt", tmp_path)))
    eng.evaluate(T0)
    assert eng.state.ports.slot_of[0] == {}, "the ports are not even looked at"


def test_a_forgotten_node_forgets_its_ports(tmp_path: pathlib.Path) -> None:
    eng = rules(DOWN)
    eng.ingest(frame("n1", T0, ports_of("cx7-ib-link-down.txt", tmp_path)))
    assert eng.evaluate(T0)
    gone = eng.forget_silent(T0 + 3600, 600)
    assert gone.nodes == ["n1"]
    eng.ingest(frame("n2", T0 + 3601, ports_of("cx6dx-roce-healthy.txt", tmp_path)))
    assert eng.evaluate(T0 + 3601) == []
    assert eng.state.ports.slot_of[0] == {"mlx5_0/1": 0, "mlx5_1/1": 1}


@pytest.mark.parametrize(
    ("scope", "text", "message"),
    [
        ("node", "port_state != 4", "aggregate it over the node's ports"),
        ("gpu", "port_state != 4", "aggregate it over the node's ports"),
        ("node", "max(temp_c) > 80 and port_state == 1", "aggregate it over the node's ports"),
        ("gpu", "temp_c > port_rate_gbps", "cannot meet in one operation"),
        ("node", "count(temp_c > 80 and port_state == 4) > 0", "cannot meet in one operation"),
        ("node", "rate(port_state[5m]) > 0", "rate() is for counters"),
    ],
)
def test_the_checker_refuses_port_values_that_are_not_aggregated_or_mixed_with_gpus(
    scope: str, text: str, message: str
) -> None:
    parsed = parser.parse(text, scope)  # type: ignore[arg-type]
    assert any(message in p.message for p in parsed.problems), [p.message for p in parsed.problems]


def test_port_aggregations_in_a_gpu_rule_are_node_values() -> None:
    parsed = parser.parse("temp_c > 80 and count(port_state != 4) > 0", fields.Scope.GPU)
    assert parsed.problems == []


# -- scope: port -----------------------------------------------------------------------------------
PORT_DOWN = """
rules:
  - id: port-down
    scope: port
    when: port_state != 4
    severity: major
"""


def test_a_port_scope_rule_fires_once_per_faulty_port_naming_it(tmp_path: pathlib.Path) -> None:
    eng = rules(PORT_DOWN)
    eng.ingest(frame("n1", T0, ports_of("cx7-ib-two-ports-down.txt", tmp_path)))
    eng.ingest(frame("n2", T0, ports_of("cx7-ib-healthy.txt", tmp_path)))
    fired = eng.evaluate(T0)
    assert [(f.node, f.gpu, f.port, f.status) for f in fired] == [
        ("n1", None, "mlx5_3/1", "fired"), ("n1", None, "mlx5_6/1", "fired"),
    ]  # fmt: skip
    assert fired[0].key == ("port-down", "n1", None, "mlx5_3/1")
    assert fired[0].evidence == {"port_state": 1.0}, "the port's own values, no ports list"
    eng.ingest(frame("n1", T0 + 10, ports_of("cx7-ib-link-down.txt", tmp_path)))  # mlx5_6/1 is back
    later = eng.evaluate(T0 + 10)
    assert [(f.port, f.status) for f in later] == [("mlx5_3/1", "firing"), ("mlx5_6/1", "resolved")]


def test_a_port_scope_rule_restores_and_releases_by_port(tmp_path: pathlib.Path) -> None:
    eng = rules(PORT_DOWN)
    assert eng.restore("port-down", "n1", None, since=T0 - 60, last=T0 - 1, evidence={}, port="mlx5_3/1")
    assert not eng.restore("port-down", "n1", None, since=T0, last=T0, evidence={}), (
        "a port rule needs the port"
    )
    eng.ingest(frame("n1", T0, ports_of("cx7-ib-link-down.txt", tmp_path)))
    (f,) = eng.evaluate(T0)
    assert (f.port, f.status, f.since) == ("mlx5_3/1", "firing", T0 - 60), "restored, not fired anew"
    eng.release("port-down", "n1", None, "mlx5_3/1")
    eng.ingest(frame("n1", T0 + 1, ports_of("cx7-ib-link-down.txt", tmp_path)))
    assert eng.evaluate(T0 + 1) == [], "released: the same old fault does not fire again"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("temp_c > 80", "in a port-scope rule"),
        ("port_state != 4 and max(temp_c) > 80", "in a port-scope rule"),
    ],
)
def test_a_port_scope_rule_reads_port_and_node_metrics_never_gpu_ones(text: str, message: str) -> None:
    parsed = parser.parse(text, fields.Scope.PORT)
    assert any(message in p.message for p in parsed.problems), [p.message for p in parsed.problems]
    assert (
        parser.parse("port_state != 4 and port_rate_gbps < max(port_rate_gbps)", fields.Scope.PORT).problems
        == []
    )


def test_the_loader_refuses_an_event_port_rule_and_a_port_label() -> None:
    loaded = loader.load_text(
        """
rules:
  - id: p
    scope: port
    on_event: {kind: xid}
    severity: major
    resolve: {for: 1m}
  - id: q
    scope: node
    when: count(port_state != 4) > 0
    labels: {port: mlx5_0/1}
    severity: major
""",
        "t.yaml",
    )
    messages = [str(e) for e in loaded.errors]
    assert any("no node event names an RDMA port" in m for m in messages), messages
    assert any("label 'port' is the controller's" in m for m in messages), messages


def test_rule_tests_check_the_port_of_a_firing(tmp_path: pathlib.Path) -> None:
    from healer.rules import ruletests

    (tmp_path / "r.yaml").write_text(PORT_DOWN)
    case = """
rule_files: [r.yaml]
interval: 30s
tests:
  - name: t
    nodes:
      n1: {{ports: 4, series: {{port2: {{port_state: '1x4'}}}}}}
    expect:
      - at: 30s
        firing: [{{rule: port-down, node: n1, port: {port}}}]
        incidents: [{{rule: port-down, node: n1, port: {port}}}]
"""
    (tmp_path / "right_test.yaml").write_text(case.format(port="mlx5_2/1"))
    (tmp_path / "wrong_test.yaml").write_text(case.format(port="mlx5_1/1"))
    (right,) = ruletests.run_file(tmp_path / "right_test.yaml")
    assert right.ok, right.failures
    (wrong,) = ruletests.run_file(tmp_path / "wrong_test.yaml")
    assert len(wrong.failures) == 2
    assert "unexpected: {rule: port-down, node: n1, port: mlx5_2/1" in wrong.failures[0]
