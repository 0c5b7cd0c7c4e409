"""The anomaly model: what it learns from healthy telemetry, how it scores a window, how it is stored.

Four components, each normalised so that 1.0 is the edge of healthy behaviour on held-out healthy
nodes (``calibration_quantile``), combined by taking the largest:

- ``forest``: an IsolationForest over the whole feature vector (rates as log1p);
- ``thermal_gpu``: a robust linear regression (HuberRegressor) of a GPU's temperature from its power,
  utilisation and its node peers' median temperature and power; the residual (too hot for what it
  draws, given its neighbours, which share its inlet air) is scored as a one-sided robust z-score
  (median / MAD of the training residuals) against the fleet. Its edge is the wider of the held-out
  quantile and the fleet tail (``level_tail``): GPUs differ for life, and in a fleet of 80,000 some
  healthy GPU is always hotter than any of the few hundred held out in training;
- ``thermal_rise``: the same residual against the GPU's own learned excess (``baseline.GpuBaseline``),
  scored once the GPU has been watched busy for ``baseline_init_s``, with the spread of that difference
  on held-out nodes (much narrower than the fleet's): a GPU getting hotter than it used to be;
- ``thermal_node``: the same for the node's median temperature against a per-model-class baseline of
  median power (the whole node too hot: inlet air, fans);
- ``counters``: error-counter rates over the largest rate seen in training (at least
  ``rate_floor_per_min``). A healthy fleet's counters barely move, so the forest cannot split on them;
  this component is what sees them.

``anomaly_score`` = 0.9 x raw / threshold below the threshold and rises towards 1 above it, so the
calibrated threshold is always ``SCORE_THRESHOLD`` = 0.9, the level the default rule pack watches.
Persistence is ``persist``'s job (skops + JSON card); the controller's API is ``scoring.Scorer``.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable
from typing import Any, Final

import numpy as np
import numpy.typing as npt
from sklearn import ensemble, linear_model

from healer.anomaly import features

F64 = npt.NDArray[np.float64]

SCORE_THRESHOLD: Final = 0.9
FEATURES: Final = (*features.BASE_FEATURES, "thermal_residual_c", "node_thermal_residual_c")
"""The forest's input, in order: the base window features plus the two thermal residuals (°C)."""
COMPONENTS: Final = ("forest", "thermal_gpu", "thermal_rise", "thermal_node", "counters")
_GPU_INPUTS: Final = ("power_frac", "util_frac", "node_temp_c", "node_power_frac")
_IDX = {name: i for i, name in enumerate(FEATURES)}
RESIDUAL_COLUMN: Final = _IDX["thermal_residual_c"]
POWER_COLUMN: Final = _IDX["power_frac"]


@dataclasses.dataclass(frozen=True)
class TrainSettings:
    window_s: float = 300.0
    """Window length, seconds."""
    bucket_s: float = 30.0
    """Bucket length and training stride, seconds (the controller's scoring interval should match)."""
    n_estimators: int = 200
    max_samples: int = 256
    seed: int = 0
    max_rows: int = 200_000
    """GPU-windows kept for fitting (a seeded sample when there are more)."""
    calibration_quantile: float = 0.9999
    """Held-out healthy quantile of each component that is scaled to 1.0."""
    threshold_margin: float = 1.25
    """Raw threshold = max(margin, margin x the largest combined score on held-out healthy windows)."""
    rate_floor_per_min: float = 1.0
    """Smallest error rate (per minute over the window) the counters component scales to 1.0."""
    baseline_tau_s: float = 21_600.0
    """Time constant of each GPU's own thermal baseline when scoring (``baseline``); 0 turns it off."""
    baseline_init_s: float = 900.0
    """Busy seconds a GPU is watched (its baseline the plain mean) before ``thermal_rise`` scores it."""
    level_tail: float = 1e-6
    """Share of healthy GPUs allowed past the fleet check's edge under a normal fit to the training
    residuals: one in a million, so no GPU of a healthy 10,000-node fleet (80,000 GPUs) is expected
    there only for being the hottest of many."""


