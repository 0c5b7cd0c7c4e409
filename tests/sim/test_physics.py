"""Physics sanity: heat follows power, caps cool, throttle bits match, counters behave like NVML's."""

from __future__ import annotations

import numpy as np
import pytest

from healer import errors
from healer.schemas import fields
from healer.sim import faults, frames, physics, profiles, scenarios, workloads


def _fleet(nodes: int = 2, kind: int = workloads.TRAINING, seed: int = 3) -> physics.Fleet:
    fl = physics.Fleet(
        scenarios.node_names(nodes),
        8,
        [profiles.H100] * nodes,
        seed=seed,
        start_ts=scenarios.DEFAULT_START_TS,
        run_id="t",
        workload_mix={"training": 1.0},
    )
    fl.work.kind[:] = kind
    fl.work.end_t[:] = np.inf
    fl.work.ckpt_phase[:] = 100.0  # no checkpoint dip within the first half hour
    return fl


def _run(fl: physics.Fleet, seconds: float, dt: float = 1.0) -> None:
    for _ in range(int(seconds / dt)):
        fl.step(dt)


def test_temperature_rises_with_power_and_settles_with_a_time_constant() -> None:
    fl = _fleet(kind=workloads.IDLE)
    _run(fl, 300)
    idle_c = fl.temp[0].mean()
    fl.work.kind[:] = workloads.TRAINING
    fl.step(1.0)
    after_one_s = fl.temp[0].mean()
    _run(fl, 300)
    hot_c = fl.temp[0].mean()
    assert fl.power[0].mean() > 600
    assert hot_c > idle_c + 30
    assert after_one_s - idle_c < 0.1 * (hot_c - idle_c), "temperature must lag power (first order)"
    assert hot_c < profiles.H100.sheet.max_operating_temp_c


def test_power_cap_lowers_power_and_clocks_and_cools_the_gpu() -> None:
    fl = _fleet()
    _run(fl, 300)
    before_c, other_c = float(fl.temp[0, 0]), float(fl.temp[0, 1])
    fl.set_power_limit(0, 0, 300.0)
    _run(fl, 300)
    assert fl.power[0, 0] < 320
    assert fl.temp[0, 0] < before_c - 15
    assert fl.reasons[0, 0] & fields.ClocksEventReason.SW_POWER_CAP
    assert fl.sm_clock[0, 0] < 0.8 * profiles.H100.sheet.sm_clock_max_mhz
    assert abs(fl.temp[0, 1] - other_c) < 4, "the other GPUs are untouched"


def test_short_cooling_holds_the_core_at_max_operating_temperature_with_sw_thermal_bit() -> None:
    fl = _fleet()
    fl.cool_factor[0, 2] = 0.5
    _run(fl, 400)
    assert abs(fl.temp[0, 2] - profiles.H100.sheet.max_operating_temp_c) <= 2
    assert fl.reasons[0, 2] & fields.ClocksEventReason.SW_THERMAL_SLOWDOWN
    assert fl.sm_clock[0, 2] < profiles.H100.sheet.sm_clock_max_mhz
    assert not fl.reasons[0, 3] & fields.ClocksEventReason.SW_THERMAL_SLOWDOWN


def test_hw_thermal_slowdown_bits_when_even_idle_power_overheats() -> None:
    fl = _fleet()
    fl.cool_factor[0, 0] = 0.05
    _run(fl, 400)
    assert fl.temp[0, 0] >= profiles.H100.sheet.slowdown_temp_c
    bits = fields.ClocksEventReason.HW_THERMAL_SLOWDOWN | fields.ClocksEventReason.HW_SLOWDOWN
    assert fl.reasons[0, 0] & bits == bits
    assert fl.mem_temp[0, 0] > fl.temp[0, 0], "HBM tracks the core, a little warmer"


def test_idle_gpus_report_the_idle_reason_and_idle_clocks() -> None:
    fl = _fleet(kind=workloads.IDLE)
    _run(fl, 30)
    assert (fl.reasons & fields.ClocksEventReason.GPU_IDLE).all()
    assert (fl.sm_clock == profiles.H100.sm_clock_idle_mhz).all()


