"""Failure domains (#27 item 1): hostlists, Slurm's topology.conf, inventory labels, scheduler labels,
the admission that believes them, and ``healer fleet show``."""

from __future__ import annotations

import json
import pathlib

import pytest
import structlog

from healer import config, errors, testing
from healer.cli import main as cli_main
from healer.controller.inventory import admission, topology
from healer.controller.observability import metrics
from tests.controller.conftest import metric

FIXTURES = pathlib.Path(__file__).parent.parent / "fixtures"


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("gpu[01-03,07]", ["gpu01", "gpu02", "gpu03", "gpu07"]),
        ("gpu[8-10]", ["gpu8", "gpu9", "gpu10"]),
        ("a1,b[1-2],c", ["a1", "b1", "b2", "c"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("", []),
    ],
)
def test_hostlists_expand_as_slurm_does(expr: str, names: list[str]) -> None:
    assert topology.expand_hostlist(expr) == names


@pytest.mark.parametrize("expr", ["gpu[01-03", "gpu]", "gpu[a-b]", "gpu[5-1]", "gpu[0-99999999]"])
def test_bad_hostlists_are_refused(expr: str) -> None:
    with pytest.raises(ValueError, match="hostlist"):
        topology.expand_hostlist(expr)


def test_a_real_format_topology_conf_gives_each_node_its_switch_chain() -> None:
    parsed = topology.read_topology_file(str(FIXTURES / "topology.conf"))
    assert parsed.problems == []
    assert parsed.domains["gpu03"] == {"switch": "leaf-01", "switch_l2": "spine-1", "switch_l3": "core"}
    assert parsed.domains["gpu10"]["switch"] == "leaf-02"
    assert sorted(parsed.domains) == [f"gpu{i:02d}" for i in (1, 2, 3, 4, 5, 6, 7, 8, 10)]


def test_scontrol_show_topology_output_and_blocks_parse_too() -> None:
    text = (
        "SwitchName=s0 Level=0 LinkSpeed=1 Nodes=n[1-2]\n"
        "SwitchName=s1 Level=1 LinkSpeed=1 Nodes=n[1-2] Switches=s0\n"  # upper switches list nodes too
        "BlockName=b1 Nodes=n[1-2]\nBlockSizes=2\n"
    )
    parsed = topology.parse_topology_conf(text)
    assert parsed.problems == []
    assert parsed.domains["n1"] == {"switch": "s0", "switch_l2": "s1", "block": "b1"}


def test_bad_topology_lines_are_reported_by_line_and_the_rest_kept() -> None:
    text = "SwitchName=ok Nodes=n1\nnonsense\nSwitchName=bad Nodes=n[1-\nFoo=bar\n"
    parsed = topology.parse_topology_conf(text, "t.conf")
    assert parsed.domains == {"n1": {"switch": "ok"}}
    assert [p.split(":")[1] for p in parsed.problems] == ["2", "3", "4"]


def test_a_switch_loop_is_reported_not_followed_forever() -> None:
    parsed = topology.parse_topology_conf("SwitchName=a Nodes=n1 Switches=b\nSwitchName=b Switches=a\n")
    assert parsed.domains["n1"]["switch"] == "a"
    assert any("own ancestor" in p for p in parsed.problems)


@pytest.mark.parametrize(
    "raw",
    [
        {"nodes": [{"name": "g1", "rack": "r1", "pdu": 3}, "g2"]},
        {"nodes": {"g1": {"rack": "r1", "pdu": 3}, "g2": None}},
        [{"name": "g1", "rack": "r1", "pdu": "3"}, "g2"],
    ],
)
def test_inventory_entries_may_carry_domain_labels(raw: object) -> None:
    inv = topology.parse_inventory(raw)
    assert inv.names == {"g1", "g2"}
    assert inv.domains == {"g1": {"rack": "r1", "pdu": "3"}, "g2": {}}


@pytest.mark.parametrize("raw", [{"nodes": [{"rack": "r1"}]}, {"nodes": [{"name": "g", "rack": [1]}]}, 7])
def test_malformed_inventory_entries_are_refused(raw: object) -> None:
    with pytest.raises(ValueError, match=r"expected|label"):
        topology.parse_inventory(raw)


def test_kubernetes_topology_labels_and_configured_keys_become_domains() -> None:
    labels = {
        "topology.kubernetes.io/zone": "z1",
        "example.com/rack": "r7",
        "kubernetes.io/hostname": "g1",
    }
    assert topology.domains_from_labels(labels, {"rack": "example.com/rack", "pdu": "x/pdu"}) == {
        "zone": "z1",
        "rack": "r7",
    }


