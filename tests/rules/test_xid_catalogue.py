"""The XID catalogue as data, the default pack's coverage of it, ``rules check``'s warning, and the
rule language's repeat patterns (bursts counted per target over a window)."""

from __future__ import annotations

import pathlib
import textwrap

import pytest
import yaml

from healer import cli
from healer.rules import coverage, engine, loader, ruletests
from healer.schemas import events, xids

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_catalogue_loads_with_its_provenance_and_the_codes_the_issue_names() -> None:
    catalog = xids.load()
    assert catalog.source.startswith("https://docs.nvidia.com/")
    assert catalog.retrieved
    assert catalog.catalog
    for code in (46, 54, 62, 109, 110, 136, 143, 151, 155, 156, 158, *range(144, 151)):
        xid = catalog.get(code)
        assert xid is not None, code
        assert xid.needs_rule, code
    assert catalog.get(79) == xids.Xid(
        79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "GPU fell off the bus", "bus", "RESTART_BM", True
    )
    graphics = catalog.get(13)
    assert graphics is not None
    assert not graphics.needs_rule
    assert catalog.name(99999) == "not in healer's XID catalogue"


def test_catalogue_refuses_a_duplicate_code_or_an_unknown_action() -> None:
    head = "catalog: c\nsource: s\nretrieved: r\nxids:\n"
    row = "  - {code: 1, mnemonic: M, name: n, category: bus, action: %s, hardware: false}\n"
    with pytest.raises(ValueError, match="listed twice"):
        xids.parse(head + row % "IGNORE" + row % "IGNORE")
    with pytest.raises(ValueError, match="action"):
        xids.parse(head + row % "PRAY")


def test_default_pack_covers_every_catalogued_xid_that_needs_action() -> None:
    result = loader.load_paths([REPO / "rules"])
    assert result.ruleset is not None
    assert coverage.uncovered(result.ruleset) == []


def test_default_pack_rule_tests_fire_every_catalogued_xid_that_needs_action() -> None:
    doc = yaml.safe_load((REPO / "rules" / "tests" / "xid_test.yaml").read_text())
    tested = {
        ev.get("xid") for case in doc["tests"] for n in case["nodes"].values() for ev in n.get("events", [])
    }
    assert {x.code for x in xids.load().needing_rules} <= tested
    results = ruletests.run_file(REPO / "rules" / "tests" / "xid_test.yaml")
    assert results
    assert [r.failures for r in results if not r.ok] == []


XID_RULE = """\
rules:
  - id: some-xids
    description: d
    on_event: {kind: xid, xid: [79]}
    severity: critical
    actions: [cordon]
    resolve: {for: 1h}
"""


