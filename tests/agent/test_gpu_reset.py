"""reset_gpu and validate on the agent: fenced, refused while work runs, time-limited, typed reports.

The NVML path runs through ``NvmlSource`` over the fake pynvml, whose ``gpu_reset`` does what
``nvidia-smi --gpu-reset`` does (and refuses a GPU that a process or an NVML session still holds).
"""

from __future__ import annotations

import os
import pathlib
import stat
import time
from collections.abc import Callable, Iterator

import pytest

from healer import errors
from healer.agent import execution, host, validation
from healer.schemas import commands, events
from healer.sim import node_source
from healer.telemetry import nvml
from tests.fakes import fake_pynvml


def cmd(action: str, *, token: int = 1, cid: str | None = None, **kw: object) -> commands.Command:
    now = time.time()
    return commands.Command.model_validate(
        {
            "id": cid or f"c-{action}-{token}-{kw}",
            "node": "n1",
            "action": action,
            "fencing_token": token,
            "issued_at": now - 1,
            "expires_at": now + 30,
            **kw,
        }
    )


@pytest.fixture
def fake() -> fake_pynvml.FakeNvml:
    return fake_pynvml.FakeNvml(gpus=2)


@pytest.fixture
def reset_calls() -> list[tuple[int, str, float]]:
    """The (index, uuid, timeout_s) of each reset command ``source`` ran."""
    return []


@pytest.fixture
def source(
    fake: fake_pynvml.FakeNvml, reset_calls: list[tuple[int, str, float]]
) -> Iterator[nvml.NvmlSource]:
    def reset(index: int, uuid: str, timeout_s: float) -> str:
        reset_calls.append((index, uuid, timeout_s))
        try:
            return fake.gpu_reset(index)
        except RuntimeError as e:
            raise errors.PermanentError(str(e)) from e

    src = nvml.NvmlSource("n1", nvml=fake.module(), reset_command=reset)
    src.open()
    yield src
    src.close()


HealthRead = Callable[[float | None], execution.Health]


def executor(
    src: nvml.NvmlSource | node_source.SimSource, health: HealthRead | None = None
) -> execution.CommandExecutor:
    return execution.CommandExecutor("n1", src, None, gpu_indices=lambda: [0, 1], gpu=src, health=health)


def test_a_reset_clears_volatile_dbe_and_applies_a_pending_remap(
    fake: fake_pynvml.FakeNvml, source: nvml.NvmlSource, reset_calls: list[tuple[int, str, float]]
) -> None:
    fake.gpus[1].ecc[(fake_pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, fake_pynvml.NVML_VOLATILE_ECC)] = 3
    fake.gpus[1].remapped_rows = (0, 1, 1, 0)
    res = executor(source).execute(cmd("reset_gpu", gpu_index=1, timeout_s=90))
    assert res.status == "applied"
    assert res.reset is not None
    assert res.reset.status == "applied"
    assert "successfully reset" in res.reset.detail
    assert reset_calls == [(1, fake.gpus[1].uuid, 90.0)]
    after = {g.index: g for g in source.sample().gpus}[1]  # NVML is open again, handles renewed
    assert after.ecc_dbe_volatile == 0
    assert after.row_remap_pending is False
    assert fake.gpus[1].resets == 1
    assert fake.init_count == 1


def test_a_reset_is_refused_while_compute_processes_run(
    fake: fake_pynvml.FakeNvml, source: nvml.NvmlSource
) -> None:
    fake.gpus[0].processes = [4242, 77]
    ex = executor(source)
    res = ex.execute(cmd("reset_gpu", gpu_index=0, cid="r1"))
    assert res.status == "refused"
    assert res.reset is not None
    assert res.reset.pids == [77, 4242]
    assert fake.gpus[0].resets == 0
    fake.gpus[0].processes = []
    again = ex.execute(cmd("reset_gpu", gpu_index=0, cid="r1"))  # not remembered: asked again, done
    assert again.status == "applied"
    assert fake.gpus[0].resets == 1


def test_a_reset_done_is_never_done_twice_for_the_same_command(
    fake: fake_pynvml.FakeNvml, source: nvml.NvmlSource
) -> None:
    ex = executor(source)
    first = ex.execute(cmd("reset_gpu", gpu_index=0, cid="once"))
    second = ex.execute(cmd("reset_gpu", gpu_index=0, cid="once"))
    assert first == second
    assert fake.gpus[0].resets == 1


