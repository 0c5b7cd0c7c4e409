"""Every named scenario shows its faults' signatures in telemetry and events, with a truth record each."""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from healer import errors
from healer.schemas import fields
from healer.sim import faults, profiles, recording, scenarios

DT_S = 5.0
RUN_S = 2700.0


class Run:
    """A recorded scenario, as arrays, for signature checks."""

    def __init__(self, path: pathlib.Path, name: str, nodes: int, **build: Any) -> None:
        sim = scenarios.build(scenarios.load(name), nodes=nodes, gpus=8, seed=11, **build)
        recording.record(sim, path, duration_s=RUN_S, interval_s=DT_S)
        with recording.Recording(path) as rec:
            chunks = list(rec.chunks())
            self.events = rec.events()
            self.truth = rec.truth()
            self.index = {name: i for i, name in enumerate(rec.node_names)}
        self.cols = {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}

    def window(self, rec: dict[str, Any], settle_s: float = 0.0) -> np.ndarray[Any, Any]:
        ts = self.cols["ts"]
        mask = ts >= rec["visible_at"] + settle_s
        if rec["end"] is not None:
            mask &= ts < rec["end"]
        return np.flatnonzero(mask)

    def xids(self, rec: dict[str, Any]) -> set[int]:
        return {
            e["xid"]
            for e in self.events
            if e["kind"] == "xid" and e["node"] == rec["node"] and e["gpu_index"] == rec["gpu"]
        }


Check = Callable[[Run, dict[str, Any], np.ndarray[Any, Any], int, int], bool]


def _rises(field: str) -> Check:
    return lambda r, rec, w, n, g: bool(np.diff(r.cols[field][w, n, g]).max(initial=0) > 0)