def test_slurm_features_become_domains_by_key_value_and_by_configured_prefix() -> None:
    features = "h100,nvlink,rack=r07,pdu_p3,rack=r99,=x,cooling=,pdu_"
    assert topology.domains_from_features(features, {"pdu": "pdu_", "row": "row-"}) == {
        "rack": "r07",  # the first feature naming a key wins
        "pdu": "p3",
    }
    assert topology.domains_from_features("", {"pdu": "pdu_"}) == {}
    labels = {"features": "rack=r07,pdu_p3", "acme/rack": "r1", "partition": "gpu"}
    assert topology.domains_from_scheduler(labels, {"rack": "acme/rack"}, {"pdu": "pdu_"}) == {
        "rack": "r1",  # a scheduler label wins over a feature
        "pdu": "p3",
    }


def _admission(cs: config.ControllerSettings, scheduler: object | None = None) -> admission.Admission:
    return admission.Admission(
        cs,
        metrics.ControllerMetrics(),
        scheduler=scheduler or testing.RecordingActuator(),
        log=structlog.get_logger(),
    )


def test_the_admitted_fleet_and_its_topology_come_from_one_inventory_read(tmp_path: pathlib.Path) -> None:
    inv = tmp_path / "nodes.yaml"
    inv.write_text("nodes:\n  - {name: gpu01, rack: r1}\n  - {name: gpu02, rack: r1}\n  - gpu99\n")
    cs = config.ControllerSettings(
        admission="file", inventory_file=str(inv), topology_file=str(FIXTURES / "topology.conf")
    )
    adm = _admission(cs)
    believed = adm.topology()
    assert adm.admitted == {"gpu01", "gpu02", "gpu99"}
    assert believed.of("gpu01") == {
        "rack": "r1",
        "switch": "leaf-01",
        "switch_l2": "spine-1",
        "switch_l3": "core",
    }
    assert "gpu05" not in believed.domains, "topology.conf nodes not admitted are not in the fleet"
    assert believed.members("rack", "r1") == {"gpu01", "gpu02"}
    assert believed.dump()["without_domains"] == ["gpu99"]


def test_a_bad_topology_line_is_counted_and_the_file_still_used(tmp_path: pathlib.Path) -> None:
    conf = tmp_path / "topology.conf"
    conf.write_text("SwitchName=s Nodes=g1\ngarbage\n")
    cs = config.ControllerSettings(admission="first-seen", topology_file=str(conf))
    adm = _admission(cs)
    adm.admits("g1")
    assert adm.topology().of("g1") == {"switch": "s"}
    assert metric(adm.metrics, "topology_lines_rejected_total") == 1


def test_an_unreadable_topology_file_fails_at_start() -> None:
    cs = config.ControllerSettings(admission="first-seen", topology_file="/nonexistent/topology.conf")
    with pytest.raises(errors.PermanentError, match="topology_file"):
        _admission(cs)


class Labelled(testing.RecordingActuator):
    async def node_labels(self, nodes: list[str]) -> dict[str, dict[str, str]]:
        known = {"k1": {"topology.kubernetes.io/zone": "z1", "acme/rack": "r9"}}
        return {n: known[n] for n in nodes if n in known}


async def test_scheduler_admission_learns_domains_from_the_labels_that_admit() -> None:
    cs = config.ControllerSettings(admission="scheduler", domain_labels={"rack": "acme/rack"})
    adm = _admission(cs, Labelled())
    assert not adm.admits("k1")
    assert not adm.admits("ghost")
    await adm.refresh()
    assert adm.admitted == {"k1"}
    assert adm.topology().domains == {"k1": {"zone": "z1", "rack": "r9"}}


def test_fleet_show_prints_the_believed_topology(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inv = tmp_path / "nodes.yaml"
    inv.write_text("nodes: {gpu01: {rack: r1}, gpu05: {rack: r2}}\n")
    settings = tmp_path / "healer.yaml"
    settings.write_text(
        f"controller:\n  admission: file\n  inventory_file: {inv}\n"
        f"  topology_file: {FIXTURES / 'topology.conf'}\n"
    )
    assert cli_main(["fleet", "show", "--config", str(settings)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["nodes"] == 2
    assert doc["domains"]["rack"] == {"r1": ["gpu01"], "r2": ["gpu05"]}
    assert doc["domains"]["switch"] == {"leaf-01": ["gpu01"], "leaf-02": ["gpu05"]}
    assert cli_main(["fleet", "show", "--config", str(settings), "--by", "switch_l2"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "key": "switch_l2",
        "domains": {"spine-1": ["gpu01", "gpu05"]},
    }
