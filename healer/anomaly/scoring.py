"""The controller's entry point: load a model once, feed it frames cheaply, score the fleet in batches.

```python
scorer = scoring.load("models/default")        # ModelMismatchError (a PermanentError) if unusable
scorer.import_state(saved)                     # what an earlier scorer learned (export_state())
scorer.observe(frame)                          # hot path: copies numbers into a list, no numpy
scores = scorer.score(now)                     # every 30 s: {node: {gpu_index: anomaly_score}}
scorer.explain(node, gpu)                      # why, for an incident's evidence
```

``NullScorer`` is what the controller keeps when loading failed: it accepts frames and scores every
GPU 0.
"""

from __future__ import annotations

import math
import pathlib
import time
from typing import Any

import numpy as np
import numpy.typing as npt
import structlog

from healer.anomaly import cfar, counters, persist, thermal, thermal_lag, window
from healer.anomaly import model as anomaly_model
from healer.schemas import telemetry

log = structlog.get_logger(__name__)

MIN_INTERVAL_S = 5.0
"""Frames kept per node: at most one per this many seconds (the evaluation's sample interval)."""


class Scorer:
    """A loaded model with its FleetWindow and the fleet's learned thermal state."""

    def __init__(
        self,
        m: anomaly_model.Model,
        card: dict[str, Any],
        *,
        gpus_per_node: int = 8,
        min_interval_s: float = MIN_INTERVAL_S,
        calibration: cfar.CfarSettings | None = None,
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
        """Each component's value (nodes, gpus) over the raw threshold at the last ``score`` (1.0: this
        component alone scores 0.9); 0 where not scored."""
        self.thermal = m.new_state(gpus_per_node)
        """What this fleet has shown (``thermal.ThermalState``): export it with ``export_state``."""
        self.lag = thermal_lag.LagFit(gpus_per_node)
        """How each GPU's temperature follows its power, learned from its load changes."""
        self.counter_hold = counters.Persistence(
            gpus_per_node, lookback=max(1, round(m.settings.window_s / m.settings.bucket_s))
        )
        """The counters component as the calibration judges it: persistent over two windows."""
        self.shadow_events: list[dict[str, Any]] = []
        """Would-be incidents of pools in shadow since the caller last took them (``take_shadow``)."""
        self._lag_known = np.zeros(0, dtype=bool)
        """Per node: most of its GPUs' slopes have been known (``_lag_step``)."""
        self.last_thermal: thermal.Step | None = None
        self.last_scores: npt.NDArray[np.float64] = np.zeros((0, gpus_per_node))
        self.last_valid: npt.NDArray[np.bool_] = np.zeros((0, gpus_per_node), dtype=bool)
        self._last_now: float | None = None
        self.cfar = (
            cfar.Calibration(calibration) if calibration is not None and m.forest_corroborates else None
        )
        """The fleet's own thresholds per pool and component, shadow until calibrated (``cfar``); None:
        the model's fixed edges decide (``calibration`` not given, or an old card whose forest decides)."""

    def observe(self, frame: telemetry.FrameView, at: float | None = None) -> None:
        self.window.observe(frame, at)

    def grid_at(self, now: float) -> float:
        """The scoring instant ``now`` belongs to: ``now`` floored to the bucket grid (absolute time)."""
        b = self.window.bucket_s
        return math.floor(now / b) * b

    def score_array(self, now: float) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
        """Scores (nodes, gpus) in ``window.node_names`` order; 0 where a GPU had no data.

        Scoring is on the absolute bucket grid, never on when it was called: ``now`` is floored to the
        grid (``grid_at``, kept in ``scored_at``), the window is the ``window_s`` of complete buckets
        before that instant, and every grid instant since the last scoring is stepped in turn (a call
        one instant late catches up exactly: the ring keeps one complete bucket beyond the window; a
        longer gap steps its last two instants). A second call within one bucket returns the same
        scores and learns nothing.
        The same frames therefore give the same scores whatever the phase of the caller's timer."""
        at = self.grid_at(now)
        if self._last_now is not None and at <= self._last_now:
            return self.last_scores, self.last_valid
        started = time.process_time()
        b = self.window.bucket_s
        # the ring keeps one complete bucket beyond the window: at most one instant back is exact
        first = at - b if self._last_now is None else max(self._last_now + b, at - b)
        steps = max(1, round((at - first) / b) + 1)
        for k in range(steps):
            out, valid = self._step(first + k * b)
        self.last_cost_s = time.process_time() - started
        return out, valid

    def _step(self, at: float) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
        # the window of complete buckets before ``at``: half a bucket back lands in the last of them
        base, valid = self.window.features(at - self.window.bucket_s / 2)
        out = np.zeros(valid.shape)
        # the scorer's clock starts at the first instant with data, so a caller that started earlier
        # does not learn from a different first step (an empty fleet is stepped, learning nothing)
        clock = self._last_now is not None or bool(valid.any())
        if not clock and len(valid):
            self.last_scores, self.last_valid = out, valid
            self.last_components = {k: np.zeros(valid.shape) for k in anomaly_model.COMPONENTS}
            self.last_thermal = None  # nothing scored yet: ``explain`` says nothing
            return out, valid
        self.thermal.ensure(self.window.node_names)
        dt = 0.0 if self._last_now is None else max(0.0, at - self._last_now)
        cls = self.model.class_index(self.window.models)
        hot = np.nan_to_num(base[..., anomaly_model.THROTTLE_COLUMN]) > 0
        temp, power = base[..., anomaly_model.TEMP_COLUMN], base[..., self.model.power_column]
        lagged = self._lag_step(temp, power, valid, cls, dt)
        th = self.thermal.step(temp, power, valid, cls, at, dt, hot, lagged)
        self.last_thermal = th
        comps_full = {k: np.zeros(valid.shape) for k in anomaly_model.COMPONENTS}
        if valid.any():
            rows = {"rise_c": th.rise_c[valid], "gpu_rel": th.gpu_rel[valid], "node_c": th.node_c[valid]}
            if th.peer_z is not None:
                rows["peer_z"] = th.peer_z[valid]
            comps = self.model.components(base[valid], rows)
            threshold = self.model.calib["threshold"]
            for k in anomaly_model.COMPONENTS:
                comps_full[k][valid] = comps[k] / threshold
            out[valid] = anomaly_model.to_score(self.model.combine(comps), threshold)
        if self.cfar is not None:
            out = self._calibrated(comps_full, valid, at, dt)
        self.last_components = comps_full
        self.last_scores = out
        self.last_valid = valid
        if clock:
            self._last_now = at
        return out, valid

    def _lag_step(
        self,
        temp: npt.NDArray[np.float64],
        power: npt.NDArray[np.float64],
        valid: npt.NDArray[np.bool_],
        cls: npt.NDArray[np.intp],
        dt: float,
    ) -> npt.NDArray[np.float64]:
        """How each GPU's temperature follows its power (``thermal_lag``): learn from this window's
        change, hand each GPU's own resistance (and each class's median) to the thermal fit, and return
        the power lagged by each GPU's own time constant."""
        lag, th = self.lag, self.thermal
        lag.ensure(self.window.node_names)
        n = len(temp)
        # a GPU past half its edge (its own residual, or its node's) does not learn: not absorbed
        learn = np.ones(temp.shape, dtype=bool)
        prev = self.last_thermal
        if prev is not None and prev.rise_c.shape == temp.shape:
            with np.errstate(invalid="ignore"):
                odd = (prev.rise_c > th.s.freeze_at * th.edges[0]) | (
                    prev.node_c > th.s.freeze_at * th.edges[2]
                )
            learn &= ~odd
        lagged = lag.step(temp, power, valid, dt, learn)
        cls = np.asarray(cls, dtype=np.intp).reshape(n, temp.shape[1])
        # each GPU's own slope, within ``slope_range`` of its model's trained seed
        seed_r = np.array([*self.model.prior_r, float(np.median(self.model.prior_r or [45.0]))])[cls]
        th.gpu_r = lag.resistance(n, seed_r)
        # a node whose GPUs' own slopes have just become known starts its inlet level and load offsets
        # over: they were learned against another model's slope
        known = (~np.isnan(th.gpu_r)).sum(axis=1) * 2 >= th.gpus
        if len(self._lag_known) < n:
            self._lag_known = np.concatenate(
                [self._lag_known, np.zeros(n - len(self._lag_known), dtype=bool)]
            )
        first = known & ~self._lag_known[:n]
        if first.any():
            th.restart_nodes(np.flatnonzero(first))
        self._lag_known[:n] |= known
        for c, r in lag.class_medians(cls, len(th.classes) + 1, seed_r).items():
            th.prior_r[c] = r
        return lagged

    def _calibrated(
        self, comps: dict[str, npt.NDArray[np.float64]], valid: npt.NDArray[np.bool_], at: float, dt: float
    ) -> npt.NDArray[np.float64]:
        """Scores against this fleet's own thresholds (``cfar.Calibration.decide``)."""
        assert self.cfar is not None
        w = self.window
        self.cfar.ensure(len(w.node_names))
        for i in np.flatnonzero(self.cfar.node_pool[: len(w.node_names)] < 0).tolist():
            interval = w.interval_s(i)
            if interval is not None:
                self.cfar.assign(i, cfar.pool_key(w.models[i][0], interval))
        # a counter burst is gone a window later, a rising or steady rate is not; what holds is judged
        # against how large one burst of this pool gets (``counters``)
        n = len(w.node_names)
        raw = comps["counters"]
        held = self.counter_hold.step(raw)
        comps["counters"] = self.cfar.background.judge(
            held, raw, self.counter_hold.onset, self.cfar.pool_of(n), w.node_names, self.cfar.counting(n)
        )
        forest = comps["forest"]
        g = anomaly_model.CORROBORATE_GAIN
        lifted = np.stack([np.maximum(comps[k], np.minimum(forest, g * comps[k])) for k in cfar.DECIDING])
        scored: npt.NDArray[np.bool_] = np.asarray(valid.any(axis=1), dtype=bool)
        ratio, cap = self.cfar.decide(lifted, scored, at, dt)
        for i, k, value, thr in self.cfar.last_shadow:
            self.shadow_events.append(
                {
                    "node": w.node_names[i],
                    "pool": self.cfar.pools[self.cfar.node_pool[i]],
                    "component": cfar.DECIDING[k],
                    "value": round(value, 4),
                    "threshold": round(thr, 4),
                    "node_days": round(float(self.cfar.node_s[self.cfar.node_pool[i]]) / 86400.0, 4),
                    "node_days_needed": self.cfar.s.min_node_days,
                    "at": at,
                }
            )
        del self.shadow_events[: -cfar.SHADOW_KEPT]
        score = np.minimum(anomaly_model.to_score(ratio, 1.0), cap[:, None])
        out: npt.NDArray[np.float64] = np.where(valid, score, 0.0)
        return out

    def take_shadow(self) -> list[dict[str, Any]]:
        """The would-be incidents of pools in shadow since the last call (at most ``cfar.SHADOW_KEPT``,
        the newest): node, pool, component, value, threshold, node_days, node_days_needed, at."""
        out, self.shadow_events = self.shadow_events, []
        return out

    @property
    def shadow_counts(self) -> dict[str, int]:
        """Per pool, would-be incidents while in shadow (empty without calibration)."""
        if self.cfar is None:
            return {}
        return {k: int(v) for k, v in zip(self.cfar.pools, self.cfar.shadow, strict=True)}

    @property
    def scored_at(self) -> float | None:
        """The grid instant of the last scoring (``grid_at``), None before the first."""
        return self._last_now

    def score(self, now: float) -> dict[str, dict[int, float]]:
        """``{node: {gpu_index: anomaly_score}}`` for every node seen, over the window ending ``now``."""
        arr, valid = self.score_array(now)
        rows = arr.tolist()
        ok = valid.tolist()
        names = self.window.node_names
        return {names[i]: {g: s for g, s in enumerate(rows[i]) if ok[i][g]} for i in range(len(rows))}

    def export_state(self) -> dict[str, Any]:
        """Everything learned about this fleet, JSON-able (``thermal.ThermalState.export``): save it
        (``healer.anomaly.scorer_state.save``) and ``import_state`` it after a restart or failover."""
        out = self.thermal.export()
        out["lag"] = self.lag.export()
        if self.cfar is not None:
            out["cfar"] = self.cfar.export()
        return out

    def import_state(self, state: dict[str, Any]) -> int:
        """Restore an exported state (nodes not seen yet are restored when they first report); returns
        the number of nodes it holds. ValueError if it was made for another GPU count or format."""
        n = self.thermal.import_(state)
        if isinstance(state.get("lag"), dict):
            self.lag.import_(state["lag"])
        if self.cfar is not None and isinstance(state.get("cfar"), dict):
            self.cfar.import_(state["cfar"])
        return n

    def explain(self, node: str, gpu: int) -> dict[str, float | str]:
        """Why ``node``/``gpu`` scored what it did at the last ``score``: the driving component and by
        how much, against what (its own baseline, its node's own level, its GPU model on this fleet,
        the training fleet), each component's value (1.0 = scores 0.9), and the thermal figures.
        Empty when the GPU was not scored."""
        i = self.window.node_names.index(node) if node in self.window.node_names else -1
        th = self.last_thermal
        if i < 0 or th is None or i >= len(self.last_scores) or not 0 <= gpu < self.last_scores.shape[1]:
            return {}
        comps = {k: float(v[i, gpu]) for k, v in self.last_components.items()}
        top = max(comps, key=lambda k: comps[k])
        out: dict[str, float | str] = {
            "anomaly_score": round(float(self.last_scores[i, gpu]), 4),
            "component": top,
            "against": AGAINST[top],
        }
        for k, v in comps.items():
            out[f"component_{k}"] = round(v, 3)
        extra = {
            "thermal_excess_c": th.rise_c[i, gpu] if th.ready[i, gpu] else math.nan,
            "residual_c": th.residual_c[i, gpu],
            "inlet_ref_c": th.inlet_ref_c[i, gpu],
            "node_excess_c": th.node_c[i, gpu],
            "node_vs_peers": th.peer_z[i, gpu] if th.peer_z is not None else math.nan,
            "cooling_worse_than_model_median": th.gpu_rel[i, gpu],
        }
        for k, v in extra.items():
            if not math.isnan(float(v)):
                out[k] = round(float(v), 2)
        out["own_baseline"] = "ready" if th.ready[i, gpu] else "learning"
        return out


AGAINST = {
    "forest": "the training fleet (dimensionless features)",
    "thermal_gpu": "the median GPU of its model on this fleet",
    "thermal_rise": "its own baseline at its node's inlet",
    "thermal_node": "its node's own inlet level",
    "thermal_peer": "the nodes of its GPU model (in its cooling domain, where known) at the same moment",
    "counters": "the largest error rates of the training fleet, held rates against its pool's burst envelope",
}
"""What each component compares with, for ``explain``."""


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
    path: str | pathlib.Path,
    *,
    gpus_per_node: int = 8,
    min_interval_s: float = MIN_INTERVAL_S,
    calibration: cfar.CfarSettings | None = None,
) -> Scorer:
    """Load a saved model (raises ``persist.ModelMismatchError``)."""
    m, card = persist.load(path)
    log.info(
        "anomaly_model_loaded", path=str(path), threshold=m.calib["threshold"], trained=card.get("trained")
    )
    return Scorer(
        m, card, gpus_per_node=gpus_per_node, min_interval_s=min_interval_s, calibration=calibration
    )


def load_or_null(
    path: str | pathlib.Path,
    *,
    gpus_per_node: int = 8,
    min_interval_s: float = MIN_INTERVAL_S,
    calibration: cfar.CfarSettings | None = None,
) -> Scorer | NullScorer:
    """``load``, or a NullScorer and an ``anomaly_model_unavailable`` error event when it fails."""
    try:
        return load(path, gpus_per_node=gpus_per_node, min_interval_s=min_interval_s, calibration=calibration)
    except persist.ModelMismatchError as e:
        log.error("anomaly_model_unavailable", path=str(path), error=str(e), anomaly_score=0)
        return NullScorer(str(e))