def test_a_stale_or_unleased_token_never_resets(fake: fake_pynvml.FakeNvml, source: nvml.NvmlSource) -> None:
    ex = executor(source)
    ex.execute(cmd("validate", token=5, cid="v"))
    stale = ex.execute(cmd("reset_gpu", gpu_index=0, token=4))
    assert stale.status == "refused"
    assert "stale fencing token" in stale.detail
    forged = ex.execute(cmd("reset_gpu", gpu_index=0, token=99), execution.LiveTokens(frozenset({5})))
    assert forged.status == "refused"
    assert "no lease's" in forged.detail
    assert fake.gpus[0].resets == 0


def test_a_lost_gpu_cannot_be_reset(fake: fake_pynvml.FakeNvml, source: nvml.NvmlSource) -> None:
    fake.gpus[0].lost = True
    res = executor(source).execute(cmd("reset_gpu", gpu_index=0))
    assert res.status == "failed"
    assert res.reset is not None
    assert res.reset.detail == "temporary: GPU 0: listing compute processes failed: GPU is lost"


def test_a_reset_past_its_time_limit_fails_and_nvml_comes_back(fake: fake_pynvml.FakeNvml) -> None:
    def hang(index: int, uuid: str, timeout_s: float) -> str:
        raise errors.TemporaryError(f"nvidia-smi --gpu-reset ran past {timeout_s:g}s")

    src = nvml.NvmlSource("n1", nvml=fake.module(), reset_command=hang)
    src.open()
    try:
        res = executor(src).execute(cmd("reset_gpu", gpu_index=0, timeout_s=5))
        assert res.status == "failed"
        assert res.detail == "temporary: nvidia-smi --gpu-reset ran past 5s"
        assert len(src.sample().gpus) == 2
    finally:
        src.close()
    assert fake.init_count == 0


def test_reset_needs_one_gpu_and_no_watts() -> None:
    with pytest.raises(ValueError, match="reset_gpu needs gpu_index"):
        cmd("reset_gpu")
    with pytest.raises(ValueError, match="takes no watts"):
        cmd("reset_gpu", gpu_index=0, watts=300)


def test_a_source_without_reset_refuses() -> None:
    src = node_source.SimSource("n1", gpus=2)
    ex = execution.CommandExecutor("n1", src, None)
    assert ex.execute(cmd("reset_gpu", gpu_index=0)).status == "refused"


def test_the_simulated_node_resets_by_the_fleets_model_and_refuses_a_lost_gpu() -> None:
    src = node_source.SimSource("n1", gpus=2)
    fleet = src.simulation.fleet
    fleet.counters["ecc_dbe_volatile"][0, 1] = 4
    fleet.remap_pending[0, 1] = True
    ex = executor(src)
    src.processes[1] = [9]
    assert ex.execute(cmd("reset_gpu", gpu_index=1, cid="a")).status == "refused"
    src.processes[1] = []
    assert ex.execute(cmd("reset_gpu", gpu_index=1, cid="a")).status == "applied"
    assert fleet.counters["ecc_dbe_volatile"][0, 1] == 0
    assert not fleet.remap_pending[0, 1]
    fleet.present[0, 0] = False
    lost = ex.execute(cmd("reset_gpu", gpu_index=0))
    assert lost.status == "failed"
    assert "fallen off the bus" in lost.detail


# -- validate --------------------------------------------------------------------------------------------
def _health(source: nvml.NvmlSource, evs: list[events.NodeEvent] | None = None) -> HealthRead:
    def read(since: float | None) -> execution.Health:
        return execution.Health(source.sample().gpus, 2, list(evs or []))

    return read


def test_a_healthy_node_validates(source: nvml.NvmlSource) -> None:
    ex = executor(source, _health(source))
    res = ex.execute(cmd("validate", soak_since=time.time() - 600))
    assert res.status == "applied"
    assert res.validation is not None
    assert res.validation.passed
    assert res.detail == "passed"
    names = {c.name for c in res.validation.checks}
    assert names == {"gpus_present", "row_remap_pending", "row_remap_failure", "ecc_dbe_volatile_zero",
                     "readings_sane", "quiet_soak"}  # fmt: skip


