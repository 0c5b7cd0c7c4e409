"""Each vocabulary is declared once and compared through its members (#40, "one vocabulary per fact"):
a mode, an action's status, a firing's status, a scope, an incident's change and state, and the agent's
result status are ``StrEnum``s (``incidents.Mode``, ``incidents.ActionStatus``, ``rules.engine.Status``,
``fields.Scope``, ``incidents.Change``, ``incidents.IncidentState``, ``commands.ResultStatus``), and no
module outside the one that declares a vocabulary compares a value with one of its words as a string
literal, as tests/rules/test_action_catalog.py keeps kinds."""

from __future__ import annotations

import ast
import pathlib

import pydantic
import pytest

import healer
from healer import config
from healer.actuators import base
from healer.rules import engine
from healer.schemas import commands, fields, incidents

ROOT = pathlib.Path(healer.__file__).parent

SHARED_CHANGES = frozenset({"action"})
VOCABULARIES: dict[str, tuple[pathlib.Path, frozenset[str]]] = {
    "mode": (ROOT / "schemas" / "incidents.py", frozenset(incidents.Mode)),
    "action status": (ROOT / "schemas" / "incidents.py", frozenset(incidents.ActionStatus)),
    "firing status": (ROOT / "rules" / "engine.py", frozenset(engine.Status) - {"resolved"}),
    "incident change": (ROOT / "schemas" / "incidents.py", frozenset(incidents.Change) - SHARED_CHANGES),
    "agent result status": (ROOT / "schemas" / "commands.py", frozenset(commands.ResultStatus)),
    "incident state": (ROOT / "schemas" / "incidents.py", frozenset(incidents.IncidentState)),
}
"""Each vocabulary's declaring module and the words no other module may compare with. ``action`` is too
common a word to look for everywhere: it is looked for only where a change is compared
(``named_comparisons``). ``resolved`` is a firing's status as well as an incident's state and change:
the incident state's entry finds it compared anywhere."""

STILL_COMPARED: frozenset[str] = frozenset()
"""Comparisons left as they are, each with its reason; the list only shrinks (an entry that is no longer
found fails the test)."""


def word_comparisons(source: str, words: frozenset[str]) -> list[tuple[int, str]]:
    """``(line, word)`` for every comparison in ``source`` with one of ``words`` as a string literal
    (``x == "enforce"``, ``s in ("done", "skipped")``, ``"fired" != f.status``)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        for side in (node.left, *node.comparators):
            elts = side.elts if isinstance(side, ast.Tuple | ast.List | ast.Set) else [side]
            for e in elts:
                if isinstance(e, ast.Constant) and isinstance(e.value, str) and e.value in words:
                    found.append((node.lineno, e.value))
    return found


def test_the_scanner_finds_word_comparisons() -> None:
    """The check below would see the shapes that used to be there."""
    words = frozenset({"enforce", "observe", "done", "skipped", "fired"})
    src = (
        'if mode == "enforce": pass\n'
        'if s in ("done", "skipped"): pass\n'
        'if "fired" != f.status: pass\n'
        'x = a if m != "observe" else b\n'
    )
    assert word_comparisons(src, words) == [
        (1, "enforce"),
        (2, "done"),
        (2, "skipped"),
        (3, "fired"),
        (4, "observe"),
    ]
    assert (
        word_comparisons(
            'if m.acts: pass\nx = {"done": 1}\nif f.status == engine.Status.FIRED: pass\n', words
        )
        == []
    )


def test_no_vocabulary_word_is_compared_outside_its_declaration() -> None:
    found: set[str] = set()
    offenders: list[str] = []
    for path in sorted(ROOT.rglob("*.py")):
        source = path.read_text()
        for name, (home, words) in VOCABULARIES.items():
            if path == home:
                continue
            for line, word in word_comparisons(source, words):
                where = f"{path.relative_to(ROOT.parent)}: {word}"
                if where in STILL_COMPARED:
                    found.add(where)
                else:
                    offenders.append(f"{path.relative_to(ROOT.parent)}:{line}: {name} {word!r}")
    assert offenders == [], "compare with the enum's members or properties"
    assert sorted(STILL_COMPARED - found) == [], "no longer compared: take it off STILL_COMPARED"


def _operands(node: ast.Compare) -> list[ast.expr]:
    sides = (node.left, *node.comparators)
    return [
        e
        for side in sides
        for e in (side.elts if isinstance(side, ast.Tuple | ast.List | ast.Set) else [side])
    ]


def scope_comparisons(source: str) -> list[tuple[int, str]]:
    """``(line, word)`` for every comparison of something named ``scope`` or ``level`` (a rule's scope, a
    metric's or an expression's level) with ``gpu``, ``node`` or ``port`` as a string literal; the words
    alone are too common (field names, label keys) to look for everywhere."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        operands = _operands(node)
        if any(
            (isinstance(e, ast.Attribute) and e.attr in SCOPE_NAMES)
            or (isinstance(e, ast.Name) and e.id in SCOPE_NAMES)
            for e in operands
        ):
            found += [
                (node.lineno, e.value)
                for e in operands
                if isinstance(e, ast.Constant) and isinstance(e.value, str) and e.value in SCOPES
            ]
    return found


