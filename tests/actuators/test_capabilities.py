"""A scheduler's optional capabilities are declared Protocols (#40 item 5), not ``hasattr`` probes: each
shipped actuator has exactly the capabilities the controller relies on, and the controller's code asks
``isinstance``, so a renamed method shows here instead of silently switching a feature off."""

from __future__ import annotations

import ast
import pathlib

import pytest

import healer
from healer import config
from healer.actuators import base, factory

CAPABILITIES = (base.LabelSource, base.JobSource, base.PodSource, base.RebootReporter, base.AgentRouted)

EXPECTED = {
    "log": set(),
    "slurm": {"LabelSource", "JobSource", "RebootReporter"},
    "kubernetes": {"LabelSource", "PodSource", "RebootReporter", "AgentRouted"},
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_scheduler_declares_what_it_can_do(name: config.ActuatorName) -> None:
    actuator = factory.build(name, config.ActuatorSettings())
    assert {p.__name__ for p in CAPABILITIES if isinstance(actuator, p)} == EXPECTED[name]


def test_the_controller_never_probes_a_scheduler_with_hasattr() -> None:
    root = pathlib.Path(healer.__file__).parent
    probes = []
    for path in [*root.joinpath("controller").rglob("*.py"), root / "cli" / "controller_cmd.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("hasattr", "getattr")
                and "scheduler" in ast.unparse(node.args[0])
            ):
                probes.append(f"{path.relative_to(root)}:{node.lineno}")
    assert probes == []