@dataclasses.dataclass
class Model:
    forest: ensemble.IsolationForest
    thermal_gpu: linear_model.HuberRegressor
    thermal_node: linear_model.HuberRegressor
    classes: list[str]
    calib: dict[str, float]
    """Medians, scales, per-component quantiles and the raw threshold."""
    settings: TrainSettings

    def _node_design(self, node_pfrac: F64, cls: npt.NDArray[np.intp]) -> F64:
        onehot = np.zeros((len(node_pfrac), max(1, len(self.classes))))
        known = cls >= 0
        onehot[np.flatnonzero(known), cls[known]] = 1.0
        return np.column_stack([node_pfrac, node_pfrac**2, onehot])

    def complete(self, base: F64, cls: npt.NDArray[np.intp]) -> F64:
        """Append the two thermal residuals to base features (rows, BASE_FEATURES); ``cls`` the
        model-class index per row (-1 unknown: its node residual is 0)."""
        x_gpu = base[:, [_IDX[n] for n in _GPU_INPUTS]]
        res_gpu = base[:, _IDX["temp_c"]] - self.thermal_gpu.predict(x_gpu)
        node_pfrac = base[:, _IDX["node_power_frac"]]
        res_node = base[:, _IDX["node_temp_c"]] - self.thermal_node.predict(
            self._node_design(node_pfrac, cls)
        )
        res_node = np.where(cls >= 0, res_node, self.calib["node_median"])
        return np.column_stack([base, res_gpu, res_node])

    def components(self, x: F64, gpu_offset_c: F64 | None = None) -> dict[str, F64]:
        """Each component's normalised score (1.0 = edge of healthy) for complete rows ``x``;
        ``gpu_offset_c``: each row's own expected thermal excess in °C (``baseline.GpuBaseline.offset``;
        ``nan`` where the GPU has no baseline yet): ``thermal_rise`` is 0 without it."""
        c = self.calib
        res = x[:, _IDX["thermal_residual_c"]]
        z_gpu = np.maximum(0.0, (res - c["gpu_median"]) / c["gpu_scale"])
        rise = np.zeros(len(x))
        if gpu_offset_c is not None:
            own = ~np.isnan(gpu_offset_c)
            rise[own] = np.maximum(0.0, (res[own] - gpu_offset_c[own] - c["rise_median"]) / c["rise_scale"])
        z_node = np.maximum(0.0, (x[:, _IDX["node_thermal_residual_c"]] - c["node_median"]) / c["node_scale"])
        rates = x[:, [_IDX[n] for n in features.RATE_FEATURES]]
        refs = np.array([c[f"rate_ref_{n}"] for n in features.RATE_FEATURES])
        a = -self.forest.score_samples(_forest_input(x))
        return {
            "forest": np.maximum(0.0, (a - c["forest_median"]) / (c["q_forest"] - c["forest_median"])),
            "thermal_gpu": z_gpu / c["q_thermal_gpu"],
            "thermal_rise": rise / c["q_thermal_rise"],
            "thermal_node": z_node / c["q_thermal_node"],
            "counters": (rates / refs).max(axis=1),
        }

    def raw(self, x: F64, gpu_offset_c: F64 | None = None) -> F64:
        comps = self.components(x, gpu_offset_c)
        out: F64 = np.max(np.stack([comps[k] for k in COMPONENTS]), axis=0)
        return out

    def score_rows(self, x: F64, gpu_offset_c: F64 | None = None) -> F64:
        """``anomaly_score`` in [0, 1] for complete rows."""
        return to_score(self.raw(x, gpu_offset_c), self.calib["threshold"])

    def class_index(self, models: list[list[str | None]]) -> npt.NDArray[np.intp]:
        index = {m: i for i, m in enumerate(self.classes)}
        return np.array([[index.get(m or "", -1) for m in row] for row in models], dtype=np.intp)


def to_score(raw: F64, threshold: float) -> F64:
    r = raw / threshold
    return np.where(r <= 1.0, SCORE_THRESHOLD * r, 1.0 - (1.0 - SCORE_THRESHOLD) * np.exp(-(r - 1.0)))


def _forest_input(x: F64) -> F64:
    out = x.copy()
    for n in features.RATE_FEATURES:
        out[:, _IDX[n]] = np.log1p(out[:, _IDX[n]])
    return out


def _robust(v: F64) -> tuple[float, float]:
    med = float(np.median(v))
    mad = float(np.median(np.abs(v - med))) * 1.4826
    return med, max(mad, 0.05)


