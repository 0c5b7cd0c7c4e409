"""The scheduler actuator a controller uses, chosen by ``controller.actuator``.

Slurm and Kubernetes are imported only when chosen, so a controller with the log actuator never loads
the kubernetes client.
"""

from __future__ import annotations

from healer import config
from healer.actuators import base


def scheduler(s: config.Settings) -> base.Actuator:
    names = base.NodeNames.from_settings(s.actuators)
    if s.controller.actuator == "slurm":
        from healer.actuators import slurm

        return slurm.SlurmActuator(s.actuators, names)
    if s.controller.actuator == "kubernetes":
        from healer.actuators import kubernetes as kube

        return kube.KubernetesActuator(s.actuators, names)
    return base.LogActuator(s.actuators)
