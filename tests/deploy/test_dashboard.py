"""The Grafana dashboard parses, queries only metrics that exist and shows every one: the names are
read from the agent's and the controller's Prometheus registries, so renaming or adding a metric in
code fails here until the dashboard follows."""

from __future__ import annotations

import json
import re
from typing import Any

import prometheus_client as prom

from healer.agent import metrics as agent_metrics
from healer.controller import metrics as controller_metrics
from tests.deploy import manifests as m


def _series(registry: prom.CollectorRegistry) -> set[str]:
    """The series names a registry exports (a labelled metric has no samples before first use, so
    they are derived from the metric families: counters end in _total, histograms have three)."""
    names: set[str] = set()
    for family in registry.collect():
        if family.type == "counter":
            names.add(f"{family.name}_total")
        elif family.type == "histogram":
            names.update(f"{family.name}{s}" for s in ("_bucket", "_sum", "_count"))
        else:
            names.add(family.name)
    return names


AGENT = _series(agent_metrics.AgentMetrics().registry)
CONTROLLER = _series(controller_metrics.ControllerMetrics().registry)


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
    known = AGENT | CONTROLLER
    unknown = _queried() - known
    assert not unknown, f"the dashboard queries metrics nobody exports: {sorted(unknown)}"


def test_every_agent_and_controller_metric_is_on_the_dashboard() -> None:
    def base(name: str) -> str:
        return re.sub(r"_(bucket|sum|count)$", "", name)

    shown = {base(n) for n in _queried()}
    missing = sorted({base(n) for n in AGENT | CONTROLLER} - shown)
    assert not missing, f"metrics without a panel: {missing}"


def test_series_names_come_from_the_registries() -> None:
    assert "healer_agent_frames_published_total" in AGENT
    assert "healer_agent_sample_seconds_bucket" in AGENT
    assert "healer_controller_leader" in CONTROLLER
    assert "healer_controller_lag_seconds_bucket" in CONTROLLER
