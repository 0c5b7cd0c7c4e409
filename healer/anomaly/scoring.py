"""The controller's entry point: load a model once, feed it frames cheaply, score the fleet in batches.

```python
scorer = scoring.load("models/default")        # ModelMismatchError (a PermanentError) if unusable
scorer.observe(frame)                          # hot path: copies numbers into a list, no numpy
scores = scorer.score(now)                     # every N s: {node: {gpu_index: anomaly_score}}
```

``NullScorer`` is what the controller keeps when loading failed: it accepts frames and scores every
GPU 0.
"""

from __future__ import annotations

import pathlib
import time
from typing import Any

import numpy as np
import numpy.typing as npt
import structlog

from healer.anomaly import baseline, persist, window
from healer.anomaly import model as anomaly_model
from healer.schemas import telemetry

log = structlog.get_logger(__name__)

MIN_INTERVAL_S = 5.0
"""Frames kept per node: at most one per this many seconds (the evaluation's sample interval)."""


class Scorer:
    """A loaded model with its FleetWindow."""

    def __init__(
        self,
        m: anomaly_model.Model,
        card: dict[str, Any],
        *,
        gpus_per_node: int = 8,
        min_interval_s: float = MIN_INTERVAL_S,
    ) -> None:
        self.model = m
        self.card = card
        self.window = window.FleetWindow(
            gpus_per_node=gpus_per_node,
            window_s=m.settings.window_s,
            bucket_s=m.settings.bucket_s,
            min_interval_s=min_interval_s,
        )
        self.last_cost_s = 0.0
        """CPU seconds of the last ``score`` call (flush + features + model), for /metrics."""
        self.last_components: dict[str, npt.NDArray[np.float64]] = {}
        self.baseline = baseline.GpuBaseline(
            gpus_per_node, m.settings.baseline_tau_s, m.settings.baseline_init_s
        )
        """Each GPU's own thermal baseline, updated once per ``score`` (not persisted)."""
        self._last_now: float | None = None

    def observe(self, frame: telemetry.FrameView, at: float | None = None) -> None:
        self.window.observe(frame, at)

    def score_array(self, now: float) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
        """Scores (nodes, gpus) in ``window.node_names`` order; 0 where a GPU had no data."""
        started = time.process_time()
        base, valid = self.window.features(now)
        out = np.zeros(valid.shape)
        if valid.any():
            cls = np.broadcast_to(self.model.class_index(self.window.models), valid.shape)[valid]
            x = self.model.complete(base[valid], cls)
            residual = np.full(valid.shape, np.nan)
            residual[valid] = x[:, anomaly_model.RESIDUAL_COLUMN]
            power = np.zeros(valid.shape)
            power[valid] = x[:, anomaly_model.POWER_COLUMN]
            comps = self.model.components(x, self.baseline.offset(power)[valid])
            if self._last_now is not None:
                self.baseline.update(residual, power, now - self._last_now)
            self.last_components = comps
            raw = np.max(np.stack([comps[k] for k in anomaly_model.COMPONENTS]), axis=0)
            out[valid] = anomaly_model.to_score(raw, self.model.calib["threshold"])
        self._last_now = now if self._last_now is None else max(now, self._last_now)
        self.last_cost_s = time.process_time() - started
        return out, valid

    def score(self, now: float) -> dict[str, dict[int, float]]:
        """``{node: {gpu_index: anomaly_score}}`` for every node seen, over the window ending ``now``."""
        arr, valid = self.score_array(now)
        rows = arr.tolist()
        ok = valid.tolist()
        return {
            name: {g: s for g, s in enumerate(rows[i]) if ok[i][g]}
            for i, name in enumerate(self.window.node_names)
        }


class NullScorer:
    """Stands in for a model that could not be loaded: every GPU scores 0."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        self.last_cost_s = 0.0

    def observe(self, frame: telemetry.FrameView, at: float | None = None) -> None:
        return None

    def score(self, now: float) -> dict[str, dict[int, float]]:
        return {}


def load(
    path: str | pathlib.Path, *, gpus_per_node: int = 8, min_interval_s: float = MIN_INTERVAL_S
) -> Scorer:
    """Load a saved model (raises ``persist.ModelMismatchError``)."""
    m, card = persist.load(path)
    log.info(
        "anomaly_model_loaded", path=str(path), threshold=m.calib["threshold"], trained=card.get("trained")
    )
    return Scorer(m, card, gpus_per_node=gpus_per_node, min_interval_s=min_interval_s)


def load_or_null(
    path: str | pathlib.Path, *, gpus_per_node: int = 8, min_interval_s: float = MIN_INTERVAL_S
) -> Scorer | NullScorer:
    """``load``, or a NullScorer and an ``anomaly_model_unavailable`` error event when it fails."""
    try:
        return load(path, gpus_per_node=gpus_per_node, min_interval_s=min_interval_s)
    except persist.ModelMismatchError as e:
        log.error("anomaly_model_unavailable", path=str(path), error=str(e), anomaly_score=0)
        return NullScorer(str(e))
