"""Loading rule files: every error at once, each at its file:line:column; warnings; the default pack."""

from __future__ import annotations

import pathlib
import textwrap

import hypothesis
import hypothesis.strategies as st
import pytest

from healer.rules import loader

REPO = pathlib.Path(__file__).resolve().parents[2]

DESIGN_EXAMPLE = textwrap.dedent(
    """\
    rules:
      - id: gpu-overheating
        description: GPU core within 5 C of its slowdown temperature for a minute
        scope: gpu                          # gpu | node
        when: temp_c >= slowdown_temp_c - 5
        for: 60s
        severity: warning                   # info | warning | major | critical
        actions:
          - power_limit: {percent_of_default: 80}
        resolve: {when: temp_c < slowdown_temp_c - 12, for: 5m}
        on_resolve: [restore_power_limit]
      - id: ecc-uncorrectable
        scope: gpu
        when: increase(ecc_dbe_volatile[10m]) > 0
        severity: critical
        actions: [cordon, migrate]
      - id: nvlink-crc-storm
        scope: gpu
        when: rate(nvlink_crc_flit_errors[1m]) > 100
        for: 2m
        severity: major
        actions: [cordon]
      - id: xid-fatal
        scope: gpu
        on_event: {kind: xid, xid: [48, 74, 79, 95, 119, 120, 140]}
        severity: critical
        actions: [cordon, migrate]
      - id: node-silent
        scope: node
        when: absent(telemetry[2m])
        severity: major
        actions: [cordon]
    """
)

BAD = textwrap.dedent(
    """\
    rules:
      - id: a
        when: tmp_c > 5
        severity: warning
      - id: b
        when: "max(temp_c) > 90 and temp_c > 3"
        scope: node
        for: 5x
        severity: bad
        actions: [cordn, {power_limit: {watts: 500, percent_of_default: 80}}]
      - id: a
        when: >
          temp_c > 5 and
          rate(temp_c[5m]) > 1
        severity: info
        foo: 1
    """
)


def test_design_example_loads_as_written() -> None:
    result = loader.load_text(DESIGN_EXAMPLE)
    assert result.ok, [str(d) for d in result.errors]
    assert result.ruleset is not None
    ids = [r.id for r in result.ruleset.rules]
    assert ids == ["gpu-overheating", "ecc-uncorrectable", "nvlink-crc-storm", "xid-fatal", "node-silent"]
    hot = result.ruleset.rules[0]
    assert (hot.for_s, hot.resolve_for_s) == (60.0, 300.0)
    assert hot.actions[0].params == {"percent_of_default": 80.0}
    assert [a.kind for a in hot.on_resolve] == ["restore_power_limit"]


def test_every_error_is_reported_at_once_with_its_place() -> None:
    result = loader.load_text(BAD, "bad.yaml")
    assert not result.ok
    assert result.ruleset is None
    found = {(d.line, d.col): d.message for d in result.errors}
    assert "unknown metric 'tmp_c'" in found[(3, 11)]
    assert "GPU metric 'temp_c' in a node-scope rule" in found[(6, 33)]
    assert "bad duration '5x'" in found[(8, 10)]
    assert "severity" in found[(9, 15)]
    assert "unknown action 'cordn'" in found[(10, 15)]
    assert "exactly one of 'watts' or 'percent_of_default'" in found[(10, 22)]
    assert "duplicate rule id 'a'" in found[(11, 5)]
    assert "rate() is for counters" in found[(14, 12)]  # inside a folded block scalar
    assert found[(16, 5)] == "unknown field 'foo'"
    assert all(str(d).startswith("bad.yaml:") for d in result.errors)


def test_yaml_syntax_error_points_at_the_problem() -> None:
    result = loader.load_text("rules:\n  - id: a\n    when: [unclosed\n", "x.yaml")
    (err,) = result.errors
    assert err.message.startswith("YAML:")
    assert err.line >= 3


