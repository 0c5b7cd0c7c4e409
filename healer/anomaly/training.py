"""From healthy telemetry windows to a saved model with its card.

Nodes are split by index: every fourth node (index % 4 == 3) is held out for calibration, so the
threshold is set on GPUs the estimators never saw. Training is seeded end to end (the row sample, the
forest), so the same data and settings give the same model.
"""

from __future__ import annotations

import datetime
import pathlib
from typing import Any

import numpy as np
import structlog

from healer import errors
from healer.anomaly import dataset, diagnosis, features, persist, thermal
from healer.anomaly import model as anomaly_model

log = structlog.get_logger(__name__)


def rows(windows: list[dataset.Windows]) -> tuple[Any, list[str], Any, Any]:
    """Valid GPU-windows of every input as (base rows, class names, class index, holdout mask)."""
    names = sorted({m for w in windows for row in w.models for m in row if m})
    index = {m: i for i, m in enumerate(names)}
    bases, classes, holds = [], [], []
    for w in windows:
        n_win, n_nodes, n_gpus, _ = w.feats.shape
        cls = np.array([[index.get(m or "", -1) for m in row] for row in w.models], dtype=np.intp)
        cls = np.broadcast_to(cls[None], (n_win, n_nodes, n_gpus))
        node = np.broadcast_to(np.arange(n_nodes)[None, :, None], (n_win, n_nodes, n_gpus))
        bases.append(w.feats[w.valid])
        classes.append(cls[w.valid])
        holds.append(node[w.valid] % 4 == 3)
    base = np.concatenate(bases)
    if len(base) == 0:
        raise errors.PermanentError("no valid GPU windows in the training data")
    return base, names, np.concatenate(classes), np.concatenate(holds)


def thermal_rows(
    windows: list[dataset.Windows],
    names: list[str],
    prior_r: list[float],
    settings: anomaly_model.TrainSettings,
) -> dict[str, Any]:
    """Each valid GPU-window's thermal values in ``rows``' order, as a scorer fed the windows in time
    order would have had them (learning freely: no edges yet)."""
    index = {m: i for i, m in enumerate(names)}
    parts: dict[str, list[Any]] = {k: [] for k in ("rise_c", "gpu_rel", "node_c")}
    for w in windows:
        cls = np.array([[index.get(m or "", len(names)) for m in row] for row in w.models], dtype=np.intp)
        state = thermal.ThermalState(w.valid.shape[2], names, prior_r, settings.thermal())
        th = diagnosis.replay(state, w, cls)
        for k in parts:
            parts[k].append(th[k][w.valid])
    return {k: np.concatenate(v) for k, v in parts.items()}


def train(
    windows: list[dataset.Windows],
    out: str | pathlib.Path,
    settings: anomaly_model.TrainSettings,
    command: str,
) -> tuple[anomaly_model.Model, dict[str, Any]]:
    """Train, save to ``out`` and return the model and its card."""
    base, names, cls, hold = rows(windows)
    if hold.all() or not hold.any():
        raise errors.PermanentError(
            "training needs at least 4 nodes (one in four is held out for calibration)"
        )
    prior_r = anomaly_model.prior_resistance(base, cls, len(names))
    th = thermal_rows(windows, names, prior_r, settings)
    m, summary = anomaly_model.train(base, names, cls, hold, settings, prior_r, th)
    node_count = sum(len(w.node_names) for w in windows)
    span = [w.span_s for w in windows]
    card: dict[str, Any] = {
        "trained": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": command,
        "feature_units": dict(zip(anomaly_model.FEATURES, _UNITS, strict=True)),
        "training_data": {
            "sources": [w.source for w in windows],
            "nodes": node_count,
            "gpu_windows": len(base),
            "time_span": [
                {
                    "start": datetime.datetime.fromtimestamp(a, datetime.UTC).isoformat(),
                    "end": datetime.datetime.fromtimestamp(b, datetime.UTC).isoformat(),
                    "hours": round((b - a) / 3600, 2),
                }
                for a, b in span
            ],
            "models": names,
            "feature_median": dict(
                zip(features.BASE_FEATURES, np.round(np.median(base, axis=0), 4).tolist(), strict=True)
            ),
            **summary,
        },
        "evaluation": None,
    }
    persist.save(out, m, card)
    log.info("anomaly_model_trained", out=str(out), gpu_windows=len(base), threshold=m.calib["threshold"])
    return m, persist.read_card(out)


_UNITS = (
    "fraction of default power limit",
    "fraction (util / 100)",
    "fraction of max SM clock",
    "fraction of samples",
    "fraction of samples",
    "fraction of default power limit",
    "fraction of default power limit",
    "errors per minute",
    "errors per minute",
    "errors per minute",
    "errors per minute",
)
