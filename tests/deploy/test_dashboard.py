"""The Grafana dashboard parses, queries only metrics that exist and shows every one: the names are
read from the agent's and the controller's Prometheus registries, so renaming or adding a metric in
code fails here until the dashboard follows."""

from __future__ import annotations

import json
import re
from typing import Any

import prometheus_client as prom

from healer.agent import exposition as agent_metrics
from healer.controller.observability import metrics as controller_metrics
from healer.feed import forward
from healer.schemas import dcgm
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
FORWARDER = _series(forward.ForwardMetrics().registry)
GPU = {f.name for f in dcgm.EXPORTED}
"""The agent's GPU series (served once it has sampled, so not in an empty registry)."""


def _dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((m.DEPLOY / "grafana" / "healer.json").read_text())
    return data


def _queried() -> set[str]:
    names: set[str] = set()
    for panel in _dashboard()["panels"]:
        for target in panel.get("targets", []):
            names.update(re.findall(r"\b(?:healer_[a-z0-9_]+|DCGM_FI_[A-Z0-9_]+)", target["expr"]))
    return names


def _exprs() -> list[str]:
    dash = _dashboard()
    panels = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    return panels + [a["expr"] for a in dash["annotations"]["list"]]


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
    known = AGENT | CONTROLLER | FORWARDER | GPU
    unknown = _queried() - known
    assert not unknown, f"the dashboard queries metrics nobody exports: {sorted(unknown)}"


def test_every_agent_and_controller_metric_is_on_the_dashboard() -> None:
    def base(name: str) -> str:
        return re.sub(r"_(bucket|sum|count)$", "", name)

    shown = {base(n) for n in _queried()}
    missing = sorted({base(n) for n in AGENT | CONTROLLER | FORWARDER} - shown)
    assert not missing, f"metrics without a panel: {missing}"


def test_series_names_come_from_the_registries() -> None:
    assert "healer_agent_frames_published_total" in AGENT
    assert "healer_agent_sample_seconds_bucket" in AGENT
    assert "healer_controller_leader" in CONTROLLER
    assert "healer_controller_lag_seconds_bucket" in CONTROLLER


def test_every_selector_follows_the_cluster_and_instance_variables() -> None:
    """A site with several clusters in one Prometheus picks one; no panel mixes them."""
    names = {v["name"] for v in _dashboard()["templating"]["list"]}
    assert {"datasource", "cluster", "instance"} <= names
    for expr in _exprs():
        for sel in re.finditer(r"\b(?:healer_[a-z0-9_]+|DCGM_FI_[A-Z0-9_]+)(\{[^}]*\})?", expr):
            assert 'cluster=~"$cluster"' in (sel.group(1) or ""), f"{sel.group(0)!r} in {expr!r}"


def test_incidents_actions_and_the_breaker_are_annotations() -> None:
    names = {a["name"] for a in _dashboard()["annotations"]["list"]}
    assert names == {"Incidents opened", "Actions taken", "Breaker open"}
    assert "healer_build_info" in _queried()
    assert {"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"} <= _queried()
