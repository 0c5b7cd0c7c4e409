"""The anomaly model: what it learns from healthy telemetry, how it scores a window, how it is stored.

Six components, each normalised so that 1.0 is the edge of healthy behaviour. Only the forest and the
counter references come from the training fleet, and neither reads a temperature; every thermal
comparison is against what *this* fleet has shown (``thermal.ThermalState``, learned live and
exportable). The largest of the others decides; the forest only corroborates (``combine``):

- ``forest``: an IsolationForest over dimensionless features (power and utilisation fractions, clock
  ratio, throttle shares, the node's power and the GPU's deviation from it, error rates as log1p),
  fitted on healer's simulator, so it may lift the others by at most ``CORROBORATE_GAIN`` and opens
  nothing alone (cards without ``forest_corroborates``: the largest of all, as before);
- ``thermal_rise``: the GPU's temperature against its own learned model (offset + resistance x power)
  at its node's current inlet reference, in °C over ``edge_rise_c``;
- ``thermal_gpu``: for a GPU without its own model yet, how much worse it cools than the median GPU of
  its model on this fleet, as a share (``edge_rel``: a wide check, healthy GPUs differ by ± 25 %);
- ``thermal_node``: the node's inlet reference against its own slow level, °C over ``edge_node_c``;
- ``thermal_peer``: the node against the fleet's other nodes at the same moment, over the fleet's own
  spread (``thermal.ThermalState._peers``; cards with ``thermal_peer``);
- ``counters``: error-counter rates over the largest rate seen in training (at least
  ``rate_floor_per_min``). A healthy fleet's counters barely move, so the forest cannot split on them.

The edges are the larger of a floor (physics: what a healthy GPU's own model cannot explain) and the
held-out 99.99th percentile on the varied training fleet. ``anomaly_score`` = 0.9 x raw / threshold
below the threshold and rises towards 1 above it, so the calibrated threshold is always
``SCORE_THRESHOLD`` = 0.9, the level the default rule pack watches. Persistence is ``persist``'s job;
the controller's API is ``scoring.Scorer``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Final

import numpy as np
import numpy.typing as npt
from sklearn import ensemble

from healer.anomaly import features, thermal

F64 = npt.NDArray[np.float64]

SCORE_THRESHOLD: Final = 0.9
FEATURES: Final = (
    "power_frac",
    "util_frac",
    "clock_ratio",
    "thermal_throttle_frac",
    "power_throttle_frac",
    "node_power_frac",
    "power_node_dev_frac",
    *features.RATE_FEATURES,
)
"""The forest's input, in order: dimensionless base features (no temperature, no watts)."""
COMPONENTS: Final = ("forest", "thermal_gpu", "thermal_rise", "thermal_node", "thermal_peer", "counters")
_BASE = {name: i for i, name in enumerate(features.BASE_FEATURES)}
_COLS: Final = [_BASE[n] for n in FEATURES]
TEMP_COLUMN: Final = _BASE["temp_c"]
THROTTLE_COLUMN: Final = _BASE["thermal_throttle_frac"]
POWER_COLUMN: Final = _BASE["power_frac"]
HEAT_COLUMN: Final = _BASE["heat_frac"]
CORROBORATE_GAIN: Final = 1.25
"""How far the forest can lift the score of the fleet-relative components: at most by this factor, and
never above the forest's own value. Alone (every fleet-relative component at 0) it adds nothing: it
was fitted on healer's simulator, so it may only corroborate what this fleet's own normal says."""
EDGE_FLOORS: Final = {"edge_rise_c": 3.0, "edge_rel": 0.6, "edge_node_c": 3.0}
"""Smallest edges: a GPU 3 °C over its own model, cooling 60 % worse than its model's median before it
has a model of its own, a node 3 °C over its own inlet level."""


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
    """Forgetting time constant of each GPU's own thermal model (``thermal.ThermalSettings.tau_s``)."""
    baseline_init_s: float = 900.0
    """Steady seconds before a GPU's (or node's) own baseline is trusted."""
    node_tau_s: float = 1_800.0
    """Time constant of each node's own inlet level (``thermal.ThermalSettings.node_tau_s``)."""

    def thermal(self) -> thermal.ThermalSettings:
        return thermal.ThermalSettings(
            tau_s=self.baseline_tau_s, init_s=self.baseline_init_s, node_tau_s=self.node_tau_s
        )


