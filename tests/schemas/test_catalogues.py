"""One catalogue per fact: telemetry counters and GPU datasheets are written once and read everywhere."""

from __future__ import annotations

import dataclasses

import pytest

from healer.rules import baseline, metric_catalog
from healer.schemas import datasheets, fields, incidents, telemetry
from healer.sim import physics, profiles


def test_every_counter_is_a_numeric_gpu_sample_field_and_the_rules_mark_exactly_those() -> None:
    assert set(fields.COUNTERS) <= set(telemetry.GpuSample.model_fields)
    assert {m.name for m in metric_catalog.SAMPLE.values() if m.kind == "counter"} == set(fields.COUNTERS)


def test_the_simulator_advances_and_resets_the_catalogued_counters() -> None:
    assert set(physics.COUNTERS) == set(fields.ERROR_COUNTERS) - {"retired_pages"}
    assert set(physics.VOLATILE) == {n for n, c in fields.COUNTERS.items() if c.cleared_by == "gpu-reset"}
    assert "ecc_dbe_aggregate" not in physics.VOLATILE, "aggregate ECC survives a reset"


@pytest.mark.parametrize("sheet", list(datasheets.BY_MODEL.values()), ids=lambda s: s.model)
def test_rules_and_simulator_read_the_same_datasheet(sheet: datasheets.Datasheet) -> None:
    healthy = baseline.healthy(sheet.model)
    assert healthy["slowdown_temp_c"] == sheet.slowdown_temp_c
    assert healthy["power_default_w"] == sheet.power_default_w
    assert healthy["mem_total_mib"] == sheet.mem_total_mib
    assert healthy["nvlink_links_total"] == sheet.nvlink_links
    profile = next(p for p in profiles.PROFILES.values() if p.sheet.model == sheet.model)
    assert profile.sheet is sheet
    assert profile.figure("slowdown_temp_c") == sheet.slowdown_temp_c


def test_a_profile_declares_no_datasheet_figure_again() -> None:
    """The simulator's profile holds the datasheet; its own fields are physics only (#25)."""
    own = {f.name for f in dataclasses.fields(profiles.Profile)}
    assert own & {f.name for f in dataclasses.fields(datasheets.Datasheet)} == set()


def test_the_clock_reason_bits_are_nvmls_own() -> None:
    pynvml = pytest.importorskip("pynvml")
    for reason in fields.ClocksEventReason:
        camel = "".join(part.capitalize() for part in str(reason.name).split("_"))
        assert getattr(pynvml, f"nvmlClocksEventReason{camel}") == reason, reason.name


def test_rules_and_simulator_read_the_same_clock_reason_bits() -> None:
    """The rules' 0/1 clock metrics are the catalogue's; the simulator keeps no bits of its own."""
    assert {n for n, m in metric_catalog.DERIVED.items() if m.kind == "bool"} == set(fields.CLOCK_BITS)
    bit, _ = fields.CLOCK_BITS["clocks_sw_power_cap"]
    assert bit == fields.ClocksEventReason.SW_POWER_CAP
    assert "sw_power_cap" not in {n.lower() for n in vars(profiles)}, "one definition, in fields.py"


def test_the_action_status_catalogue_is_the_wire_type() -> None:
    """One declaration (#40): the wire field is the catalogue, and its published schema lists its values."""
    assert not hasattr(incidents, "Status"), "one name for it"
    assert incidents.ActionRecord.model_json_schema()["properties"]["status"]["enum"] == [
        s.value for s in incidents.ActionStatus
    ]
    record = incidents.ActionRecord.model_validate_json('{"kind": "cordon", "status": "done", "at": 1}')
    assert record.status is incidents.ActionStatus.DONE
    assert record.model_dump_json() == '{"kind":"cordon","status":"done","detail":"","at":1.0}'


def test_what_each_action_status_means() -> None:
    assert {"planned", "done", "already-done", "skipped"} == incidents.OK, "the next action runs"
    assert {"refused", "failed-temporary", "failed-permanent"} == incidents.FAILED, "the chain stops"
    assert set(incidents.OK | incidents.FAILED) - {"failed-temporary"} == incidents.FINAL, "never retried"
    assert {"done", "already-done"} == incidents.TOOK_EFFECT
