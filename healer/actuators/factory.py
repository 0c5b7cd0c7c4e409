"""The scheduler actuator a controller uses, chosen by ``controller.actuator``.

Slurm and Kubernetes are imported only when chosen, so a controller with the log actuator never loads
the kubernetes client.
"""

from __future__ import annotations

import typing
from collections.abc import Callable

from healer import config
from healer.actuators import base


def _log(settings: config.ActuatorSettings) -> base.Actuator:
    return base.LogActuator(settings)


def _slurm(settings: config.ActuatorSettings) -> base.Actuator:
    from healer.actuators import slurm

    return slurm.SlurmActuator(settings, base.NodeNames.from_settings(settings))


def _kubernetes(settings: config.ActuatorSettings) -> base.Actuator:
    from healer.actuators import kubernetes

    return kubernetes.KubernetesActuator(settings, base.NodeNames.from_settings(settings))


REGISTRY: dict[config.ActuatorName, Callable[[config.ActuatorSettings], base.Actuator]] = {
    "log": _log,
    "slurm": _slurm,
    "kubernetes": _kubernetes,
}
"""Every scheduler actuator by name (``controller.actuator``, ``healer controller --actuator``,
``healer act``); tests/actuators checks it names exactly ``config.ActuatorName``."""
NAMES: tuple[config.ActuatorName, ...] = typing.get_args(config.ActuatorName)


def build(name: config.ActuatorName, settings: config.ActuatorSettings) -> base.Actuator:
    """The scheduler actuator called ``name``."""
    return REGISTRY[name](settings)


def scheduler(s: config.Settings) -> base.Actuator:
    return build(s.controller.actuator, s.actuators)