def _excess(r: Run, steps: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Temperature minus what the power explains at nominal cooling: the inlet plus any cooling loss."""
    out: np.ndarray[Any, Any] = (
        r.cols["temp_c"][steps] - r.cols["power_w"][steps] * profiles.H100.thermal_c_per_w
    )
    return out


def _cooling(r: Run, rec: dict[str, Any], w: np.ndarray[Any, Any], n: int, g: int) -> bool:
    # the GPU runs hotter for its power than its node peers, compared with before the fault
    def vs_peers(steps: np.ndarray[Any, Any]) -> float:
        ex = _excess(r, steps)[:, n]
        return float(np.median(ex[:, g] - np.median(np.delete(ex, g, axis=1), axis=1)))

    before = np.flatnonzero(r.cols["ts"] < rec["start"])
    baseline = vs_peers(before) if len(before) else 0.0
    return vs_peers(w[len(w) * 3 // 4 :]) - baseline >= 3


def _inlet(r: Run, rec: dict[str, Any], w: np.ndarray[Any, Any], n: int, g: int) -> bool:
    # every GPU of the node runs hotter for its power than the rest of the fleet
    node_ex = np.median(_excess(r, w), axis=2)
    return float(np.median(node_ex[:, n] - np.median(node_ex, axis=1))) >= 5


SIGNATURES: dict[str, Check] = {
    "cooling_degradation": _cooling,
    "inlet_failure": _inlet,
    "ecc_sbe_storm": _rises("ecc_sbe_volatile"),
    "ecc_dbe": lambda r, rec, w, n, g: (
        bool(r.cols["ecc_dbe_volatile"][w[0], n, g] >= 1 and r.cols["row_remap_pending"][w[0], n, g])
        and 48 in r.xids(rec)
    ),
    "row_remap_pending": lambda r, rec, w, n, g: (
        bool(r.cols["row_remap_pending"][w[0], n, g]) and 63 in r.xids(rec)
    ),
    "row_remap_failure": lambda r, rec, w, n, g: (
        bool(r.cols["row_remap_failure"][w[0], n, g]) and 64 in r.xids(rec)
    ),
    "nvlink_crc_rising": _rises("nvlink_crc_flit_errors"),
    "nvlink_down": lambda r, rec, w, n, g: (
        bool(r.cols["nvlink_links_up"][w[0], n, g] < 18) and 74 in r.xids(rec)
    ),
    "pcie_downtrain": lambda r, rec, w, n, g: bool(
        r.cols["pcie_gen"][w[0], n, g] < 5 or r.cols["pcie_width"][w[0], n, g] < 16
    ),
    "pcie_replay_storm": _rises("pcie_replay_count"),
    "fell_off_bus": lambda r, rec, w, n, g: (
        bool(not r.cols["present"][w, n, g].any())
        and 79 in r.xids(rec)
        and any(e["kind"] == "gpu_lost" and e["node"] == rec["node"] for e in r.events)
    ),
    "gsp_timeout": lambda r, rec, w, n, g: (
        119 in r.xids(rec) and bool(r.cols["recovery_action"][w[0], n, g] == profiles.RECOVERY_GPU_RESET)
    ),
    "uncontained_ecc": lambda r, rec, w, n, g: (
        95 in r.xids(rec) and bool(r.cols["ecc_dbe_volatile"][w[0], n, g] >= 1)
    ),
    "node_silent": lambda r, rec, w, n, g: bool(not r.cols["report"][w, n].any()),
    "power_brake": lambda r, rec, w, n, g: bool(
        (r.cols["clocks_event_reasons"][w[-1], n] & fields.ClocksEventReason.HW_POWER_BRAKE_SLOWDOWN).all()
    ),
    "clock_limit": lambda r, rec, w, n, g: (
        bool(
            np.median(r.cols["sm_clock_mhz"][w, n, g])
            <= (1 - 0.8 * rec["params"]["drop"]) * profiles.H100.sheet.sm_clock_max_mhz
        )
        and bool((r.cols["clocks_event_reasons"][w, n, g] & fields.ClocksEventReason.HW_SLOWDOWN).all())
        and not r.xids(rec)
    ),
    "nvlink_degraded": lambda r, rec, w, n, g: (
        bool((r.cols["nvlink_links_up"][w, n, g] < 18).all()) and not r.xids(rec)
    ),
    "job_slowdown": lambda r, rec, w, n, g: (
        # the node's GPUs wait (less power) at full clock
        bool(np.median(r.cols["sm_clock_mhz"][w, n]) >= 1900)
        and bool(np.median(r.cols["power_w"][w, n]) < np.median(r.cols["power_w"][w]))
    ),
}


def test_every_fault_kind_has_a_signature_check() -> None:
    assert set(SIGNATURES) == set(faults.KINDS) - faults.PORT_KINDS, "port kinds: test_sim_ports.py"


def _check_all(run: Run) -> set[str]:
    seen = set()
    for rec in run.truth:
        settle = 120.0 if rec["kind"] in ("cooling_degradation", "inlet_failure") else 0.0
        w = run.window(rec, settle)
        if not len(w):
            continue
        n, g = run.index[rec["node"]], rec["gpu"] if rec["gpu"] is not None else 0
        assert SIGNATURES[rec["kind"]](run, rec, w, n, g), f"no signature for {rec}"
        seen.add(rec["kind"])
    return seen


EXPECTED = {
    "healthy": set(),
    "overheat": {"cooling_degradation", "inlet_failure"},
    "ecc": {"ecc_sbe_storm", "ecc_dbe", "row_remap_pending", "row_remap_failure", "uncontained_ecc"},
    "nvlink": {"nvlink_crc_rising", "nvlink_down"},
    "pcie": {"pcie_downtrain", "pcie_replay_storm"},
    "fell-off-bus": {"fell_off_bus"},
    "mixed": set(faults.KINDS) - faults.PORT_KINDS - faults.FAIL_SLOW_KINDS,
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_named_scenario_shows_each_faults_signature_and_truth(name: str, tmp_path: pathlib.Path) -> None:
    run = Run(tmp_path / "r.npz", name, nodes=16)
    assert {t["kind"] for t in run.truth} == EXPECTED[name]
    assert _check_all(run) == EXPECTED[name]
    for rec in run.truth:
        assert rec["start"] <= rec["visible_at"]
        assert set(rec) >= {"node", "gpu", "kind", "start", "visible_at", "params"}


def test_healthy_fleet_is_not_flat_and_stays_below_thresholds(tmp_path: pathlib.Path) -> None:
    run = Run(tmp_path / "r.npz", "healthy", nodes=16)
    assert not [e for e in run.events if e["kind"] != "agent_start"]
    temp, util = run.cols["temp_c"], run.cols["util_gpu_pct"]
    assert temp.max() < profiles.H100.sheet.max_operating_temp_c
    assert util.std() > 10
    assert np.median(np.abs(np.diff(util, axis=0))) > 0
    assert (run.cols["ecc_sbe_volatile"] == 0).all()


def test_realistic_draws_faults_at_table5_rates_times_the_multiplier(tmp_path: pathlib.Path) -> None:
    run = Run(tmp_path / "r.npz", "realistic", nodes=16, fault_rate_multiplier=5000.0)
    gpu_hours = 16 * 8 * RUN_S / 3600.0
    expected = (
        5000.0 * gpu_hours * sum(e.rate_per_gpu_hour for e in scenarios.load("realistic").random_faults)
    )
    assert 0.4 * expected < len(run.truth) < 1.8 * expected
    _check_all(run)


def test_realistic_without_a_multiplier_is_quiet_in_a_short_run() -> None:
    sim = scenarios.build(scenarios.load("realistic"), nodes=16, gpus=8, seed=11)
    for _ in range(100):
        sim.step(10.0)
    assert sim.take_truth() == []


def test_same_seed_gives_same_frames_events_and_truth_and_another_seed_does_not() -> None:
    def run(seed: int) -> tuple[list[bytes], list[Any], list[Any]]:
        sim = scenarios.build(scenarios.load("mixed"), nodes=16, gpus=8, seed=seed)
        out: list[bytes] = []
        for _ in range(150):
            sim.step(5.0)
            out.extend(b for _, b in sim.frames())
        return out, sim.take_events(), sim.take_truth()

    a, b, c = run(7), run(7), run(8)
    assert a == b
    assert a[0] != c[0]
    assert a[2] != c[2]


def test_scenario_file_is_loaded_and_bad_ones_are_explained(tmp_path: pathlib.Path) -> None:
    good = tmp_path / "mine.yaml"
    good.write_text(
        "name: mine\nmodels: {H200: 1}\nfaults:\n  - {kind: gsp_timeout, at_s: 10, nodes: [1], gpu: 5}\n"
    )
    sim = scenarios.build(scenarios.load(str(good)), nodes=2, gpus=8, seed=1)
    sim.step(11.0)
    (truth,) = sim.take_truth()
    assert (truth["node"], truth["gpu"], truth["kind"]) == ("sim-00001", 5, "gsp_timeout")
    assert sim.encoder.static[0][0]["model"] == profiles.H200.sheet.model
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nfaults:\n  - {kind: ecc_dbe, params: {rate_per_s: 3}}\n")
    with pytest.raises(errors.PermanentError, match="unknown parameter 'rate_per_s'"):
        scenarios.load(str(bad))
    with pytest.raises(errors.PermanentError, match="no scenario 'nope'"):
        scenarios.load("nope")
    out_of_range = tmp_path / "range.yaml"
    out_of_range.write_text("name: r\nfaults:\n  - {kind: ecc_dbe, nodes: [5]}\n")
    with pytest.raises(errors.PermanentError, match=r"nodes \[5\]"):
        scenarios.build(scenarios.load(str(out_of_range)), nodes=2)


def test_builtin_scenarios_are_all_listed() -> None:
    # fabric: test_sim_ports.py; failslow: test_sim_failslow.py
    assert set(scenarios.builtin_names()) == {*EXPECTED, "realistic", "fabric", "failslow"}
