"""What the evaluation says about a false incident and about how close healthy GPUs came to one."""

from __future__ import annotations

import numpy as np

from healer.anomaly import dataset, diagnosis
from healer.anomaly import model as anomaly_model

STEPS, NODES, GPUS = 40, 2, 2


def _windows() -> dataset.Windows:
    ts = 1000.0 + 30.0 * np.arange(STEPS, dtype=np.float64)
    valid = np.ones((STEPS, NODES, GPUS), dtype=np.bool_)
    feats = np.zeros((STEPS, NODES, GPUS, 1))
    return dataset.Windows(ts, feats, valid, ["n0", "n1"], [["H100", "H100"]] * NODES, "test")


def _scored() -> diagnosis.Scored:
    shape = (STEPS, NODES, GPUS)
    comps = {k: np.full(shape, 0.1) for k in anomaly_model.COMPONENTS}
    inlet = np.full(shape, 27.0)
    inlet[:5] = np.nan  # no inlet reference in the first windows
    ready = np.ones(shape, dtype=np.bool_)
    ready[:5] = False  # own baselines not ready in the first windows
    return diagnosis.Scored(np.zeros(shape), comps, np.full(shape, 3.0), inlet, np.full(shape, 0.9), ready)


def test_explain_names_the_component_that_drove_the_incident() -> None:
    w, scored = _windows(), _scored()
    scored.components["thermal_gpu"][3, 1, 0] = 1.2
    scored.components["forest"][3, 1, 0] = 0.7
    early = diagnosis.explain(("n1", 0, float(w.ts[3]), "anomaly-score-high"), w, scored, float(w.ts[0]))
    assert early["component"] == "thermal_gpu"
    assert early["at_s"] == 90.0
    assert early["own_baseline"] is False  # not ready yet: only the fleet check watched it
    assert early["inlet_ref_c"] is None
    later = diagnosis.explain(("n1", 0, float(w.ts[20]), "anomaly-score-high"), w, scored, float(w.ts[0]))
    assert later["own_baseline"] is True
    assert later["inlet_ref_c"] == 27.0


def test_healthy_margin_is_what_a_component_held_for_the_whole_hold() -> None:
    w, scored = _windows(), _scored()
    scored.components["forest"][10:21, 0, 1] = 0.8  # 11 windows = 300 s: held for the whole hold
    scored.components["thermal_rise"][10:15, 0, 0] = 0.99  # a spike shorter than the hold
    scored.components["counters"][5:30, 1, 1] = 0.95  # on a node whose fault started before
    truth = [{"node": "n1", "gpu": None, "start": float(w.ts[0])}]
    margin = diagnosis.healthy_margin(w, scored, truth, hold_s=300.0)
    assert margin["by_component"]["forest"] == 0.8
    assert margin["by_component"]["thermal_rise"] == 0.1
    assert margin["by_component"]["counters"] == 0.1
    assert margin["worst"]["component"] == "forest"
    assert (margin["worst"]["node"], margin["worst"]["gpu"]) == ("n0", 1)