def test_validation_reports_each_gpus_identity_for_a_replacement(
    fake: fake_pynvml.FakeNvml, source: nvml.NvmlSource
) -> None:
    fake.gpus[1].unsupported.add("nvmlDeviceGetBoardPartNumber")
    res = executor(source, _health(source)).execute(cmd("validate"))
    assert res.validation is not None
    devices = [d.model_dump() for d in res.validation.devices]
    same = {"vbios_version": "96.00.99.00.01", "driver_version": "570.133.20"}
    part = "692-2G520-0200-000"
    assert devices == [
        {"index": 0, "uuid": fake.gpus[0].uuid, "serial": "1652300000000", "board_part_number": part, **same},
        {"index": 1, "uuid": fake.gpus[1].uuid, "serial": "1652300000001", "board_part_number": None, **same},
    ]


def test_validation_fails_on_each_thing_it_checks(
    fake: fake_pynvml.FakeNvml, source: nvml.NvmlSource
) -> None:
    fake.gpus[0].ecc[(fake_pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, fake_pynvml.NVML_VOLATILE_ECC)] = 1
    fake.gpus[1].remapped_rows = (0, 0, 1, 1)
    xid = events.new("n1", "xid", gpu_index=1, xid=79, message="fell off the bus")
    res = executor(source, _health(source, [xid])).execute(cmd("validate", soak_since=1.0))
    assert res.validation is not None
    assert not res.validation.passed
    failed = {(c.name, c.gpu_index) for c in res.validation.checks if not c.ok}
    assert failed == {
        ("ecc_dbe_volatile_zero", 0),
        ("row_remap_pending", 1),
        ("row_remap_failure", 1),
        ("quiet_soak", None),
    }
    assert (
        res.detail.startswith("failed: row_remap_pending gpu1") or "ecc_dbe_volatile_zero gpu0" in res.detail
    )


def test_a_missing_gpu_fails_validation(fake: fake_pynvml.FakeNvml, source: nvml.NvmlSource) -> None:
    fake.gpus[1].lost = True
    res = executor(source, _health(source)).execute(cmd("validate"))
    assert res.validation is not None
    bad = [c for c in res.validation.checks if not c.ok]
    assert [(c.name, c.detail) for c in bad] == [("gpus_present", "missing GPU 1 of 2")]


# -- dcgmi diag: a fake dcgmi on PATH writes DCGM's real JSON report -----------------------------------------
DCGM3_PASS = """Successfully ran diagnostic for group.
{
  "DCGM GPU Diagnostic" : {
    "test_categories" : [
      {"category" : "Deployment", "tests" : [
        {"name" : "Denylist", "results" : [{"gpu_ids" : "0,1", "status" : "Pass"}]},
        {"name" : "NVML Library", "results" : [{"gpu_ids" : "0,1", "status" : "Pass"}]},
        {"name" : "Persistence Mode", "results" : [{"gpu_ids" : "0,1", "status" : "Warn",
          "warnings" : ["Persistence mode for GPU 0 is disabled."]}]}
      ]},
      {"category" : "Integration", "tests" : [
        {"name" : "PCIe", "results" : [{"gpu_id" : "0", "status" : "Skip"},
                                       {"gpu_id" : "1", "status" : "Skip"}]}
      ]}
    ],
    "version" : "3.3.9"
  }
}
"""
DCGM4_FAIL = """{
  "version" : "4.2.3",
  "driver_version" : "580.82.09",
  "tests" : [
    {"name" : "software", "results" : [{"entity_group" : "GPU", "entity_id" : 0, "status" : "pass"}]},
    {"name" : "memory", "results" : [
      {"entity_group" : "GPU", "entity_id" : 0, "status" : "pass"},
      {"entity_group" : "GPU", "entity_id" : 1, "status" : "fail",
       "warnings" : [{"warning" : "A memory mismatch was detected on GPU 1", "error_id" : 83}]}
    ]}
  ]
}
"""


