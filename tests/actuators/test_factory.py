"""`controller.actuator` picks the scheduler actuator, with the node-name mapping applied."""

from __future__ import annotations

import typing

import pytest

from healer import config
from healer.actuators import factory
from healer.cli import act_cmd


@pytest.mark.parametrize(("kind", "cls"), [("log", "LogActuator"), ("slurm", "SlurmActuator"),
                                           ("kubernetes", "KubernetesActuator")])  # fmt: skip
def test_controller_setting_picks_the_actuator(kind: str, cls: str) -> None:
    s = config.Settings(
        controller=config.ControllerSettings(actuator=kind),
        actuators=config.ActuatorSettings(node_name_template="{short}"),
    )
    actuator = factory.scheduler(s)
    assert type(actuator).__name__ == cls
    names = getattr(actuator, "names", None)
    if names is not None:
        assert names("gpu01.dc1.example") == "gpu01"


def test_the_registry_names_exactly_the_configurable_actuators() -> None:
    """One list of names: the registry builds each, config and ``healer act`` offer the same ones."""
    assert set(factory.REGISTRY) == set(typing.get_args(config.ActuatorName))
    assert set(act_cmd.SYSTEMS) == set(factory.NAMES)
