"""``healer_build_info`` for every process's registry, and the process-wide Prometheus choices.

Each healer process (agent, controller, forwarder) exports ``healer_build_info{version, python,
component} 1``, so a dashboard can list what runs where and an upgrade shows as a label change.
Importing this module also turns off prometheus_client's ``*_created`` series: Prometheus stores them as
gauges beside every counter and histogram (one extra series each) and no healer panel or alert reads them.
"""

from __future__ import annotations

import platform
from typing import Literal

import prometheus_client as prom

import healer

prom.disable_created_metrics()  # type: ignore[no-untyped-call]

Component = Literal["agent", "controller", "forwarder"]


def register(registry: prom.CollectorRegistry, component: Component) -> prom.Gauge:
    gauge = prom.Gauge(
        "healer_build_info",
        "1 per healer process, labelled with its version, Python version and component",
        ["version", "python", "component"],
        registry=registry,
    )
    gauge.labels(healer.__version__, platform.python_version(), component).set(1)
    return gauge
