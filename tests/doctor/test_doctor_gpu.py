"""``healer doctor``'s GPU checks against the fake NVML: a healthy node, fields the GPU lacks, permission
denied, no driver, a lost GPU, refused event registration, and the power write test."""

from __future__ import annotations

import json
import pathlib

import jsonschema
import pytest

from healer.agent import doctor, doctor_gpu, doctor_rules
from healer.schemas import doctor_report
from tests.doctor import helpers
from tests.fakes import fake_pynvml as f

Status = doctor.Status
ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_a_healthy_h100_node_reads_every_field_but_page_retirement(tmp_path: pathlib.Path) -> None:
    fake = f.FakeNvml(2)
    report = helpers.run(fake, helpers.paths(tmp_path), gpus_expected=2)
    assert helpers.one(report, "nvml.library").data["driver_version"] == "570.133.20"
    assert helpers.one(report, "nvml.gpus").status is Status.OK
    for i in (0, 1):
        fields = helpers.one(report, "nvml.fields", gpu=i)
        assert fields.status is Status.INFO  # Hopper has no page retirement: a fact, nothing to fix
        states = fields.data["fields"]
        assert states["retired_pages"] == states["retired_pages_pending"] == "not_supported"
        assert states["temp_c"] == states["nvlink_crc_flit_errors"] == states["fabric_state"] == "supported"
        assert "jobs" not in states
        assert "index" not in states
        assert {s for n, s in states.items() if n not in ("retired_pages", "retired_pages_pending")} == {
            "supported"
        }
    assert helpers.one(report, "nvml.events").data["registered"] == [0, 1]
    assert helpers.one(report, "fabric_manager").status is Status.OK
    assert fake.init_count == 0, "every NVML session the doctor opened is closed again"


def test_a_field_the_driver_does_not_support_names_the_rules_that_cannot_fire(tmp_path: pathlib.Path) -> None:
    fake = f.FakeNvml(1)
    fake.gpus[0].unsupported.add("nvmlDeviceGetPcieReplayCounter")
    del fake.gpus[0].fields[f.NVML_FI_DEV_MEMORY_TEMP]
    fake.gpus[0].field_errors[f.NVML_FI_DEV_MEMORY_TEMP] = f.NVML_ERROR_NOT_SUPPORTED
    report = helpers.run(fake, helpers.paths(tmp_path))
    states = helpers.one(report, "nvml.fields", gpu=0).data["fields"]
    assert states["pcie_replay_count"] == "not_supported"
    assert states["mem_temp_c"] == "not_supported"
    unfed = helpers.one(report, "rules.fed").data["unfed"]
    pack = doctor_rules.load("rules")
    assert not isinstance(pack, str)
    readers = {r.id for r in pack.rules if "pcie_replay_count" in doctor_rules.inputs(r)}
    assert readers, "the pack has a rule on PCIe replays"
    assert readers <= set(unfed)
    assert all("pcie_replay_count" in unfed[r]["not_supported"] for r in readers)
    assert not any("pcie_replay_count" in g["not_supported"] for r, g in unfed.items() if r not in readers)


def test_permission_denied_on_a_field_fails_and_the_rules_reading_it_warn(tmp_path: pathlib.Path) -> None:
    fake = f.FakeNvml(1)
    fake.gpus[0].errors["nvmlDeviceGetTotalEccErrors"] = f.NVML_ERROR_NO_PERMISSION
    report = helpers.run(fake, helpers.paths(tmp_path))
    fields = helpers.one(report, "nvml.fields", gpu=0)
    assert fields.status is Status.FAIL
    assert {n for n, s in fields.data["fields"].items() if s == "error"} == {
        "ecc_sbe_volatile", "ecc_dbe_volatile", "ecc_sbe_aggregate", "ecc_dbe_aggregate",
    }  # fmt: skip
    assert any("Insufficient Permissions" in e for e in fields.data["errors"])
    rules = helpers.one(report, "rules.fed")
    assert rules.status is Status.WARN
    assert "ecc_dbe_volatile" in rules.data["unfed"]["ecc-dbe-new"]["error"]
    assert report.exit_code == 1


