"""``healer model eval --plots``: the PNGs are written from the evaluation's own result, and a picture
without data is left out rather than drawn empty."""

from __future__ import annotations

import pathlib
from typing import Any

import matplotlib.image

from healer.anomaly import plots


def _fault(kind: str, model_s: float | None, static_s: float | None) -> dict[str, Any]:
    return {
        "kind": kind,
        "node": "sim-00001",
        "gpu": 3,
        "visible_at": 1000.0,
        "model_incident_s": model_s,
        "static_rule_s": static_s,
    }


def _result(traces: bool) -> dict[str, Any]:
    faults = [
        _fault("cooling", 300.0, 2400.0),
        _fault("cooling", 600.0, None),
        _fault("nvlink", None, 60.0),
    ]
    raw: dict[str, Any] = {"faults": faults}
    if traces:
        raw["traces"] = [
            {
                "kind": "cooling",
                "node": "sim-00001",
                "gpu": 3,
                "visible_at": 1000.0,
                "ts": [1000.0 + 30 * i for i in range(60)],
                "score": [min(1.0, 0.02 * i) for i in range(60)],
                "threshold": 0.9,
                "model_incident_s": 300.0,
                "static_rule_s": 2400.0,
            }
        ]
    return {"raw": [raw], "healthy_max_held": {"thermal_gpu": 0.42, "forest": 0.7}, "healthy_node_days": 12.5}


def _png_ok(path: pathlib.Path) -> None:
    image = matplotlib.image.imread(path)
    assert image.shape[0] > 100
    assert image.shape[1] > 300


def test_every_picture_is_written_when_the_result_has_its_data(tmp_path: pathlib.Path) -> None:
    written = plots.write(_result(traces=True), tmp_path / "out")
    assert [p.name for p in written] == ["lead_time.png", "healthy_margin.png", "score_traces.png"]
    for path in written:
        _png_ok(path)


def test_no_traces_no_trace_picture(tmp_path: pathlib.Path) -> None:
    written = plots.write(_result(traces=False), tmp_path)
    assert [p.name for p in written] == ["lead_time.png", "healthy_margin.png"]
    assert not (tmp_path / "score_traces.png").exists()


def test_an_empty_result_draws_nothing(tmp_path: pathlib.Path) -> None:
    assert plots.write({"raw": []}, tmp_path) == []
