"""The fail-slow evaluation's bounds and summary (healer/evals/straggler_eval.py)."""

from __future__ import annotations

import pytest

from healer.controller.failslow import straggler_settings
from healer.evals import straggler_eval, straggler_sim_eval


def test_the_share_lower_bound_is_clopper_pearson() -> None:
    assert straggler_eval.lower95(10, 10) == pytest.approx(0.6915, abs=1e-3)
    assert straggler_eval.lower95(57, 60) == pytest.approx(0.8607, abs=2e-3)
    assert straggler_eval.lower95(0, 10) == 0.0


def test_the_summary_counts_from_onset_from_the_drawn_time_and_from_the_first_loaded_sample() -> None:
    run = {
        "seed": 1, "nodes": 10, "hours": 24.0, "gpus": 80, "false_episodes": 1, "healthy_node_days": 9.0,
        "cpu_s": 1.0, "sim_s": 86400.0,
        "faults": [
            # drawn while computing: named 180 s later
            {"kind": "clock_limited_gpu", "node": 1, "gpu": 2, "drawn_at": 100.0, "onset_at": 100.0,
             "loaded_at": 100.0, "found_at": 280.0, "wrongly_named": 0},
            # drawn while idle: its job computes 310 s later and it is named 90 s after that
            {"kind": "pcie_down_trained", "node": 2, "gpu": 0, "drawn_at": 100.0, "onset_at": 410.0,
             "loaded_at": 415.0, "found_at": 500.0, "wrongly_named": 0},
            # its GPU never computes again in the run: no onset, not counted from onset
            {"kind": "clock_limited_node", "node": 3, "gpu": None, "drawn_at": 100.0, "onset_at": None,
             "loaded_at": None, "found_at": None, "wrongly_named": 0},
            # onset in the run's last 5 minutes: it could not have been named in time
            {"kind": "clock_limited_gpu", "node": 4, "gpu": 1, "drawn_at": 86000.0, "onset_at": 86200.0,
             "loaded_at": 86200.0, "found_at": None, "wrongly_named": 0},
            # found, but 310 s after its onset
            {"kind": "clock_limited_node", "node": 5, "gpu": None, "drawn_at": 100.0, "onset_at": 100.0,
             "loaded_at": 200.0, "found_at": 410.0, "wrongly_named": 0},
        ],
    }  # fmt: skip
    s = straggler_eval.summarize([run])
    onset, drawn, loaded = s["from_onset"], s["from_drawn"], s["from_loaded"]
    assert (onset["found"], onset["faults"]) == (2, 3)
    assert (onset["without_start"], onset["start_in_last_5min"]) == (1, 1)
    assert onset["by_kind"] == {
        "clock_limited_gpu": "1/1",
        "pcie_down_trained": "1/1",
        "clock_limited_node": "0/1",
    }
    assert onset["median_s"] == 135.0
    assert (drawn["found"], drawn["faults"]) == (1, 5)  # the old counting: every fault, from its drawn time
    assert (loaded["found"], loaded["faults"]) == (3, 3)  # 85 s and 210 s after the first loaded sample
    assert onset["lower95"] == pytest.approx(straggler_eval.lower95(2, 3), abs=1e-3)
    assert s["false_per_1000_node_days"] == pytest.approx(111.11, abs=0.01)
    assert "job_level" not in s


def test_on_healers_own_simulator_it_names_the_culprits_and_nobody_for_a_job_level_stall() -> None:
    run = straggler_sim_eval.run_sim_seed(32, 2.5, 3, 8, straggler_settings.Settings())
    faults = run["faults"]
    assert sorted(f["kind"] for f in faults) == sorted(straggler_sim_eval.SIM_KINDS * 2)
    assert run["false_episodes"] == 0
    assert run["false_job_level"] == 0
    for f in faults:
        assert f["wrongly_named"] == 0, f
        if f["kind"] == "job_slowdown" and f["onset_at"] is None:
            continue  # a stage with slack absorbed it: no job ran 5 % slower
        assert f["onset_at"] is not None, f
        assert f["found_at"] is not None, f
        assert f["found_at"] - f["onset_at"] <= straggler_eval.DETECT_S, f
    s = straggler_eval.summarize([run], straggler_sim_eval.SIM_KINDS)
    assert s["job_level"]["named_nobody"] == 2
    reported = s["job_level"]["reported_from_steps"]
    assert (reported["found"], reported["faults"], reported["without_start"]) == (2, 2, 0)
    assert s["from_onset"]["by_kind"] == {
        "clock_limit": "2/2",
        "nvlink_degraded": "2/2",
        "port_congestion": "2/2",
    }


def test_the_simulators_healthy_node_days_are_told_by_job_size_split_nodes_and_training() -> None:
    run = straggler_sim_eval.run_sim_seed(32, 2.5, 3, 8, straggler_settings.Settings())
    days = run["computing_node_days"]
    by_size = [days[f"jobs of {c} node{'' if c == '1' else 's'}"] for c in straggler_sim_eval.SIZE_CLASSES]
    # seed 3's 32 nodes: jobs of 1 to 8-15 nodes compute, split nodes among the single ones
    assert all(v > 0 for v in by_size[:4]), days
    assert by_size[4:] == [0.0, 0.0], days  # no job of 16 nodes or more fits this fleet's draw
    assert 0 < days["split 4+4"] <= days["jobs of 1 node"]
    assert 0 < days["training"] <= sum(by_size) + 1e-3
    assert sum(by_size) <= run["healthy_node_days"]
    two = straggler_eval.summarize([run, run], straggler_sim_eval.SIM_KINDS)["computing_node_days"]
    assert two["training"] == pytest.approx(2 * days["training"], abs=0.05)