def test_duplicate_yaml_keys_are_errors_not_silently_overwritten() -> None:
    text = "rules:\n  - id: a\n    when: temp_c > 1\n    when: temp_c > 2\n    severity: info\n"
    (err,) = loader.load_text(text).errors
    assert (err.line, err.col, err.message) == (4, 5, "duplicate key 'when'")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty file"),
        ("- 1\n", "top level must be a mapping"),
        ("rules: 3\n", "'rules' must be a list"),
        ("rules: []\nextra: 1\n", "unknown top-level key 'extra'"),
        ("rules:\n  - id: a\n    severity: info\n", "needs 'when'"),
        (
            "rules:\n  - id: a\n    when: temp_c > 1\n    on_event: {kind: xid}\n    severity: info\n",
            "either 'when' or 'on_event'",
        ),
        (
            "rules:\n  - id: a\n    on_event: {kind: xid}\n    for: 1m\n    severity: info\n",
            "'for' does not apply",
        ),
        (
            "rules:\n  - id: a\n    on_event: {kind: gpu_lost, xid: [79]}\n    severity: info\n",
            "'xid' only applies",
        ),
        ("rules:\n  - id: A B\n    when: temp_c > 1\n    severity: info\n", "id: String should match"),
        ("rules:\n  - id: a\n    when: temp_c > 1\n", "missing required field 'severity'"),
        (
            "rules:\n  - id: a\n    when: temp_c > 1\n    severity: info\n"
            "    actions: [{notify: {mesage: x}}]\n",
            "bad parameters for notify",
        ),
        (
            "rules:\n  - id: a\n    when: temp_c > 1\n    severity: info\n    actions: [{power_limit: {}}]\n",
            "exactly one of",
        ),
    ],
)
def test_structural_mistakes_are_errors(text: str, message: str) -> None:
    result = loader.load_text(text)
    assert not result.ok
    assert any(message in d.message for d in result.errors), [str(d) for d in result.errors]


def test_lint_warnings_do_not_stop_a_load() -> None:
    text = textwrap.dedent(
        """\
        rules:
          - id: ev
            on_event: {kind: xid, xid: [79]}
            severity: critical
            actions: [cordon]
          - id: cap
            description: caps
            when: temp_c > 80
            severity: warning
            actions: [{power_limit: {watts: 400}}]
        """
    )
    result = loader.load_text(text)
    assert result.ok
    messages = [w.message for w in result.warnings]
    assert any("has actions but no way to resolve" in m for m in messages)
    assert any("caps power but never restores it" in m for m in messages)
    assert any("has no description" in m for m in messages)


def test_duplicate_ids_across_files_name_both_places(tmp_path: pathlib.Path) -> None:
    one = "rules:\n  - id: same\n    description: d\n    when: temp_c > 1\n    severity: info\n"
    (tmp_path / "a.yaml").write_text(one)
    (tmp_path / "b.yml").write_text(one)
    (tmp_path / "notes.txt").write_text("not a rule file")
    result = loader.load_paths([tmp_path])
    (err,) = result.errors
    assert err.path.endswith("b.yml")
    assert "first at" in err.message
    assert "a.yaml:2" in err.message


def test_a_bad_file_rejects_the_whole_set_so_the_caller_keeps_the_old_one(tmp_path: pathlib.Path) -> None:
    (tmp_path / "good.yaml").write_text(
        "rules:\n  - id: g\n    description: d\n    when: temp_c > 1\n    severity: info\n"
    )
    (tmp_path / "bad.yaml").write_text("rules:\n  - id: b\n    when: temp_c >\n    severity: info\n")
    result = loader.load_paths([tmp_path])
    assert result.ruleset is None
    assert [e.path for e in result.errors] == [str(tmp_path / "bad.yaml")]


def test_no_files_is_an_error(tmp_path: pathlib.Path) -> None:
    assert "no rule files found" in loader.load_paths([tmp_path]).errors[0].message


def test_default_pack_loads_without_errors_or_warnings() -> None:
    result = loader.load_paths([REPO / "rules"])
    assert [str(d) for d in result.diagnostics] == []
    assert result.ruleset is not None
    rules = result.ruleset.rules
    assert len(rules) >= 15
    assert all(r.description for r in rules)
    assert {r.id for r in rules} >= {
        "ecc-dbe-new",
        "xid-fatal",
        "node-silent",
        "gpu-missing",
        "nvlink-crc-storm",
    }


@hypothesis.given(st.text(max_size=200))
@hypothesis.settings(max_examples=200, deadline=None)
def test_any_text_loads_or_reports_errors_without_raising(text: str) -> None:
    result = loader.load_text(text)
    assert result.ok or result.errors


ALIAS_BOMB = (
    "a: &a [1,1,1,1,1,1,1,1,1,1]\n"
    + "".join(f"{n}: &{n} [{', '.join(['*' + p] * 10)}]\n" for p, n in zip("abcd", "bcde", strict=True))
    + "rules: [*e, *e]\n"
)


@pytest.mark.parametrize(
    "text",
    [
        "rules: &a [*a]\n",
        "rules:\n  - &r {id: a, severity: info, when: *r}\n",
        "rules:\n  - !!python/object:os.system {}\n",
        "rules:\n  - id: a\n    severity: info\n    when: 'temp_c > 1'\n    actions: *nope\n",
        "\x00\x01",
        ALIAS_BOMB,
    ],
)
def test_hostile_yaml_is_an_error_not_a_crash(text: str) -> None:
    assert not loader.load_text(text).ok
