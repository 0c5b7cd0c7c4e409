"""What the engine's fleet state says of one node or GPU, for the controller: a GPU's telemetry summary
(a hardware-replacement bundle's) and a node's GPU count (a node-wide rule's threshold)."""

from __future__ import annotations

import math

import numpy as np

from healer.rules import state as fleet_state


def summary(
    st: fleet_state.FleetState, node: str, gpu: int | None, now: float, window_s: float = 600.0
) -> dict[str, float]:
    """What the controller holds of one GPU's telemetry (the fields the loaded rules read): its newest
    readings (``latest.<field>``),
    for every field the rules keep a history of its average and maximum over ``window_s`` (where kept)
    (``avg_10m.<field>``, ``max_10m.<field>`` for 10 minutes), and the age of its newest frame. The
    telemetry part of a hardware-replacement bundle; empty for a node or GPU never seen."""
    st.flush()
    n = st.node_index(node)
    if n is None or gpu is None or gpu >= st.gpus or not st.seen[n, gpu]:
        return {}
    # a frame received after ``now`` was taken (the flush above brought it in) is 0 s old, not negative
    out: dict[str, float] = {"age_s": round(max(0.0, now - float(st.last_ts[n])), 3)}
    for name, col in st.col.items():
        v = float(st.latest[col, n, gpu])
        if not math.isnan(v):
            out[f"latest.{name}"] = round(v, 3)
    span = f"{window_s / 60:g}m"
    for name in sorted(st.history):
        kept = set(st.history[name].rings)  # only what the rules' range functions need is kept
        for func, label, needs in (
            ("avg_over_time", "avg", {"sum", "cnt"}),
            ("max_over_time", "max", {"max"}),
        ):
            if not needs <= kept:
                continue
            v = float(np.asarray(st.window(func, name, window_s, now))[n, gpu])
            if not math.isnan(v):
                out[f"{label}_{span}.{name}"] = round(v, 3)
    return out


def gpu_count(st: fleet_state.FleetState, node: str) -> int:
    """The GPUs ``node`` has: those it ever reported, or its ``gpus_expected`` if more (a node-wide
    rule's threshold is a share of these); 0 for a node never seen."""
    st.flush()
    n = st.node_index(node)
    if n is None:
        return 0
    expected = float(st.expected[n])
    seen = int(st.seen[n].sum())
    return max(seen, 0 if math.isnan(expected) else int(expected))
