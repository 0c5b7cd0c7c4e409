"""Why the model scored what it did on a recording: every component per GPU-window, each GPU's own
baseline as a scorer would have had it, what drove an incident, and how close healthy GPUs came to one.

``evaluation`` uses it for ``healer model eval``; it is also the place to start when a false incident
needs explaining (``--json`` carries ``model_false_detail`` and ``healthy_margin`` per scenario).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import numpy.typing as npt

from healer.anomaly import dataset, thermal
from healer.anomaly import model as anomaly_model

F64 = npt.NDArray[np.float64]
Hit = tuple[str, int | None, float, str]
"""(node, gpu or None, time, detector / rule id)."""


@dataclasses.dataclass
class Scored:
    """A recording's windows as the model saw them: (windows, nodes, gpus) arrays."""

    scores: npt.NDArray[np.float64]
    components: dict[str, npt.NDArray[np.float64]]
    """Each component's value over the raw threshold (1.0: this component alone reaches 0.9)."""
    residual_c: npt.NDArray[np.float64]
    """Temperature minus the GPU's own model at its node's inlet reference."""
    inlet_ref_c: npt.NDArray[np.float64]
    """The inlet reference of the GPU's node (°C; ``nan`` where none)."""
    power_frac: npt.NDArray[np.float64]
    ready: npt.NDArray[np.bool_]


THERMAL_KEYS = ("rise_c", "gpu_rel", "node_c", "residual_c", "inlet_ref_c", "peer_z")


def replay(
    state: thermal.ThermalState,
    w: dataset.Windows,
    cls: npt.NDArray[np.intp],
    power_column: int = anomaly_model.HEAT_COLUMN,
) -> dict[str, F64]:
    """Feed recorded windows in time order through a thermal state, as a scorer called once per window
    would: each key of ``THERMAL_KEYS`` (windows, nodes, gpus), plus ``ready`` (1.0 / 0.0).
    ``power_column``: the base feature the thermal baselines read (``Model.power_column``)."""
    state.ensure(w.node_names)
    out = {k: np.full(w.valid.shape, np.nan) for k in (*THERMAL_KEYS, "ready")}
    step = float(w.ts[1] - w.ts[0]) if len(w.ts) > 1 else 30.0
    temp = w.feats[..., anomaly_model.TEMP_COLUMN]
    power = w.feats[..., power_column]
    for k in range(len(w.ts)):
        hot = np.nan_to_num(w.feats[k, ..., anomaly_model.THROTTLE_COLUMN]) > 0
        st = state.step(temp[k], power[k], w.valid[k], cls, float(w.ts[k]), step if k else 0.0, hot)
        for key in THERMAL_KEYS:
            v = getattr(st, key)
            if v is not None:
                out[key][k] = v
        out["ready"][k] = st.ready
    return out


def score_windows(m: anomaly_model.Model, w: dataset.Windows) -> Scored:
    """Score recorded windows in time order, with the thermal baselines learned as a scorer would."""
    g = w.valid.shape[2]
    cls = m.class_index(w.models)
    th = replay(m.new_state(g), w, cls, m.power_column)
    scores = np.zeros(w.valid.shape)
    comps = {k: np.zeros(w.valid.shape) for k in anomaly_model.COMPONENTS}
    if w.valid.any():
        v = w.valid
        per = m.components(w.feats[v], {k: th[k][v] for k in ("rise_c", "gpu_rel", "node_c", "peer_z")})
        for k in anomaly_model.COMPONENTS:
            comps[k][v] = per[k] / m.calib["threshold"]
        scores[v] = anomaly_model.to_score(m.combine(per), m.calib["threshold"])
    power = np.nan_to_num(w.feats[..., anomaly_model.POWER_COLUMN])
    return Scored(scores, comps, th["residual_c"], th["inlet_ref_c"], power, th["ready"] > 0)


def explain(hit: Hit, w: dataset.Windows, scored: Scored, start: float) -> dict[str, Any]:
    """What drove an incident: the window's score, each component, the GPU's residual and own baseline."""
    node, gpu, t, _ = hit
    k = int(np.searchsorted(w.ts, t))
    n = w.node_names.index(node)
    g = 0 if gpu is None else gpu
    comps = {name: round(float(v[k, n, g]), 3) for name, v in scored.components.items()}
    own = float(scored.inlet_ref_c[k, n, g])
    return {
        "node": node,
        "gpu": gpu,
        "model": w.models[n][g],
        "at_s": round(t - start, 1),
        "score": round(float(scored.scores[k, n, g]), 4),
        "component": max(comps, key=lambda name: comps[name]),
        "components": comps,
        "residual_c": round(float(scored.residual_c[k, n, g]), 2),
        "inlet_ref_c": None if np.isnan(own) else round(own, 2),
        "own_baseline": bool(scored.ready[k, n, g]),
        "power_frac": round(float(scored.power_frac[k, n, g]), 3),
    }


def healthy_margin(
    w: dataset.Windows, scored: Scored, truth: list[dict[str, Any]], hold_s: float
) -> dict[str, Any]:
    """How close healthy GPUs came to an incident: per component, the highest value it held for the
    whole hold (the smallest over ``hold_s``) on a node with no fault started yet; 1.0 is enough for
    the anomaly rule to fire on that component alone. Far below 1.0 means false incidents are rare for
    a reason, not by luck of the seeds."""
    if len(w.ts) == 0:
        return {"by_component": {}, "worst": None}
    step = float(w.ts[1] - w.ts[0]) if len(w.ts) > 1 else 30.0
    width = min(len(w.ts), round(hold_s / step) + 1)
    healthy = np.ones(w.valid.shape, dtype=np.bool_)
    for f in truth:
        if f["node"] in w.node_names:
            healthy[w.ts >= f["start"], w.node_names.index(f["node"]), :] = False
    by_component: dict[str, float] = {}
    worst: dict[str, Any] | None = None
    for name, v in scored.components.items():
        held = np.where(healthy & w.valid, v, 0.0)
        held = np.lib.stride_tricks.sliding_window_view(held, width, axis=0).min(axis=-1)
        k, n, g = np.unravel_index(int(np.argmax(held)), held.shape)
        by_component[name] = round(float(held[k, n, g]), 3)
        if worst is None or held[k, n, g] > worst["value"]:
            at = float(w.ts[k + width - 1] - w.ts[0])
            worst = {
                "value": round(float(held[k, n, g]), 3),
                "component": name,
                "node": w.node_names[n],
                "gpu": int(g),
                "at_s": at,
            }
    return {"by_component": by_component, "worst": worst}
