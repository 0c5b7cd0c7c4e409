"""What the status page's per-node view and GPU panel show (``/api/node``, ``/api/gpu``), built from the
page's live state (``healer.ui.live``): the GPU's or node's readings with their incidents, marks, labels,
staleness, versions and links."""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Mapping
from typing import Any, Protocol

from healer import config
from healer.ui import board, live

NO_ANOMALY = (
    "anomaly scores and their components are computed inside the controller and are not published on "
    "NATS; this page shows the anomaly evidence of incidents only (docs/ui.md)"
)


class AnomalySource(Protocol):
    """Per-GPU anomaly components, for a page served inside the controller that holds the model."""

    def components(self, node: str, gpu: int) -> Mapping[str, float] | None: ...


NO_VERSIONS = "not reported yet: healer learns the driver and VBIOS versions from a validation (docs/ui.md)"


def grafana_link(template: str | None, node: str, gpu: int | None = None) -> str | None:
    """``ui.grafana_url`` with ``{node}`` and ``{gpu}`` filled in, URL-quoted; ``None`` when unset."""
    if not template:
        return None
    quote = urllib.parse.quote
    return template.replace("{node}", quote(node, safe="")).replace("{gpu}", "" if gpu is None else str(gpu))


def gpu_view(
    view: live.Live, ui: config.UiSettings, anomaly: AnomalySource | None, node: str, index: int
) -> dict[str, Any] | None:
    """One GPU's series and what the panel shows beside them; None for a GPU the page does not know."""
    data = view.fleet.series(node, index)
    if data is None:
        return None
    related = [
        s.as_json()
        for s in view.board.open.values()
        if s.data.node == node and s.data.gpu_index in (None, index)
    ]
    comps = anomaly.components(node, index) if anomaly is not None else None
    scores = {s["id"]: s["evidence"]["anomaly_score"] for s in related if "anomaly_score" in s["evidence"]}
    seen_at = data.get("seen_at")
    age = time.time() - seen_at if isinstance(seen_at, float | int) else None
    data.update(
        incidents=related,
        labels={**view.board.node_labels.get(node, {}), **view.extra_labels.get(node, {})},
        excluded=node in view.board.exclusions,
        stale=age is None or age > view.stale_after_s,
        age_s=None if age is None else round(age, 1),
        marks=view.board.node_marks().get(node, []),
        grafana=grafana_link(ui.grafana_url, node, index),
        anomaly={
            "available": comps is not None,
            "components": dict(comps) if comps is not None else None,
            "incident_scores": scores,
            "note": None if comps is not None else NO_ANOMALY,
        },
    )
    return data


def node_view(view: live.Live, ui: config.UiSettings, name: str) -> dict[str, Any] | None:
    """One node: every GPU's row, its marks, versions, XID and incident history; None for an unknown node."""
    view.sync_nodes()
    data = view.fleet.node(name)
    if data is None:
        return None
    open_board = view.board
    seen_at = data.get("seen_at")
    age = time.time() - seen_at if isinstance(seen_at, float | int) else None
    stale = age is None or age > view.stale_after_s
    open_by_gpu: dict[int | None, str] = {}
    for s in open_board.open.values():
        if s.data.node == name:
            g = s.data.gpu_index
            worse = board.SEVERITY_CODE.get(s.data.severity, 1)
            if worse > board.SEVERITY_CODE.get(open_by_gpu.get(g, ""), 0):
                open_by_gpu[g] = s.data.severity
    gpus: list[dict[str, Any]] = data["gpus"]
    for row in gpus:
        row["state"] = "stale" if stale else ("present" if row["present"] else "missing")
        row["severity"] = open_by_gpu.get(row["gpu"])
        row["grafana"] = grafana_link(ui.grafana_url, name, row["gpu"])
    versions = open_board.versions.get(name, {})
    data.update(
        stale=stale,
        age_s=None if age is None else round(age, 1),
        stale_after_s=view.stale_after_s,
        marks=open_board.node_marks().get(name, []),
        exclusion=open_board.exclusions.get(name),
        labels={**open_board.node_labels.get(name, {}), **view.extra_labels.get(name, {})},
        node_severity=open_by_gpu.get(None),
        driver=versions.get("driver"),
        vbios=versions.get("vbios"),
        versions_note=None if versions else NO_VERSIONS,
        xids=sorted(open_board.xids.get(name, ()), key=lambda x: x["time"], reverse=True),
        incidents=open_board.node_history(name),
        open=[s.as_json() for s in open_board.open.values() if s.data.node == name],
        grafana=grafana_link(ui.grafana_url, name),
        ports=None,  # the node's fabric ports, when healer publishes them (a later change)
    )
    return data