def train(
    base: F64,
    cls_names: list[str],
    cls: npt.NDArray[np.intp],
    holdout: npt.NDArray[np.bool_],
    settings: TrainSettings,
    own_offsets: Callable[[Model], F64] | None = None,
) -> tuple[Model, dict[str, Any]]:
    """Fit on rows where ``holdout`` is False, calibrate on the held-out rows (other nodes).

    ``base`` (rows, BASE_FEATURES) are valid healthy GPU-windows, ``cls`` their model-class index.
    ``own_offsets(model)`` gives every row's own-baseline offset (°C, ``nan`` before the GPU is ready)
    as a scorer replaying the rows in time order would have had it, for the fitted thermal regression;
    without it ``thermal_rise`` keeps a fleet-wide scale (rows carry no time order by themselves).
    Returns the model and a summary for the card.
    """
    rng = np.random.default_rng(settings.seed)
    fit_rows = np.flatnonzero(~holdout)
    if len(fit_rows) > settings.max_rows:
        fit_rows = np.sort(rng.choice(fit_rows, settings.max_rows, replace=False))
    cal_rows = np.flatnonzero(holdout)
    xb = base[fit_rows]
    gpu = linear_model.HuberRegressor(max_iter=500).fit(
        xb[:, [_IDX[n] for n in _GPU_INPUTS]], xb[:, _IDX["temp_c"]]
    )
    model = Model(
        forest=ensemble.IsolationForest(
            n_estimators=settings.n_estimators,
            max_samples=min(settings.max_samples, len(fit_rows)),
            random_state=settings.seed,
        ),
        thermal_gpu=gpu,
        thermal_node=linear_model.HuberRegressor(max_iter=500),
        classes=cls_names,
        calib={"node_median": 0.0},
        settings=settings,
    )
    model.thermal_node.fit(
        model._node_design(xb[:, _IDX["node_power_frac"]], cls[fit_rows]), xb[:, _IDX["node_temp_c"]]
    )
    x_fit = model.complete(xb, cls[fit_rows])
    model.forest.fit(_forest_input(x_fit))
    c = model.calib
    c["gpu_median"], c["gpu_scale"] = _robust(x_fit[:, _IDX["thermal_residual_c"]])
    c["node_median"], c["node_scale"] = _robust(x_fit[:, _IDX["node_thermal_residual_c"]])
    a_fit = -model.forest.score_samples(_forest_input(x_fit))
    c["forest_median"] = float(np.median(a_fit))
    for n in features.RATE_FEATURES:
        c[f"rate_ref_{n}"] = max(settings.rate_floor_per_min, 2.0 * float(x_fit[:, _IDX[n]].max()))
    # each GPU against its own baseline: the spread on fitting nodes, once their baselines are ready
    offsets = own_offsets(model) if own_offsets is not None else np.full(len(base), np.nan)
    own_fit = ~np.isnan(offsets[fit_rows])
    if own_fit.any():
        rise_fit = x_fit[own_fit, _IDX["thermal_residual_c"]] - offsets[fit_rows][own_fit]
        c["rise_median"], c["rise_scale"] = _robust(rise_fit)
    else:
        c["rise_median"], c["rise_scale"] = c["gpu_median"], c["gpu_scale"]
    # calibration on held-out nodes
    x_cal = model.complete(base[cal_rows], cls[cal_rows])
    off_cal = offsets[cal_rows]
    c.update(q_forest=1.0, q_thermal_gpu=1.0, q_thermal_rise=1.0, q_thermal_node=1.0, threshold=1.0)
    pre = model.components(x_cal, off_cal)
    q = settings.calibration_quantile
    a_q = c["forest_median"] + float(np.quantile(pre["forest"], q)) * (1.0 - c["forest_median"])
    c["q_forest"] = max(a_q, c["forest_median"] + 1e-3)
    c["level_z"] = statistics.NormalDist().inv_cdf(1.0 - settings.level_tail)
    c["q_thermal_gpu"] = max(float(np.quantile(pre["thermal_gpu"], q)), c["level_z"], 1.0)
    own_cal = ~np.isnan(off_cal)
    if own_cal.any():
        c["q_thermal_rise"] = max(float(np.quantile(pre["thermal_rise"][own_cal], q)), 1.0)
    else:
        c["q_thermal_rise"] = c["q_thermal_gpu"]
    c["q_thermal_node"] = max(float(np.quantile(pre["thermal_node"], q)), 1.0)
    raw_cal = model.raw(x_cal, off_cal)
    c["threshold"] = settings.threshold_margin * max(1.0, float(raw_cal.max()))
    comps_cal = model.components(x_cal, off_cal)
    summary = {
        "fit_rows": len(fit_rows),
        "calibration_rows": len(cal_rows),
        "calibration_rows_with_own_baseline": int(own_cal.sum()),
        "calibration_raw_max": float(raw_cal.max()),
        "calibration_raw_q9999": float(np.quantile(raw_cal, 0.9999)),
        "calibration_component_max": {k: float(v.max()) for k, v in comps_cal.items()},
        "thermal_gpu_coef": [float(v) for v in gpu.coef_] + [float(gpu.intercept_)],
        "edge_c": {
            "thermal_gpu": c["threshold"] * c["q_thermal_gpu"] * c["gpu_scale"] + c["gpu_median"],
            "thermal_rise": c["threshold"] * c["q_thermal_rise"] * c["rise_scale"] + c["rise_median"],
        },
    }
    return model, summary
