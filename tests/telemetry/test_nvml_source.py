"""NvmlSource against the fake pynvml: full frames, NotSupported, lost GPUs, NVML errors, power limits."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence

import hypothesis
import pytest
from hypothesis import strategies as st
from structlog import testing as structlog_testing

from healer import errors
from healer.schemas import codec, telemetry
from healer.telemetry import nvml, source
from tests.fakes import fake_pynvml as fp


@pytest.fixture
def fake() -> fp.FakeNvml:
    return fp.FakeNvml(8)


@pytest.fixture
def src(fake: fp.FakeNvml) -> Iterator[nvml.NvmlSource]:
    s = nvml.NvmlSource("gpu-node-1", nvml=fake.module())
    s.open()
    yield s
    s.close()


def _frame(sample: source.Sample, expected: int | None) -> telemetry.NodeFrame:
    frame = telemetry.NodeFrame(
        node="gpu-node-1",
        ts=time.time(),
        seq=1,
        boot_id="b",
        agent_version="0",
        source="nvml",
        gpus_expected=expected,
        gpus=sample.gpus,
    )
    return codec.decode_frame(codec.encode(frame))


def _unsupported_logs(logs: Sequence[Mapping[str, object]], index: int, field: str) -> int:
    return sum(
        1
        for e in logs
        if e["event"] == "nvml_field_unsupported" and e["gpu_index"] == index and e["field"] == field
    )


def test_full_frame_converts_nvml_units_and_validates_on_the_wire(
    src: nvml.NvmlSource, fake: fp.FakeNvml
) -> None:
    fake.gpus[5].power_mw = 350_500
    fake.gpus[5].energy_mj = 9_876_543
    fake.gpus[5].clocks_event_reasons = 0x4
    fake.gpus[5].remapped_rows = (3, 1, 1, 0)
    fake.gpus[5].links_up = 16
    fake.gpus[5].fields[fp.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL] = 1234
    fake.gpus[5].ecc[(fp.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, fp.NVML_VOLATILE_ECC)] = 2
    sample = src.sample()
    frame = _frame(sample, src.gpus_expected)
    assert src.kind == "nvml"
    assert src.gpus_expected == 8
    assert sample.events == []
    assert [g.index for g in frame.gpus] == list(range(8))
    g = frame.gpus[5]
    assert g.uuid == fake.gpus[5].uuid
    assert g.model == "NVIDIA H100 80GB HBM3"
    assert g.pci_bus_id == "00000000:68:00.0"
    assert (g.temp_c, g.mem_temp_c) == (61.0, 52.0)
    assert (g.slowdown_temp_c, g.shutdown_temp_c, g.mem_max_temp_c) == (90.0, 92.0, 95.0)
    assert g.power_w == 350.5
    assert (g.power_limit_w, g.power_default_w, g.power_min_w, g.power_max_w) == (700.0, 700.0, 200.0, 700.0)
    assert g.energy_j == pytest.approx(9876.543)
    assert (g.util_gpu_pct, g.util_mem_pct) == (93.0, 57.0)
    assert (g.mem_used_mib, g.mem_total_mib) == (61440.0, 81559.0)
    assert (g.sm_clock_mhz, g.sm_clock_max_mhz, g.clocks_event_reasons) == (1980.0, 1980.0, 4)
    assert (g.ecc_sbe_volatile, g.ecc_dbe_volatile, g.ecc_sbe_aggregate, g.ecc_dbe_aggregate) == (0, 2, 0, 0)
    assert (g.remapped_rows_correctable, g.remapped_rows_uncorrectable) == (3, 1)
    assert (g.row_remap_pending, g.row_remap_failure) == (True, False)
    assert (g.nvlink_links_total, g.nvlink_links_up, g.nvlink_crc_flit_errors) == (18, 16, 1234)
    assert (g.nvlink_crc_data_errors, g.nvlink_replay_errors, g.nvlink_recovery_errors) == (0, 0, 0)
    assert (g.pcie_gen, g.pcie_gen_max, g.pcie_width, g.pcie_width_max, g.pcie_replay_count) == (
        5,
        5,
        16,
        16,
        0,
    )
    assert g.recovery_action == 0
    assert (g.retired_pages, g.retired_pages_pending) == (None, None)  # Hopper: row remapping instead


def test_retired_pages_are_counted_where_the_gpu_retires_pages(fake: fp.FakeNvml) -> None:
    gpu = fake.gpus[0]
    gpu.unsupported.clear()
    gpu.retired_pages = {0: [0x1000, 0x2000], 1: [0x3000]}
    gpu.retired_pending = fp.NVML_FEATURE_ENABLED
    s = nvml.NvmlSource("n", nvml=fake.module())
    s.open()
    g = s.sample().gpus[0]
    assert (g.retired_pages, g.retired_pages_pending) == (3, True)


def test_static_readings_are_read_once_and_cached(src: nvml.NvmlSource, fake: fp.FakeNvml) -> None:
    for _ in range(5):
        src.sample()
    assert fake.calls["nvmlDeviceGetUUID"] == 8
    assert fake.calls["nvmlDeviceGetPowerManagementLimitConstraints"] == 8
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 40


def test_not_supported_fields_are_none_logged_once_and_not_asked_again(fake: fp.FakeNvml) -> None:
    fake.gpus[1].unsupported |= {"nvmlDeviceGetPowerUsage", "nvmlDeviceGetTemperatureThreshold"}
    del fake.gpus[1].fields[fp.NVML_FI_DEV_MEMORY_TEMP]
    s = nvml.NvmlSource("n", nvml=fake.module())
    s.open()
    with structlog_testing.capture_logs() as logs:
        samples = [s.sample() for _ in range(6)]
    assert all(smp.events == [] for smp in samples)
    g = samples[-1].gpus[1]
    assert (g.power_w, g.mem_temp_c, g.slowdown_temp_c, g.shutdown_temp_c) == (None, None, None, None)
    assert g.temp_c == 61.0
    assert samples[-1].gpus[0].power_w == 612.345
    for field in ("power_w", "mem_temp_c", "slowdown_temp_c", "shutdown_temp_c", "mem_max_temp_c"):
        assert _unsupported_logs(logs, 1, field) == 1, field
    assert _unsupported_logs(logs, 0, "power_w") == 0
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 6 * 7 + 1


def test_a_constant_or_function_missing_from_pynvml_reads_as_unsupported(fake: fp.FakeNvml) -> None:
    module = fake.module()
    del module.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
    del module.nvmlDeviceGetCurrentClocksEventReasons  # older nvidia-ml-py: the Throttle spelling is used
    del module.nvmlDeviceGetPcieReplayCounter
    fake.gpus[0].clocks_event_reasons = 0x8
    s = nvml.NvmlSource("n", nvml=module)
    s.open()
    with structlog_testing.capture_logs() as logs:
        g = [s.sample() for _ in range(3)][-1].gpus[0]
    assert (g.recovery_action, g.pcie_replay_count) == (None, None)
    assert g.clocks_event_reasons == 0x8
    assert fake.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 3 * 8
    assert _unsupported_logs(logs, 0, "recovery_action") == 1
    assert _unsupported_logs(logs, 0, "pcie_replay_count") == 1


def test_a_call_the_driver_lacks_falls_back_to_its_other_spelling(
    src: nvml.NvmlSource, fake: fp.FakeNvml
) -> None:
    for gpu in fake.gpus:
        gpu.errors["nvmlDeviceGetTemperature"] = fp.NVML_ERROR_FUNCTION_NOT_FOUND
        gpu.errors["nvmlDeviceGetCurrentClocksEventReasons"] = fp.NVML_ERROR_FUNCTION_NOT_FOUND
    fake.gpus[0].temp_c, fake.gpus[0].clocks_event_reasons = 77, 0x20
    samples = [src.sample() for _ in range(3)]
    assert samples[-1].gpus[0].temp_c == 77.0
    assert samples[-1].gpus[0].clocks_event_reasons == 0x20
    assert all(smp.events == [] for smp in samples)
    assert fake.calls["nvmlDeviceGetTemperature"] == 1
    assert fake.calls["nvmlDeviceGetTemperatureV"] == 3 * 8


def test_lost_gpu_is_a_missing_entry_with_one_gpu_lost_event_until_it_returns(
    src: nvml.NvmlSource, fake: fp.FakeNvml
) -> None:
    src.sample()
    fake.gpus[3].lost = True
    first, second = src.sample(), src.sample()
    assert [g.index for g in first.gpus] == [0, 1, 2, 4, 5, 6, 7]
    assert [(e.kind, e.gpu_index, e.gpu_uuid) for e in first.events] == [("gpu_lost", 3, fake.gpus[3].uuid)]
    assert second.events == []
    assert len(second.gpus) == 7
    assert _frame(first, src.gpus_expected).gpus_expected == 8
    fake.gpus[3].lost = False
    back = src.sample()
    assert len(back.gpus) == 8
    assert back.events == []
    fake.gpus[3].lost = True
    assert [e.kind for e in src.sample().events] == ["gpu_lost"]


def test_gpu_lost_before_open_is_missing_from_the_first_frame(fake: fp.FakeNvml) -> None:
    fake.gpus[2].lost = True
    s = nvml.NvmlSource("n", nvml=fake.module(), gpus_expected=8)
    s.open()
    smp = s.sample()
    assert [g.index for g in smp.gpus] == [0, 1, 3, 4, 5, 6, 7]
    assert [(e.kind, e.gpu_index) for e in smp.events] == [("gpu_lost", 2)]
    assert s.sample().events == []


def test_fewer_gpus_than_expected_keeps_the_configured_expectation(fake: fp.FakeNvml) -> None:
    fake.gpus.pop()
    s = nvml.NvmlSource("n", nvml=fake.module(), gpus_expected=8)
    s.open()
    assert s.gpus_expected == 8
    assert len(s.sample().gpus) == 7


def test_unknown_error_is_one_nvml_error_event_rearmed_after_recovery(
    src: nvml.NvmlSource, fake: fp.FakeNvml
) -> None:
    fake.gpus[0].errors["nvmlDeviceGetTemperature"] = fp.NVML_ERROR_UNKNOWN
    first = src.sample()
    assert first.gpus[0].temp_c is None
    assert len(first.gpus) == 8
    assert [(e.kind, e.gpu_index) for e in first.events] == [("nvml_error", 0)]
    assert "temp_c" in first.events[0].message
    assert "999" in first.events[0].message
    assert src.sample().events == []
    fake.gpus[0].errors["nvmlDeviceGetTemperature"] = fp.NVML_ERROR_NO_DATA  # another code: reported
    assert len(src.sample().events) == 1
    del fake.gpus[0].errors["nvmlDeviceGetTemperature"]
    healed = src.sample()
    assert healed.gpus[0].temp_c == 61.0
    assert healed.events == []
    fake.gpus[0].errors["nvmlDeviceGetTemperature"] = fp.NVML_ERROR_UNKNOWN
    assert [e.kind for e in src.sample().events] == ["nvml_error"]


def test_per_field_errors_from_field_values_follow_the_same_rules(
    src: nvml.NvmlSource, fake: fp.FakeNvml
) -> None:
    fake.gpus[4].field_errors[fp.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL] = fp.NVML_ERROR_UNKNOWN
    smp = src.sample()
    assert smp.gpus[4].nvlink_replay_errors is None
    assert smp.gpus[4].nvlink_crc_flit_errors == 0
    assert [(e.kind, e.gpu_index) for e in smp.events] == [("nvml_error", 4)]
    fake.gpus[4].field_errors[fp.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL] = fp.NVML_ERROR_GPU_IS_LOST
    lost = src.sample()
    assert 4 not in [g.index for g in lost.gpus]
    assert [e.kind for e in lost.events] == ["gpu_lost"]


def test_a_value_the_schema_refuses_becomes_none_and_an_nvml_error(
    src: nvml.NvmlSource, fake: fp.FakeNvml
) -> None:
    fake.gpus[6].util_gpu = 250
    smp = src.sample()
    assert smp.gpus[6].util_gpu_pct is None
    assert smp.gpus[6].util_mem_pct == 57.0
    assert [(e.kind, e.gpu_index) for e in smp.events] == [("nvml_error", 6)]


def test_gpu_without_nvlink_has_no_link_counts(fake: fp.FakeNvml) -> None:
    for field_id in list(fake.gpus[0].fields):
        if field_id != fp.NVML_FI_DEV_MEMORY_TEMP:
            del fake.gpus[0].fields[field_id]
    s = nvml.NvmlSource("n", nvml=fake.module())
    s.open()
    g = s.sample().gpus[0]
    assert (g.nvlink_links_total, g.nvlink_links_up, g.nvlink_crc_flit_errors, g.mem_temp_c) == (
        None,
        None,
        None,
        52.0,
    )


FUNCTIONS = sorted(set(nvml.FUNCTIONS.values()) - {"nvmlDeviceGetCurrentClocksEventReasons"})


@hypothesis.settings(max_examples=40, deadline=None)
@hypothesis.given(
    st.sets(st.sampled_from(FUNCTIONS)), st.sampled_from([fp.NVML_ERROR_NOT_SUPPORTED, fp.NVML_ERROR_UNKNOWN])
)
def test_any_set_of_failing_calls_never_raises_and_never_invents_a_value(broken: set[str], code: int) -> None:
    fake = fp.FakeNvml(1)
    fake.gpus[0].errors = dict.fromkeys(broken, code)
    s = nvml.NvmlSource("n", nvml=fake.module())
    s.open()
    g = s.sample().gpus[0]
    if "nvmlDeviceGetPowerUsage" in broken:
        assert g.power_w is None
    if "nvmlDeviceGetFieldValues" in broken:
        assert (g.mem_temp_c, g.nvlink_links_total, g.nvlink_links_up) == (None, None, None)
    if "nvmlDeviceGetUUID" in broken:
        assert g.uuid is None
    s.close()


def test_power_limits_round_trip_in_watts(src: nvml.NvmlSource, fake: fp.FakeNvml) -> None:
    assert src.power_limits(2) == source.PowerLimits(700.0, 700.0, 200.0, 700.0)
    src.set_power_limit(2, 450.5)
    assert fake.gpus[2].limit_mw == 450_500
    assert src.power_limits(2).current_w == 450.5
    assert src.sample().gpus[2].power_limit_w == 450.5


@pytest.mark.parametrize(
    ("code", "error"),
    [
        (fp.NVML_ERROR_NO_PERMISSION, errors.PermanentError),
        (fp.NVML_ERROR_NOT_SUPPORTED, errors.PermanentError),
        (fp.NVML_ERROR_INVALID_ARGUMENT, errors.PermanentError),
        (fp.NVML_ERROR_UNKNOWN, errors.TemporaryError),
        (fp.NVML_ERROR_GPU_IS_LOST, errors.TemporaryError),
    ],
)
def test_set_power_limit_maps_nvml_errors(
    src: nvml.NvmlSource, fake: fp.FakeNvml, code: int, error: type[errors.HealerError]
) -> None:
    fake.gpus[0].errors["nvmlDeviceSetPowerManagementLimit"] = code
    with pytest.raises(error) as info:
        src.set_power_limit(0, 500)
    assert isinstance(info.value.__cause__, fp.NVMLError)
    assert fake.gpus[0].limit_mw == 700_000


def test_out_of_range_limit_and_unknown_gpu_are_permanent(src: nvml.NvmlSource) -> None:
    with pytest.raises(errors.PermanentError):
        src.set_power_limit(0, 5000)
    with pytest.raises(errors.PermanentError):
        src.set_power_limit(8, 500)
    with pytest.raises(errors.PermanentError):
        src.power_limits(-1)


def test_power_limits_unreadable_is_temporary(src: nvml.NvmlSource, fake: fp.FakeNvml) -> None:
    fake.gpus[1].errors["nvmlDeviceGetPowerManagementLimit"] = fp.NVML_ERROR_UNKNOWN
    with pytest.raises(errors.TemporaryError):
        src.power_limits(1)


@pytest.mark.parametrize(
    ("code", "error"),
    [
        (fp.NVML_ERROR_LIBRARY_NOT_FOUND, errors.PermanentError),
        (fp.NVML_ERROR_UNKNOWN, errors.TemporaryError),
    ],
)
def test_open_failures_are_healer_errors(
    fake: fp.FakeNvml, code: int, error: type[errors.HealerError]
) -> None:
    fake.init_error = code
    with pytest.raises(error):
        nvml.NvmlSource("n", nvml=fake.module()).open()


def test_no_gpu_is_a_permanent_error_and_releases_nvml() -> None:
    fake = fp.FakeNvml(0)
    with pytest.raises(errors.PermanentError):
        nvml.NvmlSource("n", nvml=fake.module()).open()
    assert fake.init_count == 0


def test_sample_before_open_is_refused_and_close_is_idempotent(fake: fp.FakeNvml) -> None:
    s = nvml.NvmlSource("n", nvml=fake.module())
    with pytest.raises(errors.PermanentError):
        s.sample()
    s.open()
    s.open()
    assert fake.init_count == 1
    s.close()
    s.close()
    assert fake.init_count == 0
