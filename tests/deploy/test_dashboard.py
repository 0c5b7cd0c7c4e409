"""The Grafana dashboard parses and queries only metrics that exist: the agent's are read from its
Prometheus registry (so renaming one in code fails here), the controller's from the list below."""

from __future__ import annotations

import json
import re
from typing import Any

from healer.agent import metrics as agent_metrics
from tests.deploy import manifests as m

CONTROLLER_METRICS = {
    "healer_controller_frames_ingested_total": "counter",
    "healer_controller_events_ingested_total": "counter",
    "healer_controller_decode_errors_total": "counter",
    "healer_controller_tick_seconds": "histogram",
    "healer_controller_incidents_open": "gauge",
    "healer_controller_actions_total": "counter",
    "healer_controller_breaker_open": "gauge",
    "healer_controller_lag_seconds": "gauge",
    "healer_controller_leader": "gauge",
}
"""The controller's metrics as issue 5 names them; keep in sync with the controller's registry."""

_SERIES = {"histogram": ("_bucket", "_sum", "_count"), "counter": ("",), "gauge": ("",)}


def _agent_series() -> set[str]:
    registry = agent_metrics.AgentMetrics().registry
    names: set[str] = set()
    for family in registry.collect():
        if family.type == "counter":
            names.add(f"{family.name}_total")
        elif family.type == "histogram":
            names.update(f"{family.name}{s}" for s in _SERIES["histogram"])
        else:
            names.add(family.name)
    return names


def _controller_series() -> set[str]:
    return {f"{name}{s}" for name, kind in CONTROLLER_METRICS.items() for s in _SERIES[kind]}


def _dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((m.DEPLOY / "grafana" / "healer.json").read_text())
    return data


def _queried() -> set[str]:
    names: set[str] = set()
    for panel in _dashboard()["panels"]:
        for target in panel.get("targets", []):
            names.update(re.findall(r"\bhealer_[a-z0-9_]+", target["expr"]))
    return names


def test_dashboard_has_unique_panel_ids_and_a_prometheus_datasource_variable() -> None:
    dash = _dashboard()
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    assert dash["uid"]
    (var,) = [v for v in dash["templating"]["list"] if v["type"] == "datasource"]
    assert var["query"] == "prometheus"
    for panel in dash["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}"
            assert panel["targets"]


def test_every_queried_metric_exists() -> None:
    known = _agent_series() | _controller_series()
    unknown = _queried() - known
    assert not unknown, f"the dashboard queries metrics nobody exports: {sorted(unknown)}"


def test_every_agent_and_controller_metric_is_on_the_dashboard() -> None:
    queried = _queried()
    bases = {re.sub(r"_(bucket|sum|count)$", "", n) for n in queried}
    missing = {
        n
        for n in _agent_series() | set(CONTROLLER_METRICS)
        if re.sub(r"_(bucket|sum|count)$", "", n) not in bases
    }
    assert not missing, f"metrics without a panel: {sorted(missing)}"


def test_agent_series_are_read_from_the_registry() -> None:
    assert "healer_agent_frames_published_total" in _agent_series()
    assert "healer_agent_sample_seconds_bucket" in _agent_series()