def test_check_warns_for_each_uncovered_xid_at_the_first_xid_rule(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "x.yaml"
    path.write_text(XID_RULE)
    assert cli.main(["rules", "check", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"{path}:2:5: warning: XID 46 (GPU timeout; NVIDIA's immediate action: RESET_GPU)" in out
    assert "XID 79 " not in out
    expected = len(xids.load().needing_rules) - 1
    assert f"0 errors, {expected} warnings" in out
    assert cli.main(["rules", "check", "--strict", str(path)]) == 1


def test_check_does_not_ask_a_set_without_xid_rules_or_with_an_any_xid_rule_to_cover(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    thermal = tmp_path / "t.yaml"
    thermal.write_text("rules:\n  - id: a\n    description: d\n    when: temp_c > 90\n    severity: info\n")
    any_xid = tmp_path / "any.yaml"
    any_xid.write_text(XID_RULE.replace("xid: [79]", "xid: null"))
    for path in (thermal, any_xid):
        assert cli.main(["rules", "check", "--strict", str(path)]) == 0
        assert "0 warnings" in capsys.readouterr().out


def test_a_burst_rule_alone_does_not_cover_its_codes() -> None:
    text = XID_RULE.replace("xid: [79]", "xid: [46], repeat: {count: 2, within: 5m}")
    result = loader.load_text(text)
    assert result.ruleset is not None
    assert 46 in {x.code for x in coverage.uncovered(result.ruleset)}


BURST = """\
rules:
  - id: burst
    description: d
    scope: {scope}
    on_event:
      kind: xid
      xid: [13, 31]
      repeat: {{count: 3, within: 10m, pids: 2}}
    severity: major
    actions: [notify]
"""


def _ev(node: str, t: float, gpu: int, xid: int, pid: int | None) -> events.NodeEvent:
    return events.new(node, "xid", gpu_index=gpu, xid=xid, pid=pid, ts=ruletests.T0 + t)


def _fired(eng: engine.Engine, t: float) -> list[tuple[str, int | None]]:
    return [(f.node, f.gpu) for f in eng.evaluate(ruletests.T0 + t) if f.status == "fired"]


def test_repeat_counts_per_gpu_within_the_window_and_needs_distinct_pids() -> None:
    result = loader.load_text(BURST.format(scope="gpu"))
    assert result.ruleset is not None
    eng = engine.Engine(result.ruleset)
    for t, gpu, pid in ((0, 0, 1), (60, 0, 1), (60, 1, 2), (120, 1, 3)):
        eng.ingest_event(_ev("n1", t, gpu, 13, pid))
    assert _fired(eng, 130) == []  # gpu0: 2 events, gpu1: 2 events
    eng.ingest_event(_ev("n1", 200, 0, 31, 1))
    assert _fired(eng, 210) == []  # gpu0: 3 events, one process
    eng.ingest_event(_ev("n1", 900, 1, 31, None))
    assert _fired(eng, 910) == []  # gpu1: the first two fell out of the 10-minute window
    eng.ingest_event(_ev("n1", 300, 0, 13, 2))
    fired = [f for f in eng.evaluate(ruletests.T0 + 310) if f.status == "fired"]
    assert [(f.node, f.gpu) for f in fired] == [("n1", 0)]
    assert fired[0].evidence["count"] == 4
    assert fired[0].evidence["pids"] == "1,2"


def test_repeat_at_node_scope_counts_the_nodes_gpus_together() -> None:
    result = loader.load_text(BURST.format(scope="node"))
    assert result.ruleset is not None
    eng = engine.Engine(result.ruleset)
    for t, gpu, pid in ((0, 0, 1), (10, 3, 2), (20, 5, 3)):
        eng.ingest_event(_ev("n1", t, gpu, 13, pid))
    assert _fired(eng, 30) == [("n1", None)]


def test_an_event_delivered_again_counts_once_and_fires_the_burst_again() -> None:
    """A step that failed before recording its decisions hands its events back to be evaluated again:
    the second delivery is not a second XID, but a burst it completed fires again so it is recorded."""
    result = loader.load_text(BURST.format(scope="gpu"))
    assert result.ruleset is not None
    eng = engine.Engine(result.ruleset)
    first, second = _ev("n1", 0, 0, 13, 1), _ev("n1", 10, 0, 13, 2)
    for ev in (first, second, first, second):
        eng.ingest_event(ev)
    assert _fired(eng, 20) == []  # two XIDs, each delivered twice: not three
    third = _ev("n1", 30, 0, 31, 3)
    eng.ingest_event(third)
    assert _fired(eng, 40) == [("n1", 0)]
    eng.ingest_event(third)  # delivered again
    again = [f for f in eng.evaluate(ruletests.T0 + 50) if f.evidence.get("count") is not None]
    assert [(f.gpu, f.evidence["count"]) for f in again] == [(0, 3)]


def test_repeat_errors_point_at_file_line_column() -> None:
    text = textwrap.dedent(
        """\
        rules:
          - id: r
            description: d
            on_event:
              kind: xid
              repeat: {count: 1, within: 0s, pidz: 2}
            severity: info
        """
    )
    result = loader.load_text(text, "r.yaml")
    messages = [str(d) for d in result.errors]
    assert any(m.startswith("r.yaml:6:") and "count" in m for m in messages), messages
    assert any(m.startswith("r.yaml:6:") and "unknown field 'on_event.repeat.pidz'" in m for m in messages)
    bad_window = loader.load_text(text.replace("count: 1", "count: 2").replace(", pidz: 2", ""), "r.yaml")
    assert [str(d) for d in bad_window.errors] == [
        "r.yaml:6:34: error: repeat.within must be longer than 0s (a window such as 10m)"
    ]


def test_details_match_decoded_log_fields_by_value_and_type() -> None:
    result = loader.load_text(
        "rules:\n  - id: fatal-sxid\n    description: d\n    scope: node\n"
        "    on_event: {kind: sxid, details: {fatal: true}}\n    severity: critical\n"
    )
    assert result.ruleset is not None
    match = result.ruleset.rules[0].on_event
    assert match is not None
    assert match.matches(events.new("n1", "sxid", xid=20034, details={"fatal": True, "link": 30}))
    assert not match.matches(events.new("n1", "sxid", xid=12028, details={"fatal": False}))
    assert not match.matches(events.new("n1", "sxid", xid=12028, details={"fatal": 1}))
    assert not match.matches(events.new("n1", "sxid", xid=12028))


def test_a_details_rule_alone_does_not_cover_its_codes() -> None:
    text = XID_RULE.replace("xid: [79]", "xid: [46], details: {fatal: true}")
    result = loader.load_text(text)
    assert result.ruleset is not None
    assert 46 in {x.code for x in coverage.uncovered(result.ruleset)}


def test_an_event_firing_carries_what_the_kernel_log_added_as_evidence() -> None:
    result = loader.load_text(
        "rules:\n  - id: nvlink\n    description: d\n    on_event: {kind: xid, xid: [74]}\n"
        "    severity: major\n"
    )
    assert result.ruleset is not None
    eng = engine.Engine(result.ruleset)
    details: dict[str, str | int | bool] = {"link": 14, "reg2": 0x10000, "nvlink_class": "link_other"}
    eng.ingest_event(
        events.new("n1", "xid", gpu_index=0, xid=74, source="kmsg", pci_bus_id="0000:18:00", details=details)
    )
    (fired,) = eng.evaluate(ruletests.T0)
    assert fired.evidence["nvlink_class"] == "link_other"
    assert (fired.evidence["link"], fired.evidence["source"], fired.evidence["pci_bus_id"]) == (
        14,
        "kmsg",
        "0000:18:00",
    )
    assert "pid" not in fired.evidence  # the driver named no process
