"""``healer rules check|test|schema`` exit codes and output, and the default pack's own unit tests."""

from __future__ import annotations

import json
import pathlib
import textwrap

import pytest

from healer import cli
from healer.rules import schema

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_check_passes_the_default_pack(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["rules", "check", str(REPO / "rules")]) == 0
    assert "0 errors, 0 warnings" in capsys.readouterr().out


def test_check_prints_every_error_and_exits_1(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("rules:\n  - id: a\n    when: tmp_c > 1\n    severity: nope\n    actions: [cordn]\n")
    assert cli.main(["rules", "check", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"{path}:3:11: error: unknown metric 'tmp_c'" in out
    assert f"{path}:4:15: error: severity" in out
    assert f"{path}:5:15: error: unknown action 'cordn'" in out
    assert "FAILED" in out
    assert "3 errors" in out


def test_check_strict_fails_on_warnings(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "w.yaml"
    path.write_text("rules:\n  - id: a\n    when: temp_c > 1\n    severity: info\n")
    assert cli.main(["rules", "check", str(path)]) == 0
    assert cli.main(["rules", "check", "--strict", str(path)]) == 1


def test_default_pack_unit_tests_pass(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["rules", "test", str(REPO / "rules" / "tests")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert " 0 failed" in out
    for name in ("thermal", "memory", "xid", "nvlink", "pcie", "power", "telemetry", "anomaly"):
        assert (REPO / "rules" / f"{name}.yaml").exists()
        assert f"{name}_test.yaml" in out


def test_failing_rule_test_prints_a_diff_and_exits_1(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "hot.yaml").write_text(
        "rules:\n  - {id: hot, description: d, when: 'temp_c > 80', for: 20s, severity: warning,"
        " actions: [notify]}\n"
    )
    (tmp_path / "hot_test.yaml").write_text(
        textwrap.dedent(
            """\
            rule_files: [hot.yaml]
            interval: 10s
            tests:
              - name: fires too early?
                nodes:
                  n1:
                    gpus: 2
                    series:
                      gpu1: {temp_c: '90x10'}
                expect:
                  - at: 10s
                    firing:
                      - {rule: hot, node: n1, gpu: 1}
                  - at: 30s
                    firing:
                      - {rule: hot, node: n1, gpu: 0}
            """
        )
    )
    assert cli.main(["rules", "test", str(tmp_path / "hot_test.yaml")]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out
    assert "fires too early?" in out
    assert "at 10s:" in out
    assert "- missing:    {rule: hot, node: n1, gpu: 1}" in out
    assert "at 30s:" in out
    assert "+ unexpected: {rule: hot, node: n1, gpu: 1, actions: [notify]}" in out
    assert "0 passed, 1 failed" in out


def test_rule_test_with_broken_rule_file_fails(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "r.yaml").write_text("rules:\n  - {id: x, when: 'temp_c >', severity: info}\n")
    (tmp_path / "t.yaml").write_text("rule_files: [r.yaml]\ntests: []\n")
    assert cli.main(["rules", "test", str(tmp_path / "t.yaml")]) == 1
    assert "expected a number" in capsys.readouterr().out


def test_schema_matches_the_committed_copy_and_lists_actions(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["rules", "schema"]) == 0
    text = capsys.readouterr().out
    assert text == (REPO / "docs" / "schemas" / "rules.v1.json").read_text()
    doc = json.loads(text)
    assert doc["$id"] == schema.SCHEMA_ID
    actions = json.dumps(doc["$defs"]["RuleSpec"]["properties"]["actions"])
    assert "power_limit" in actions
    assert "percent_of_default" in actions
    assert "reset_gpu" in actions