def _fake_dcgmi(tmp_path: pathlib.Path, report: str, code: int) -> pathlib.Path:
    (tmp_path / "report.json").write_text(report)
    exe = tmp_path / "dcgmi"
    exe.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/argv\ncat {tmp_path}/report.json\nexit {code}\n')
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def test_dcgm_diag_passing_with_warnings_passes(
    source: nvml.NvmlSource, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_dcgmi(tmp_path, DCGM3_PASS, 0)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    res = executor(source, _health(source)).execute(cmd("validate", dcgm_level=1))
    assert res.validation is not None
    assert res.validation.passed
    assert res.validation.dcgm_ran
    diag = next(c for c in res.validation.checks if c.name == "dcgm_diag")
    assert diag.detail == "warn: Persistence Mode (gpu 0,1): Persistence mode for GPU 0 is disabled."
    assert (tmp_path / "argv").read_text() == "diag -r 1 -j\n"


def test_dcgm_diag_failing_fails_validation(
    source: nvml.NvmlSource, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_dcgmi(tmp_path, DCGM4_FAIL, 226)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    res = executor(source, _health(source)).execute(cmd("validate", dcgm_level=2))
    assert res.validation is not None
    assert not res.validation.passed
    diag = next(c for c in res.validation.checks if c.name == "dcgm_diag")
    assert diag.detail == "memory (gpu 1): A memory mismatch was detected on GPU 1"
    assert (tmp_path / "argv").read_text() == "diag -r 2 -j\n"


def test_without_dcgmi_the_diag_is_skipped_and_said_so(
    source: nvml.NvmlSource, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    res = executor(source, _health(source)).execute(cmd("validate", dcgm_level=1))
    assert res.validation is not None
    assert res.validation.passed
    assert not res.validation.dcgm_ran
    assert [c.detail for c in res.validation.checks if c.name == "dcgm_diag"] == [
        "dcgmi is not installed; skipped"
    ]


def test_dcgmi_output_that_is_no_report_fails() -> None:
    assert validation.parse_dcgmi("Error: unable to connect to host engine\n").error == (
        "dcgmi printed no JSON report"
    )
    assert not validation.parse_dcgmi('{"tests": []}').passed


# -- reboot_node -------------------------------------------------------------------------------------------
def test_an_agent_without_a_reboot_command_refuses_to_reboot(source: nvml.NvmlSource) -> None:
    res = executor(source).execute(cmd("reboot_node"))
    assert res.status == "refused"
    assert "agent.reboot_command is unset" in res.detail


def test_a_reboot_is_refused_while_work_runs_and_answered_from_disk_after_it(
    fake: fake_pynvml.FakeNvml, source: nvml.NvmlSource, tmp_path: pathlib.Path
) -> None:
    state = tmp_path / "power.json"
    seen_on_disk: list[bool] = []

    def reboot() -> str:
        seen_on_disk.append("boot-1" in state.read_text())  # the answer is saved before the host goes down
        return "queued"

    def make() -> execution.CommandExecutor:
        return execution.CommandExecutor(
            "n1", source, state, gpu_indices=lambda: [0, 1], gpu=source, reboot=reboot
        )

    fake.gpus[1].processes = [5]
    busy = make().execute(cmd("reboot_node", cid="boot-1"))
    assert busy.status == "refused"
    assert busy.detail == "compute processes still run: GPU 1: pids 5"
    fake.gpus[1].processes = []
    done = make().execute(cmd("reboot_node", cid="boot-1"))
    assert done.status == "applied"
    assert seen_on_disk == [True]
    after_boot = make().execute(cmd("reboot_node", cid="boot-1"))  # a new agent process, the same id
    assert after_boot == done
    assert seen_on_disk == [True]


def test_a_reboot_command_that_fails_is_reported_and_forgotten(source: nvml.NvmlSource) -> None:
    ex = execution.CommandExecutor("n1", source, None, gpu=source, reboot=host.rebooter(["false"]))
    res = ex.execute(cmd("reboot_node", cid="b"))
    assert res.status == "failed"
    assert res.detail == "permanent: false exit 1: "
    assert "b" not in ex.recent


def test_reboot_node_takes_no_gpu() -> None:
    with pytest.raises(ValueError, match="no gpu_index"):
        cmd("reboot_node", gpu_index=0)
