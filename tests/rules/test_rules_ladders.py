"""Recovery ladders in rule files: parsed with the rules, every mistake at its file:line:col."""

from __future__ import annotations

import textwrap

from healer.rules import loader

RULE = """\
rules:
  - id: xid-fatal
    scope: gpu
    on_event: {kind: xid, xid: [48]}
    severity: critical
    actions: [cordon, migrate]
"""


def _errors(text: str) -> list[tuple[int, int, str]]:
    result = loader.load_text(textwrap.dedent(text), "l.yaml")
    return [(d.line, d.col, d.message) for d in result.diagnostics if d.severity == "error"]


def test_a_ladder_beside_its_rule_is_loaded_with_its_defaults() -> None:
    result = loader.load_text(
        RULE + "ladders:\n  - id: fatal\n    rules: [xid-fatal]\n    steps: [reset_gpu, reboot_node]\n"
    )
    assert result.ok
    assert result.ruleset is not None
    lad = result.ruleset.ladder_for("xid-fatal")
    assert lad is not None
    assert lad.id == "fatal"
    assert lad.steps == ("reset_gpu", "reboot_node")
    assert (lad.soak_s, lad.dcgm_level, lad.repeat_count, lad.repeat_within_s) == (600.0, 1, 2, 30 * 86400.0)
    assert result.ruleset.ladder_for("other") is None


def test_a_ladder_naming_an_unknown_rule_is_an_error_at_the_ladder() -> None:
    errs = _errors(RULE + "ladders:\n  - id: fatal\n    rules: [xid-fatl]\n    steps: [reset_gpu]\n")
    assert errs == [(8, 5, "ladder 'fatal' names rule 'xid-fatl', which no rule file defines")]


def test_bad_ladders_report_every_error_with_its_position() -> None:
    text = RULE + textwrap.dedent("""\
        ladders:
          - id: a
            rules: [xid-fatal]
            steps: [reboot_node, reset_gpu]
          - id: b
            rules: [xid-fatal]
            steps: [reset_gpu]
            soak: 10 minutes
          - id: c
            rules: [xid-fatal]
            steps: [reset_gpu]
            contact_support: true
          - id: d
            rules: [xid-fatal]
          - id: e
            rules: [xid-fatal]
            steps: [power_cycle]
            colour: red
        """)
    errs = _errors(text)
    lines = [(line, col) for line, col, _ in errs]
    messages = " | ".join(m for _, _, m in errs)
    assert (8, 5) in lines
    assert "in the order reset_gpu, reset_port, reboot_node" in messages
    assert (14, 11) in lines
    assert "soak" in messages
    assert (15, 5) in lines
    assert "a contact_support ladder has no steps" in messages
    assert (19, 5) in lines
    assert "needs steps (reset_gpu, reset_port, reboot_node) or contact_support: true" in messages
    assert (23, 13) in lines
    assert "steps.0" in messages
    assert (24, 5) in lines
    assert "unknown field 'colour'" in messages


def test_one_rule_belongs_to_one_ladder_and_ladder_ids_are_unique() -> None:
    text = RULE + textwrap.dedent("""\
        ladders:
          - id: a
            rules: [xid-fatal]
            steps: [reset_gpu]
          - id: a
            rules: [xid-fatal]
            contact_support: true
        """)
    messages = [m for _, _, m in _errors(text)]
    assert "duplicate ladder id 'a' (first at l.yaml:8)" in messages
    assert "rule 'xid-fatal' is in ladder 'a' already (one ladder per rule)" in messages


def test_a_file_of_ladders_only_loads_beside_the_rules_it_names(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "xid.yaml").write_text(RULE)
    (tmp_path / "ladders.yaml").write_text(
        "ladders:\n  - id: cs\n    rules: [xid-fatal]\n    contact_support: true\n"
    )
    result = loader.load_paths([tmp_path])
    assert result.ok
    assert result.ruleset is not None
    assert [lad.id for lad in result.ruleset.ladders] == ["cs"]
    assert len(result.ruleset.rules) == 1


def test_unknown_top_level_keys_are_still_refused() -> None:
    errs = _errors(RULE + "ladder:\n  - id: x\n")
    assert errs == [(7, 1, "unknown top-level key 'ladder' (only 'rules' and 'ladders' are allowed)")]


def test_the_default_pack_declares_its_ladders() -> None:
    result = loader.load_paths(["rules"])
    assert result.ok
    assert result.ruleset is not None
    rs = result.ruleset
    for rule_id, ladder_id in [
        ("xid-fatal", "reset-then-reboot"),
        ("xid-reset-required", "reset-then-reboot"),
        ("gpu-lost-event", "reboot"),
        ("row-remap-failure", "contact-support"),
        ("retired-pages-limit", "contact-support"),
    ]:
        lad = rs.ladder_for(rule_id)
        assert lad is not None, rule_id
        assert lad.id == ladder_id, rule_id
