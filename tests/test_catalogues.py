"""One catalogue per fact: telemetry counters and GPU datasheets are written once and read everywhere."""

from __future__ import annotations

import dataclasses

import pytest

from healer.rules import baseline, metrics
from healer.schemas import datasheets, fields, telemetry
from healer.sim import fleet, profiles


def test_every_counter_is_a_numeric_gpu_sample_field_and_the_rules_mark_exactly_those() -> None:
    assert set(fields.COUNTERS) <= set(telemetry.GpuSample.model_fields)
    assert {m.name for m in metrics.SAMPLE.values() if m.kind == "counter"} == set(fields.COUNTERS)


def test_the_simulator_advances_and_resets_the_catalogued_counters() -> None:
    assert set(fleet.COUNTERS) == set(fields.ERROR_COUNTERS) - {"retired_pages"}
    assert set(fleet.VOLATILE) == {n for n, c in fields.COUNTERS.items() if c.cleared_by == "gpu-reset"}
    assert "ecc_dbe_aggregate" not in fleet.VOLATILE, "aggregate ECC survives a reset"


@pytest.mark.parametrize("sheet", list(datasheets.BY_MODEL.values()), ids=lambda s: s.model)
def test_rules_and_simulator_read_the_same_datasheet(sheet: datasheets.Datasheet) -> None:
    healthy = baseline.healthy(sheet.model)
    assert healthy["slowdown_temp_c"] == sheet.slowdown_temp_c
    assert healthy["power_default_w"] == sheet.power_default_w
    assert healthy["mem_total_mib"] == sheet.mem_total_mib
    assert healthy["nvlink_links_total"] == sheet.nvlink_links
    profile = next(p for p in profiles.PROFILES.values() if p.model == sheet.model)
    as_profile = dataclasses.asdict(profile)
    assert {k: as_profile[k] for k in sheet.figures()} == sheet.figures()