@dataclasses.dataclass
class Model:
    forest: ensemble.IsolationForest
    classes: list[str]
    prior_r: list[float]
    """Per class, the training fleet's median resistance (°C per power fraction): only a seed for the
    deployment's own, which replaces it as GPUs get their own models."""
    calib: dict[str, float]
    """Forest median and quantile, counter references, thermal edges, the raw threshold."""
    settings: TrainSettings

    def new_state(self, gpus: int) -> thermal.ThermalState:
        """An empty thermal state for a fleet scored by this model."""
        c = self.calib
        edges = (c["edge_rise_c"], c["edge_rel"], c["edge_node_c"])
        return thermal.ThermalState(gpus, self.classes, self.prior_r, self.settings.thermal(), edges)

    def components(self, base: F64, th: dict[str, F64], *, gate: bool = True) -> dict[str, F64]:
        """Each component's normalised value (1.0 = edge of healthy) for base feature rows and their
        thermal values (``rise_c``, ``gpu_rel``, ``node_c`` per row; ``nan`` = not scored)."""
        c = self.calib
        rates = base[:, [_BASE[n] for n in features.RATE_FEATURES]]
        refs = np.array([c[f"rate_ref_{n}"] for n in features.RATE_FEATURES])

        def pos(v: F64, edge: float) -> F64:
            out: F64 = np.maximum(0.0, np.nan_to_num(v)) / edge
            return out

        out = {
            "thermal_gpu": pos(th["gpu_rel"], c["edge_rel"]),
            "thermal_rise": pos(th["rise_c"], c["edge_rise_c"]),
            "thermal_node": pos(th["node_c"], c["edge_node_c"]),
            "thermal_peer": (
                pos(th["peer_z"], 1.0 / c["threshold"])
                if c.get("thermal_peer") and "peer_z" in th
                else np.zeros(len(base))
            ),
            "counters": (np.nan_to_num(rates) / refs).max(axis=1),
        }
        rows = np.ones(len(base), dtype=bool)
        if gate and self.forest_corroborates:
            # the forest can lift a GPU to the level only where its own evidence is within
            # CORROBORATE_GAIN of it: elsewhere it is not evaluated (reads 0), which leaves every
            # incident as it was and saves most of the scoring's cost
            own = np.max(np.stack(list(out.values())), axis=0)
            rows = own >= c["threshold"] / CORROBORATE_GAIN
        forest = np.zeros(len(base))
        if rows.any():
            a = -self.forest.score_samples(forest_input(base[rows]))
            forest[rows] = np.maximum(0.0, (a - c["forest_median"]) / (c["q_forest"] - c["forest_median"]))
        return {"forest": forest, **out}

    @property
    def forest_corroborates(self) -> bool:
        """True (every model written since healer-anomaly-model/3 gained the key): the forest only
        corroborates (``combine``); False: an older card, where it could open an incident alone."""
        return bool(self.calib.get("forest_corroborates", 0.0))

    @property
    def power_column(self) -> int:
        """The base-feature column the thermal baselines read: the energy counter's mean power
        (``heat_frac``) where the card says so, else the mean NVML power reading (older cards)."""
        return HEAT_COLUMN if self.calib.get("thermal_heat", 0.0) else POWER_COLUMN

    def combine(self, comps: dict[str, F64]) -> F64:
        return combine(comps, corroborate=self.forest_corroborates)

    def class_index(self, models: list[list[str | None]]) -> npt.NDArray[np.intp]:
        """Class index per (node, gpu); unknown models get ``len(classes)`` (the fleet-wide prior)."""
        index = {m: i for i, m in enumerate(self.classes)}
        unknown = len(self.classes)
        return np.array([[index.get(m or "", unknown) for m in row] for row in models], dtype=np.intp)


def combine(comps: dict[str, F64], *, corroborate: bool = False) -> F64:
    """The largest component; with ``corroborate`` the forest only lifts the largest fleet-relative
    component (by at most ``CORROBORATE_GAIN``), so on its own it scores 0."""
    if not corroborate:
        out: F64 = np.max(np.stack([comps[k] for k in COMPONENTS]), axis=0)
        return out
    own: F64 = np.max(np.stack([comps[k] for k in COMPONENTS if k != "forest"]), axis=0)
    lifted: F64 = np.maximum(own, np.minimum(comps["forest"], CORROBORATE_GAIN * own))
    return lifted


def to_score(raw: F64, threshold: float) -> F64:
    r = raw / threshold
    return np.where(r <= 1.0, SCORE_THRESHOLD * r, 1.0 - (1.0 - SCORE_THRESHOLD) * np.exp(-(r - 1.0)))


