"""docs/rules.md's default-pack table is the rule files' own account of themselves."""

from __future__ import annotations

import pathlib

import pytest

from healer.rules import loader, packdoc

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_default_pack_table_in_docs_matches_the_rule_files() -> None:
    page = (ROOT / "docs" / "rules.md").read_text()
    expected = packdoc.update(page, packdoc.table(packdoc.load(ROOT / "rules")))
    assert page == expected, "docs/rules.md drifted from rules/*.yaml: run `make schemas`"


def test_the_table_shows_each_rule_s_hold_as_its_file_writes_it() -> None:
    text = """
rules:
  - id: slow
    scope: gpu
    when: anomaly_score >= 0.9
    for: 5m
    severity: warning
    actions: [notify]
  - id: xid
    scope: gpu
    on_event: {kind: xid, xid: [79, 48]}
    severity: critical
    actions: [cordon, migrate]
"""
    result = loader.load_text(text, "pack/anomaly.yaml")
    assert result.ruleset is not None
    rows = packdoc.table(result.ruleset).splitlines()[2:]
    assert rows == [
        "| anomaly | `slow` | `anomaly_score >= 0.9`, for 5m | warning | notify | \u2013 |",
        "| anomaly | `xid` | `on xid [48, 79]` | critical | cordon, migrate | \u2013 |",
    ]


def test_the_table_shows_an_episode_s_resolve_and_cooldown_as_the_file_writes_them() -> None:
    text = """
rules:
  - id: episode
    scope: gpu
    when: anomaly_score >= 0.9
    for: 2m
    resolve: {when: anomaly_score < 0.6, for: 15m}
    cooldown: 1h
    severity: warning
    actions: [notify]
"""
    result = loader.load_text(text, "pack/anomaly.yaml")
    assert result.ruleset is not None
    (row,) = packdoc.table(result.ruleset).splitlines()[2:]
    assert "`anomaly_score >= 0.9`, for 2m; resolves when `anomaly_score < 0.6` for 15m; cooldown 1h" in row


def test_a_page_without_the_markers_is_an_error() -> None:
    with pytest.raises(ValueError, match="markers"):
        packdoc.update("# no table here\n", "| x |\n")