def test_counters_are_monotonic_and_gpu_reset_clears_only_volatile_ones() -> None:
    fl = _fleet()
    fl.sbe_rate[0, 1] = 50.0
    fl.nvlink_crc_rate[0, 1] = 200.0
    fl.pcie_replay_rate[0, 1] = 5.0
    last = {name: c.copy() for name, c in fl.counters.items()}
    energy = fl.energy.copy()
    for _ in range(60):
        fl.step(1.0)
        for name, c in fl.counters.items():
            assert (c >= last[name]).all(), name
            last[name] = c.copy()
        assert (fl.energy > energy).all()
        energy = fl.energy.copy()
    counts = fl.counters
    assert counts["ecc_sbe_volatile"][0, 1] > 0
    assert counts["nvlink_crc_flit_errors"][0, 1] > 0
    assert counts["pcie_replay_count"][0, 1] > 0
    assert counts["ecc_sbe_volatile"][0, 0] == 0
    aggregate = int(counts["ecc_sbe_aggregate"][0, 1])
    fl.remap_pending[0, 1] = True
    fl.reset_gpu(0, 1)
    for name in physics.VOLATILE:
        assert counts[name][0, 1] == 0, name
    assert counts["ecc_sbe_aggregate"][0, 1] == aggregate, "aggregate ECC survives a reset"
    assert not fl.remap_pending[0, 1], "a reset applies the pending row remap"


def test_node_reboot_clears_energy_restores_lost_gpus_and_starts_a_new_boot() -> None:
    fl = _fleet()
    fl.take_events()
    _run(fl, 10)
    fl.present[1, 3] = False
    fl.set_power_limit(1, 0, 400.0)
    old_boot = fl.boot_id(1)
    fl.reboot_node(1)
    assert (fl.energy[1] == 0).all()
    assert (fl.energy[0] > 0).all()
    assert fl.present[1, 3]
    assert fl.power_limit[1, 0] == 700.0
    assert fl.boot_id(1) != old_boot
    assert fl.seq[1] == 0
    assert [e["kind"] for e in fl.take_events()] == ["agent_start"]


def test_power_limit_outside_the_envelope_or_on_a_lost_gpu_is_refused() -> None:
    fl = _fleet()
    with pytest.raises(errors.PermanentError, match="outside"):
        fl.set_power_limit(0, 0, 150.0)
    with pytest.raises(errors.PermanentError, match="no GPU 9"):
        fl.power_limits(0, 9)
    fl.present[0, 4] = False
    with pytest.raises(errors.PermanentError, match="lost"):
        fl.set_power_limit(0, 4, 500.0)
    limits = fl.power_limits(0, 0)
    assert (limits.current_w, limits.default_w, limits.min_w, limits.max_w) == (700.0, 700.0, 200.0, 700.0)


def test_a100_profile_has_its_own_envelope() -> None:
    fl = physics.Fleet(
        ["a"], 4, [profiles.A100], seed=1, start_ts=1e9, run_id="t", workload_mix={"training": 1.0}
    )
    fl.work.kind[:] = workloads.TRAINING
    _run(fl, 200)
    assert fl.power.max() <= profiles.A100.sheet.power_max_w + 20
    assert frames.static_fields(fl.profiles, fl.uuids)[0][0]["model"] == profiles.A100.sheet.model
    assert (fl.nvlink_up == 12).all()


def test_unknown_fault_parameter_is_rejected_by_name() -> None:
    with pytest.raises(ValueError, match="unknown parameter 'rate'"):
        faults.validate_params("ecc_sbe_storm", {"rate": 1})
    with pytest.raises(ValueError, match="unknown fault kind"):
        faults.validate_params("meltdown", {})


def test_a_power_cap_lowers_the_sm_clock_with_the_cube_root_of_the_dynamic_power_left() -> None:
    fl = _fleet()
    _run(fl, 60)
    fl.set_power_limit(0, 0, 400.0)
    _run(fl, 30)
    wanted = (fl.p_full[0, 0] - fl.p_idle[0, 0]) * fl.util[0, 0] / 100.0
    ratio = (fl.power[0, 0] - fl.p_idle[0, 0]) / wanted
    assert fl.util[0, 0] >= 1.0
    assert ratio < 0.9
    assert abs(fl.sm_clock[0, 0] - profiles.H100.sheet.sm_clock_max_mhz * ratio ** (1 / 3)) < 1.0