def test_no_driver_is_one_failure_and_every_gpu_rule_unfed(tmp_path: pathlib.Path) -> None:
    fake = f.FakeNvml(1)
    fake.init_error = f.NVML_ERROR_DRIVER_NOT_LOADED
    report = helpers.run(fake, helpers.paths(tmp_path))
    library = helpers.one(report, "nvml.library")
    assert library.status is Status.FAIL
    assert library.data["error"] == "NVMLError_DriverNotLoaded"
    assert "driver" in library.fix
    assert not report.by_id("nvml.fields")
    assert "temp_c" in helpers.one(report, "rules.fed").data["unfed"]["gpu-temp-near-slowdown"]["error"]
    rungs = {c.data["rung"]: c for c in report.by_id("rungs")}
    assert rungs["power_limit"].status is Status.WARN
    assert "NVML does not answer" in rungs["reset_gpu"].summary
    assert report.exit_code == 1


@pytest.mark.parametrize("lost", [0, 1])
def test_a_lost_gpu_fails_and_the_count_falls_short(tmp_path: pathlib.Path, lost: int) -> None:
    fake = f.FakeNvml(3)
    fake.gpus[lost].lost = True
    report = helpers.run(fake, helpers.paths(tmp_path), gpus_expected=4)
    assert helpers.one(report, "nvml.gpus").status is Status.FAIL  # 3 found, 4 expected
    check = helpers.one(report, "nvml.fields", gpu=lost)
    assert check.status is Status.FAIL
    assert "lost" in check.summary
    assert helpers.one(report, "nvml.fields", gpu=2).status is Status.INFO
    assert helpers.one(report, "nvml.events").data["not_registered"] == [lost]
    assert helpers.one(report, "nvml.library").data["driver_version"] == "570.133.20"
    assert report.exit_code == 1


def test_refused_event_registration_warns_and_without_kmsg_xids_reach_no_rule(tmp_path: pathlib.Path) -> None:
    fake = f.FakeNvml(2)
    for gpu in fake.gpus:
        gpu.supported_events = 0
    report = helpers.run(fake, helpers.paths(tmp_path, kmsg=False))
    assert helpers.one(report, "nvml.events").status is Status.WARN
    assert helpers.one(report, "host.kmsg").status is Status.WARN
    assert helpers.one(report, "xid.sources").status is Status.FAIL
    assert "xid_source" in helpers.one(report, "rules.fed").data["unfed"]["xid-fatal"]["missing"]


def test_the_write_test_sets_ten_watts_below_reads_back_and_restores(tmp_path: pathlib.Path) -> None:
    fake = f.FakeNvml(1)
    fake.gpus[0].limit_mw = 650_000
    seen: list[int] = []
    real_set = fake.nvmlDeviceSetPowerManagementLimit

    def recording_set(handle: f.c_nvmlDevice_t, limit: int) -> None:
        real_set(handle, limit)
        seen.append(limit)

    setattr(fake.module(), "nvmlDeviceSetPowerManagementLimit", recording_set)  # noqa: B010 - a module attribute
    check = helpers.one(
        helpers.run(fake, helpers.paths(tmp_path), write_test=True), "nvml.power_write", gpu=0
    )
    assert check.status is Status.OK
    assert seen == [640_000, 650_000]
    assert check.data["read_back_w"] == 640.0
    assert check.data["restored_w"] == 650.0
    assert fake.gpus[0].limit_mw == 650_000


def test_a_refused_power_write_fails_and_the_power_rung_would_fail(tmp_path: pathlib.Path) -> None:
    fake = f.FakeNvml(1)
    fake.gpus[0].errors["nvmlDeviceSetPowerManagementLimit"] = f.NVML_ERROR_NO_PERMISSION
    report = helpers.run(fake, helpers.paths(tmp_path), write_test=True)
    assert helpers.one(report, "nvml.power_write", gpu=0).status is Status.FAIL
    rung = [c for c in report.by_id("rungs") if c.data["rung"] == "power_limit"]
    assert [c.status for c in rung] == [Status.WARN]
    assert fake.gpus[0].limit_mw == 700_000


