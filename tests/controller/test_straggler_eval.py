"""The fail-slow evaluation's bounds and summary (controller/straggler_eval.py)."""

from __future__ import annotations

import pytest

from healer.controller import straggler_eval, stragglers


def test_the_share_lower_bound_is_clopper_pearson() -> None:
    assert straggler_eval.lower95(10, 10) == pytest.approx(0.6915, abs=1e-3)
    assert straggler_eval.lower95(57, 60) == pytest.approx(0.8607, abs=2e-3)
    assert straggler_eval.lower95(0, 10) == 0.0


def test_the_summary_counts_faults_found_within_five_minutes_only() -> None:
    run = {
        "seed": 1, "nodes": 10, "hours": 24.0, "gpus": 80, "false_episodes": 1, "healthy_node_days": 9.0,
        "cpu_s": 1.0, "sim_s": 86400.0,
        "faults": [
            {"kind": "clock_limited_gpu", "node": 1, "gpu": 2, "onset_s": 1.0, "found_s": 180.0,
             "loaded_s": 0.0},
            {"kind": "pcie_down_trained", "node": 2, "gpu": 0, "onset_s": 1.0, "found_s": 400.0,
             "loaded_s": 310.0},
            {"kind": "clock_limited_node", "node": 3, "gpu": None, "onset_s": 1.0, "found_s": None},
        ],
    }  # fmt: skip
    s = straggler_eval.summarize([run])
    assert s["found_within_5min"] == 1
    assert s["idle_through_5min"] == 2  # loaded only after 5 minutes, or never
    assert s["found_within_5min_of_load"] == 2
    assert s["found_by_kind"] == {
        "clock_limited_gpu": "1/1",
        "pcie_down_trained": "0/1",
        "clock_limited_node": "0/1",
    }
    assert s["false_per_1000_node_days"] == pytest.approx(111.11, abs=0.01)


def test_on_healers_own_simulator_it_names_clock_limited_gpus_of_multi_node_jobs() -> None:
    run = straggler_eval.run_sim_seed(16, 2.0, 3, 4, stragglers.Settings())
    found = [f for f in run["faults"] if f["found_s"] is not None and f["found_s"] <= straggler_eval.DETECT_S]
    assert len(run["faults"]) == 4
    assert len(found) >= 3, run["faults"]
    assert run["false_episodes"] == 0
    assert straggler_eval.SIM_SCENARIO["job_nodes"] == (1, 8)