def forest_input(base: F64) -> F64:
    out = np.nan_to_num(base[:, _COLS])
    for k, n in enumerate(FEATURES):
        if n in features.RATE_FEATURES:
            out[:, k] = np.log1p(np.maximum(out[:, k], 0.0))
    return out


def prior_resistance(base: F64, cls: npt.NDArray[np.intp], n_classes: int) -> list[float]:
    """Per class, °C per power fraction from GPUs that drew differently from their node peers in the
    same window (their shared inlet cancels): a through-origin fit of the deviations."""
    dt = base[:, _BASE["temp_node_dev_c"]]
    dp = base[:, _BASE["power_node_dev_frac"]]
    out = []
    for c in range(n_classes):
        sel = (cls == c) & (np.abs(dp) >= 0.15) & ~np.isnan(dt)
        out.append(float(np.sum(dt[sel] * dp[sel]) / np.sum(dp[sel] ** 2)) if sel.sum() >= 50 else 45.0)
    return out


def train(
    base: F64,
    cls_names: list[str],
    cls: npt.NDArray[np.intp],
    holdout: npt.NDArray[np.bool_],
    settings: TrainSettings,
    prior_r: list[float],
    thermal_rows: dict[str, F64],
) -> tuple[Model, dict[str, Any]]:
    """Fit on rows where ``holdout`` is False, calibrate on the held-out rows (other nodes).

    ``base`` (rows, BASE_FEATURES) are valid healthy GPU-windows, ``cls`` their class index,
    ``thermal_rows`` each row's thermal values as a scorer replaying the windows in time order had them
    (``rise_c``, ``gpu_rel``, ``node_c``). Returns the model and a summary for the card.
    """
    rng = np.random.default_rng(settings.seed)
    fit_rows = np.flatnonzero(~holdout)
    if len(fit_rows) > settings.max_rows:
        fit_rows = np.sort(rng.choice(fit_rows, settings.max_rows, replace=False))
    cal_rows = np.flatnonzero(holdout)
    model = Model(
        forest=ensemble.IsolationForest(
            n_estimators=settings.n_estimators,
            max_samples=min(settings.max_samples, len(fit_rows)),
            random_state=settings.seed,
        ),
        classes=cls_names,
        prior_r=prior_r,
        calib={},
        settings=settings,
    )
    xb = base[fit_rows]
    model.forest.fit(forest_input(xb))
    c = model.calib
    a_fit = -model.forest.score_samples(forest_input(xb))
    c["forest_median"] = float(np.median(a_fit))
    for n in features.RATE_FEATURES:
        c[f"rate_ref_{n}"] = max(settings.rate_floor_per_min, 2.0 * float(np.nanmax(xb[:, _BASE[n]])))
    q = settings.calibration_quantile
    held = {k: v[cal_rows] for k, v in thermal_rows.items()}
    for key, name in (("edge_rise_c", "rise_c"), ("edge_rel", "gpu_rel"), ("edge_node_c", "node_c")):
        v = held[name][~np.isnan(held[name])]
        c[key] = max(EDGE_FLOORS[key], float(np.quantile(v, q)) if len(v) else 0.0)
    c.update(q_forest=1.0, threshold=1.0, forest_corroborates=1.0, thermal_heat=1.0, thermal_peer=1.0)
    x_cal = base[cal_rows]
    pre = model.components(x_cal, held, gate=False)
    a_q = c["forest_median"] + float(np.quantile(pre["forest"], q)) * (1.0 - c["forest_median"])
    c["q_forest"] = max(a_q, c["forest_median"] + 1e-3)
    comps = model.components(x_cal, held)
    raw_cal = model.combine(comps)
    c["threshold"] = settings.threshold_margin * max(1.0, float(raw_cal.max()))
    summary = {
        "fit_rows": len(fit_rows),
        "calibration_rows": len(cal_rows),
        "calibration_rows_with_own_baseline": int((~np.isnan(held["rise_c"])).sum()),
        "calibration_raw_max": float(raw_cal.max()),
        "calibration_raw_q9999": float(np.quantile(raw_cal, 0.9999)),
        "calibration_component_max": {k: float(v.max()) for k, v in comps.items()},
        "prior_resistance_c_per_frac": dict(zip(cls_names, prior_r, strict=True)),
        "edge_c": {
            "thermal_rise": c["threshold"] * c["edge_rise_c"],
            "thermal_node": c["threshold"] * c["edge_node_c"],
            "thermal_gpu_rel": c["threshold"] * c["edge_rel"],
        },
    }
    return model, summary
