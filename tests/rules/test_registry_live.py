"""The tables other modules keep of the action registry read it live (#40): a kind registered after
every module was imported (a test's, a plugin's) is in the agent's command sets, the actuators' tables,
the recovery rungs, the ladder's phases and the published schemas, and gone again once unregistered."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from healer import actions
from healer.actuators import power
from healer.archive import breakdown
from healer.cli import act_cmd
from healer.controller.remediation import ladder
from healer.demo import watch
from healer.rules import recovery, spec
from healer.schemas import commands

TOY_RUNG = "toy_flash_firmware"
TOY_CAP = "toy_cap"
TOY_NOTE = "toy_note"


@pytest.fixture
def toys() -> Iterator[None]:
    before = list(actions.CATALOG.values())
    actions.register(
        actions.ActionKind(
            TOY_RUNG, actions.NoParams, "a toy rung: flash the GPU's firmware", actuator=actions.Actuator.GPU,
            ladder_only=True, agent_command=actions.AgentCommand(
                "toy_flash", gpu="required", ports="required", recovery=True
            ),
            rung=actions.Rung(7, "REBOOTING", 60.0),
        )
    )  # fmt: skip
    actions.register(
        actions.ActionKind(
            TOY_CAP, actions.PowerLimitParams, "a toy power cap", "restore_power_limit",
            actuator=actions.Actuator.POWER, caps_power=True,
            agent_command=actions.AgentCommand("toy_set_limit", sets_limit=True),
        )
    )  # fmt: skip
    actions.register(actions.ActionKind(TOY_NOTE, actions.NoParams, "a toy note", published_only=True))
    try:
        yield
    finally:
        for name in (TOY_RUNG, TOY_CAP, TOY_NOTE):
            actions.unregister(name)
        assert list(actions.CATALOG.values()) == before


def test_a_kind_registered_after_import_is_in_every_derived_table(toys: None) -> None:
    assert "toy_flash" in commands.RECOVERY
    assert "toy_flash" in commands.NEEDS_PORTS
    assert "toy_set_limit" in commands.SETS_LIMIT
    assert "toy_set_limit" in power.POWER_COMMANDS
    assert not commands.RECOVERY & power.POWER_COMMANDS
    assert TOY_CAP in watch.CAPS
    assert TOY_NOTE in act_cmd.KINDS
    assert recovery.RUNGS[-1] == breakdown.RUNGS[-1] == TOY_RUNG
    assert ladder.step_kind(TOY_RUNG) == TOY_RUNG
    assert ladder.Phase.REBOOTING in ladder.rung_phases()
    assert ladder.expected(ladder.Phase.REBOOTING) == ladder.expected(ladder.Phase.RESETTING)


def test_a_kind_registered_after_import_is_in_the_published_schemas(toys: None) -> None:
    action = commands.Command.model_json_schema()["properties"]["action"]
    assert action["enum"][-2:] == ["toy_flash", "toy_set_limit"]
    steps = recovery.LadderSpec.model_json_schema()["properties"]["steps"]
    assert TOY_RUNG in str(steps)
    rule_actions = str(spec.RuleSpec.model_json_schema())
    assert TOY_CAP in rule_actions
    assert TOY_RUNG not in rule_actions  # a ladder-only kind is no rule's action
    assert (
        recovery.LadderSpec.model_validate(
            {"id": "l", "rules": ["r"], "steps": ["reset_gpu", TOY_RUNG]}
        ).steps[-1]
        == TOY_RUNG
    )


def test_an_unregistered_kind_leaves_them_again() -> None:
    assert "toy_flash" not in commands.RECOVERY
    assert TOY_NOTE not in act_cmd.KINDS
    assert TOY_RUNG not in recovery.RUNGS
    with pytest.raises(ValueError, match="no ladder step"):
        ladder.step_kind(TOY_RUNG)
    assert "toy_flash" not in commands.Command.model_json_schema()["properties"]["action"]["enum"]


def test_a_view_reads_like_a_set() -> None:
    """``actions.View`` answers ``in``, iteration, length and set operations from the registry."""
    rule_kinds = actions.kinds_where(lambda k: not k.ladder_only)
    assert list(rule_kinds) == list(actions.RULE_KINDS)
    assert len(rule_kinds) == len(actions.RULE_KINDS)
    assert set(rule_kinds) == set(actions.RULE_KINDS)
    assert rule_kinds | {"x"} == frozenset({*actions.RULE_KINDS, "x"})
    assert isinstance(rule_kinds & {"cordon"}, frozenset)
