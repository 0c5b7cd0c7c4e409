"""Learning what healthy looks like on a deployment before (or instead of) warming up live.

``healer model calibrate`` replays recorded telemetry (simulator recordings, or the
``HEALER_TELEMETRY`` stream) through the scorer's thermal state in time order, exactly as a live scorer
called every ``bucket_s`` would have learned it, and writes the exported state: a controller that
imports it (``Scorer.import_state``) scores every calibrated GPU against its own baseline from its
first window instead of after its first 15 steady busy minutes. Several inputs are replayed one after
the other, each continuing from the state the previous one left (nodes are matched by name).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from healer.anomaly import dataset, diagnosis
from healer.anomaly import model as anomaly_model


def calibrate(
    m: anomaly_model.Model, windows: list[dataset.Windows], initial: dict[str, Any] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(state for ``Scorer.import_state``, summary) after replaying ``windows`` in order."""
    doc = initial
    summary: dict[str, Any] = {"sources": [], "nodes": 0, "gpus": 0, "gpus_ready": 0, "hours": 0.0}
    for w in windows:
        gpus = w.valid.shape[2]
        st = m.new_state(gpus)
        if doc is not None:
            st.import_(doc)
        diagnosis.replay(st, w, m.class_index(w.models), m.power_column)
        doc = st.export()
        a, b = w.span_s
        summary["sources"].append(w.source)
        summary["hours"] += round((b - a) / 3600, 2)
        summary["nodes"] = len(doc["nodes"])
        summary["gpus"] = len(doc["nodes"]) * gpus
        summary["gpus_ready"] = int(
            sum(int(np.sum(np.array(n["busy_s"]) >= st.s.init_s)) for n in doc["nodes"].values())
        )
    if doc is None:
        raise ValueError("nothing to calibrate from")
    return doc, summary