SCOPE_NAMES = frozenset({"scope", "level"})
SCOPES = frozenset(fields.Scope)


def named_comparisons(source: str, names: frozenset[str], words: frozenset[str]) -> list[tuple[int, str]]:
    """``(line, word)`` for every comparison of something called one of ``names`` with one of ``words``
    as a string literal (``ev.change == "resolved"``, ``change in ("opened", "updated")``)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        operands = _operands(node)
        if any(
            (isinstance(e, ast.Attribute) and e.attr in names) or (isinstance(e, ast.Name) and e.id in names)
            for e in operands
        ):
            found += [
                (node.lineno, e.value)
                for e in operands
                if isinstance(e, ast.Constant) and isinstance(e.value, str) and e.value in words
            ]
    return found


CHANGE_NAMES = frozenset({"change"})
CHANGES = frozenset(incidents.Change)


def test_the_change_scanner_finds_change_comparisons() -> None:
    src = (
        'if ev.change == "resolved": pass\n'
        'if change in ("opened", "updated"): pass\n'
        'if inc.state == "resolved": pass\n'
        "if ev.change is incidents.Change.ESCALATED: pass\n"
    )
    assert named_comparisons(src, CHANGE_NAMES, CHANGES) == [(1, "resolved"), (2, "opened"), (2, "updated")]


def test_no_incident_change_is_compared_by_name() -> None:
    """An incident event's change is ``incidents.Change`` (#40): compared through its members."""
    offenders = [
        f"{path.relative_to(ROOT.parent)}:{line}: {word}"
        for path in sorted(ROOT.rglob("*.py"))
        if path != ROOT / "schemas" / "incidents.py"
        for line, word in named_comparisons(path.read_text(), CHANGE_NAMES, CHANGES)
    ]
    assert offenders == [], "compare with schemas.incidents.Change's members"


def test_a_change_reads_and_writes_as_its_word() -> None:
    """The CloudEvents type carries the same words as before the enum."""
    for change in incidents.Change:
        assert incidents.event_type(change) == f"io.healer.incident.{change.value}.v1"
    data = incidents.IncidentData(
        incident_id="i", rule_id="r", severity="info", node="n1", state="open", summary="s", mode="enforce"
    )
    ev = incidents.build(event_id="e", cluster="c", change=incidents.Change.ESCALATED, data=data, ts=1.0)
    assert ev.change is incidents.Change.ESCALATED
    assert ev.type == "io.healer.incident.escalated.v1"


def test_an_incident_state_reads_and_writes_as_its_word() -> None:
    """``data.state`` on the wire and the KV's incident documents carry the same words as before the
    enum, and a stored word comes back as its member."""
    for state in incidents.IncidentState:
        data = incidents.IncidentData(
            incident_id="i",
            rule_id="r",
            severity="info",
            node="n1",
            state=state.value,
            summary="s",
            mode="observe",
        )
        assert data.state is state
        assert f'"state":"{state.value}"' in data.model_dump_json()
    schema = incidents.IncidentData.model_json_schema()["properties"]["state"]
    assert schema == {"enum": ["open", "resolved", "escalated"], "title": "State", "type": "string"}
    with pytest.raises(pydantic.ValidationError):
        incidents.IncidentData(
            incident_id="i",
            rule_id="r",
            severity="info",
            node="n1",
            state="closed",
            summary="s",
            mode="observe",
        )


