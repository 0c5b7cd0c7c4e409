"""The action catalogue is the one place that knows what each kind is (#25): code elsewhere asks it for a
property (reboots, acts on ports, caps power, the agent command that carries it out) instead of comparing
the kind's name with a string."""

from __future__ import annotations

import ast
import pathlib

import pytest

import healer
from healer import actions, config
from healer.actuators import base, gpu_reset, power
from healer.agent import exposition
from healer.bus.memory import MemoryBus
from healer.schemas import commands

ROOT = pathlib.Path(healer.__file__).parent


def kind_comparisons(source: str) -> list[tuple[int, str]]:
    """``(line, kind)`` for every comparison in ``source`` with a catalogue kind's name as a string
    literal (``x == "reboot_node"``, ``k in ("drain", "migrate")``)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        for side in (node.left, *node.comparators):
            elts = side.elts if isinstance(side, ast.Tuple | ast.List | ast.Set) else [side]
            for e in elts:
                if isinstance(e, ast.Constant) and isinstance(e.value, str) and e.value in actions.CATALOG:
                    found.append((node.lineno, e.value))
    return found


def test_the_scanner_finds_kind_comparisons() -> None:
    """The check below would see the shapes that used to be there."""
    src = (
        'if a.kind == "reset_gpu": pass\n'
        'if k in ("drain", "migrate"): pass\n'
        'if "reboot_node" in steps: pass\n'
    )
    assert kind_comparisons(src) == [(1, "reset_gpu"), (2, "drain"), (2, "migrate"), (3, "reboot_node")]
    assert kind_comparisons('if x == "xid": pass\nif actions.spec(k).reboots: pass\n') == []


def test_no_kind_is_compared_by_name_outside_the_catalogue() -> None:
    offenders = [
        f"{path.relative_to(ROOT.parent)}:{line}: {kind}"
        for path in sorted(ROOT.rglob("*.py"))
        if path != ROOT / "actions.py"
        for line, kind in kind_comparisons(path.read_text())
    ]
    assert offenders == []


def test_agent_commands_are_the_wire_commands() -> None:
    """Every command the agent takes is some kind's ``agent_command``, and each actuator that talks to
    the agent carries out exactly the kinds whose command it sends."""
    named = {k.agent_command.name for k in actions.CATALOG.values() if k.agent_command is not None}
    assert named == set(actions.AGENT_COMMANDS)
    for k in actions.CATALOG.values():
        if k.actuator in (actions.Actuator.POWER, actions.Actuator.GPU):
            assert k.agent_command is not None, k.name
    assert named == commands.RECOVERY | power.POWER_COMMANDS
    assert not commands.RECOVERY & power.POWER_COMMANDS


@pytest.mark.parametrize(
    "kind", sorted(k.name for k in actions.CATALOG.values() if k.agent_command and k.agent_command.recovery)
)
def test_the_gpu_actuator_sends_each_kinds_own_command(kind: str) -> None:
    actuator = gpu_reset.GpuRecoveryActuator(
        MemoryBus(), settings=config.ActuatorSettings(), clock=lambda: 1000.0
    )
    spec = actions.spec(kind)
    request = base.ActionRequest(
        kind=kind,
        node="node-1",
        gpu_index=2 if spec.per_gpu else None,
        incident_id="inc-1",
        fencing_token=3,
        params={"ports": ["mlx5_0/1"]} if spec.per_port else {},
    )
    command = actuator.command(request)
    assert spec.agent_command is not None
    assert command.action == spec.agent_command.name
    assert command.gpu_index == (2 if spec.per_gpu else None)
    assert command.ports == (["mlx5_0/1"] if spec.per_port else [])
    assert command.id == f"inc-1:{kind}" + (":2" if spec.per_gpu else "")


def test_the_gpu_actuator_refuses_what_it_does_not_carry_out() -> None:
    actuator = gpu_reset.GpuRecoveryActuator(MemoryBus(), clock=lambda: 1000.0)
    kinds: tuple[base.RequestKind, ...] = ("cordon", "power_limit")
    for kind in kinds:
        request = base.ActionRequest(kind=kind, node="node-1", incident_id="i", fencing_token=1)
        with pytest.raises(healer.errors.PermanentError, match="does not do"):
            actuator.command(request)


def test_properties_that_replaced_names() -> None:
    """What the properties say, kind by kind, where a name comparison used to stand."""
    assert {k.name for k in actions.CATALOG.values() if k.reboots} == {"reboot_node"}
    assert {k.name for k in actions.CATALOG.values() if k.drains} == {"drain", "migrate"}
    assert {k.name for k in actions.CATALOG.values() if k.caps_power} == {"power_limit"}
    assert {k.name for k in actions.CATALOG.values() if k.reads_identity} == {"validate"}
    assert {k.name for k in actions.CATALOG.values() if k.undoes_cordon} == {
        k.name for k in actions.CATALOG.values() if k.scheduler_verb == "uncordon"
    }


def test_the_agent_counts_every_registered_command_from_zero() -> None:
    """``healer_agent_commands_total`` has a zero series for each command the registry names (a healthy
    node shows 0, not "No data"), and for nothing else."""
    registry = exposition.AgentMetrics().registry
    labelled = {
        (s.labels["action"], s.labels["status"])
        for m in registry.collect()
        if m.name == "healer_agent_commands"
        for s in m.samples
        if s.name == "healer_agent_commands_total"
    }
    assert labelled == {(a, s.value) for a in actions.AGENT_COMMANDS for s in commands.ResultStatus}
