"""The thermal baselines kept across a restart: ``ThermalState`` as a JSON-able dict and back."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from healer.anomaly.thermal_settings import _STATS, F64, STATE_FORMAT

if TYPE_CHECKING:
    from healer.anomaly.thermal import ThermalState


def export(st: ThermalState) -> dict[str, Any]:
    """The learned state as a JSON-able dict: per node its GPUs' fit statistics and steady seconds,
    its inlet level; per class the fleet's median resistance."""

    def rnd(v: F64) -> list[float]:
        return [float(x) for x in v.tolist()]

    nodes: dict[str, Any] = {}
    for i, name in enumerate(st.node_names):
        nodes[name] = {
            "stats": [rnd(st.stats[k, i]) for k in range(len(_STATS))],
            "busy_s": rnd(st.busy_s[i]),
            "seen_s": [rnd(st.seen[k, i]) for k in range(len(st.seen))],
            "level_c": None if np.isnan(st.level[i]) else float(st.level[i]),
            "level_s": float(st.level_s[i]),
            "level_at": float(st.level_at[i]) if np.isfinite(st.level_at[i]) else None,
            "trend_c_per_h": float(st.trend[i] * 3600.0),
            "band_off_c": rnd(st.band_off[:, i]),
            "band_s": rnd(st.band_s[:, i]),
            "ref_c": None if np.isnan(st.ref_last[i]) else float(st.ref_last[i]),
            "ref_at": float(st.ref_at[i]) if np.isfinite(st.ref_at[i]) else None,
            "peer_off_c": float(st.peer_off[i]),
        }
    for name, doc in st._pending.items():
        nodes.setdefault(name, doc)
    return {
        "format": STATE_FORMAT,
        "gpus": st.gpus,
        "classes": st.classes,
        "fleet_r": [float(x) for x in st.fleet_r[: len(st.classes)]],
        "curve_err": [float(x) for x in st.curve_err[: len(st.classes)]],
        "nodes": nodes,
    }


def import_(st: ThermalState, state: dict[str, Any]) -> int:
    """Load an exported state: nodes already known are restored at once, the others when they first
    report. Returns how many nodes the state holds. A wrong format or GPU count raises ValueError."""
    if state.get("format") != STATE_FORMAT:
        raise ValueError(f"anomaly state format {state.get('format')!r}, expected {STATE_FORMAT!r}")
    if int(state.get("gpus", -1)) != st.gpus:
        raise ValueError(f"anomaly state has {state.get('gpus')} GPUs per node, scorer {st.gpus}")
    for c, r in zip(state.get("classes", []), state.get("fleet_r", []), strict=False):
        if c in st.classes:
            st.fleet_r[st.classes.index(c)] = float(r)
    for c, e in zip(state.get("classes", []), state.get("curve_err", []), strict=False):
        if c in st.classes:
            st.curve_err[st.classes.index(c)] = float(e)
    index = {name: i for i, name in enumerate(st.node_names)}
    nodes = state.get("nodes", {})
    for name, doc in nodes.items():
        if len(doc["stats"]) != len(_STATS) or any(len(v) != st.gpus for v in doc["stats"]):
            raise ValueError(f"anomaly state for {name}: malformed statistics")
        i = index.get(name)
        if i is None:
            st._pending[name] = doc
        else:
            apply(st, i, doc)
    return len(nodes)


def apply(st: ThermalState, i: int, doc: dict[str, Any]) -> None:
    """Restore node ``i`` from its exported document."""
    st.stats[:, i] = np.array(doc["stats"], dtype=np.float64)
    st.busy_s[i] = np.array(doc["busy_s"], dtype=np.float64)
    st.level[i] = np.nan if doc.get("level_c") is None else float(doc["level_c"])
    st.level_s[i] = float(doc.get("level_s", 0.0))
    st.level_at[i] = -math.inf if doc.get("level_at") is None else float(doc["level_at"])
    st.trend[i] = float(doc.get("trend_c_per_h", 0.0)) / 3600.0
    st.seen[:, i] = np.array(doc["seen_s"], dtype=np.float64)
    st.band_off[:, i] = np.array(doc["band_off_c"], dtype=np.float64)
    st.band_s[:, i] = np.array(doc["band_s"], dtype=np.float64)
    st.ref_last[i] = np.nan if doc.get("ref_c") is None else float(doc["ref_c"])
    st.ref_at[i] = -math.inf if doc.get("ref_at") is None else float(doc["ref_at"])
    st.peer_off[i] = float(doc.get("peer_off_c", 0.0))