def test_a_new_incident_state_comparison_is_found() -> None:
    """What the vocabulary check above would say of the shapes that used to be there."""
    words = VOCABULARIES["incident state"][1]
    src = (
        'if inc.state == "resolved": pass\n'
        'x = [i for i in incs if i.state != "open"]\n'
        'if d.state in ("escalated", "resolved"): pass\n'
        "if inc.state is incidents.IncidentState.RESOLVED: pass\n"
    )
    assert sorted(word_comparisons(src, words)) == [
        (1, "resolved"),
        (2, "open"),
        (3, "escalated"),
        (3, "resolved"),
    ]


def test_the_scope_scanner_finds_scope_comparisons() -> None:
    src = (
        'if rule.scope == "gpu": pass\n'
        'if {left.level, right.level} == {"gpu", "port"}: pass\n'
        'if scope != "node": pass\n'
        'if "port" in want.model_fields_set: pass\n'
    )
    assert scope_comparisons(src) == [(1, "gpu"), (2, "gpu"), (2, "port"), (3, "node")]


def test_no_scope_is_compared_by_name() -> None:
    found = {
        (f"{path.relative_to(ROOT.parent)}: {word}", line)
        for path in sorted(ROOT.rglob("*.py"))
        if path != ROOT / "schemas" / "fields.py"
        for line, word in scope_comparisons(path.read_text())
    }
    offenders = sorted(f"{where} (line {line})" for where, line in found if where not in SCOPE_STILL_COMPARED)
    assert offenders == [], "compare with schemas.fields.Scope's members"
    assert sorted(SCOPE_STILL_COMPARED - {where for where, _ in found}) == [], (
        "take it off SCOPE_STILL_COMPARED"
    )


SCOPE_STILL_COMPARED = frozenset({
    # The simulator's fault kinds keep their own gpu|node scope (sim.faults.Scope), not yet the enum.
    "healer/evals/straggler_sim_eval.py: gpu",
    "healer/sim/injector.py: gpu",
    "healer/sim/scenarios.py: node",
})  # fmt: skip


def test_mode_properties() -> None:
    """What each mode does, where a name comparison used to stand."""
    assert [m for m in incidents.Mode if m.plans] == [incidents.Mode.ENFORCE, incidents.Mode.DRY_RUN]
    assert [m for m in incidents.Mode if m.acts] == [incidents.Mode.ENFORCE]
    assert [m for m in incidents.Mode if m.dry_run] == [incidents.Mode.DRY_RUN]


@pytest.mark.parametrize("mode", list(incidents.Mode))
def test_a_mode_reads_and_writes_as_its_word(mode: incidents.Mode) -> None:
    """Settings, the CLI and the wire carry the same strings as before the enum."""
    assert config.ControllerSettings(mode=mode.value).mode is mode
    assert f"{mode}" == str(mode) == mode.value
    data = incidents.IncidentData(
        incident_id="i", rule_id="r", severity="info", node="n1", state="open", summary="s", mode=mode.value
    )
    assert data.mode is mode
    assert f'"mode":"{mode.value}"' in data.model_dump_json()


def test_an_actuator_returns_an_outcome_status_and_items_may_be_skipped() -> None:
    assert frozenset(incidents.ActionStatus) - {incidents.ActionStatus.SKIPPED} == incidents.OUTCOMES
    assert base.ItemResult(item="pod", status="skipped").status is incidents.ActionStatus.SKIPPED
    for status in incidents.OUTCOMES:
        assert base.ActionOutcome(status=status.value).status is status
    with pytest.raises(pydantic.ValidationError, match="never skipped"):
        base.ActionOutcome(status="skipped")
    with pytest.raises(pydantic.ValidationError):
        base.ActionOutcome(status="applied")