def test_without_write_test_the_limit_is_only_read(tmp_path: pathlib.Path) -> None:
    fake = f.FakeNvml(1)
    report = helpers.run(fake, helpers.paths(tmp_path))
    assert helpers.one(report, "nvml.power", gpu=0).data["current_w"] == 700.0
    assert fake.calls["nvmlDeviceSetPowerManagementLimit"] == 0
    assert not report.by_id("nvml.power_write")


def test_persistence_off_and_busy_gpus_are_reported_for_the_reset(tmp_path: pathlib.Path) -> None:
    fake = f.FakeNvml(2)
    fake.gpus[0].persistence_mode = f.NVML_FEATURE_DISABLED
    fake.gpus[1].processes = [4711]
    report = helpers.run(fake, helpers.paths(tmp_path))
    first, second = helpers.one(report, "nvml.reset", gpu=0), helpers.one(report, "nvml.reset", gpu=1)
    assert first.data["persistence_mode"] is False
    assert first.status is Status.WARN
    assert second.data["processes"] == [4711]
    assert second.data["persistence_mode"] is True


def test_the_json_report_is_versioned_and_carries_every_check(tmp_path: pathlib.Path) -> None:
    report = helpers.run(f.FakeNvml(1), helpers.paths(tmp_path))
    data = json.loads(json.dumps(report.to_json()))
    assert data["schema"] == "healer.doctor.v1"
    assert data["exit_code"] == report.exit_code
    assert data["node"] == "gpu-017"
    assert len(data["checks"]) == len(report.checks)
    assert {tuple(sorted(c)) for c in data["checks"]} == {("data", "fix", "gpu", "id", "status", "summary")}
    assert {c["status"] for c in data["checks"]} <= {"ok", "info", "warn", "fail"}
    schema = json.loads((ROOT / "docs" / "schemas" / "doctor-report.v1.json").read_text())
    jsonschema.validate(data, schema)
    again = doctor_report.DoctorReport.model_validate(data, context={"wire": True})
    assert again.model_dump(mode="json") == data


def test_exit_codes_follow_the_worst_check() -> None:
    def rep(*statuses: doctor.Status) -> doctor.Report:
        return doctor.report("n", [[doctor.Check("x", s, "s") for s in statuses]])

    assert rep(Status.OK, Status.INFO).exit_code == 0
    assert rep(Status.OK, Status.WARN, Status.INFO).exit_code == 2
    assert rep(Status.WARN, Status.FAIL).exit_code == 1


def test_every_read_key_maps_to_sample_fields() -> None:
    """A composite read of the NVML source names only real GpuSample fields."""
    every = doctor_gpu.nvml_fields()
    for key in ("memory", "utilization", "remapped_rows", "field_values", "nvlink_state[3]", "fabric"):
        assert set(doctor_gpu.fields_of(key)) <= every, key
    assert set(doctor_gpu.fields_of("handle")) == every


def test_a_limit_that_cannot_be_restored_fails_and_says_how_to_restore_it(tmp_path: pathlib.Path) -> None:
    fake = f.FakeNvml(1)
    real_set = fake.nvmlDeviceSetPowerManagementLimit
    calls: list[int] = []

    def set_once(handle: f.c_nvmlDevice_t, limit: int) -> None:
        calls.append(limit)
        if len(calls) > 1:
            raise f.NVMLError(f.NVML_ERROR_UNKNOWN)
        real_set(handle, limit)

    setattr(fake.module(), "nvmlDeviceSetPowerManagementLimit", set_once)  # noqa: B010 - a module attribute
    check = helpers.one(
        helpers.run(fake, helpers.paths(tmp_path), write_test=True), "nvml.power_write", gpu=0
    )
    assert check.status is Status.FAIL
    assert "could not restore 700 W" in check.summary
    assert check.fix == "restore it by hand: nvidia-smi -i 0 -pl 700"
    assert calls == [690_000, 700_000]
