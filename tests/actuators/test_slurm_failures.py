"""How the Slurm actuator meets a broken Slurm: stand-in ``scontrol``/``sinfo`` scripts print the real
error texts (see shared notes) so every failure path runs without a cluster."""

from __future__ import annotations

import os
import pathlib
import signal

import pytest
import structlog

from healer import config
from healer.actuators import base, slurm

SINFO_IDLE = '{"nodes": [{"name": "gpu01", "state": "idle", "state_flags": [], "reason": ""}]}'


def tool(bin_dir: pathlib.Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def actuator(bin_dir: pathlib.Path, **kw: object) -> slurm.SlurmActuator:
    settings = config.ActuatorSettings.model_validate(
        {"slurm_bin_dir": str(bin_dir), "retry_attempts": 2, "retry_initial_delay_s": 0, **kw}
    )
    return slurm.SlurmActuator(settings)


def req(kind: base.RequestKind = "cordon") -> base.ActionRequest:
    return base.ActionRequest(incident_id="inc-1", kind=kind, node="gpu01")


async def test_an_unreachable_controller_is_temporary_and_retried(tmp_path: pathlib.Path) -> None:
    tool(
        tmp_path,
        "sinfo",
        f"echo called >> {tmp_path}/calls\n"
        'echo "slurm_load_node error: Unable to contact slurm controller (connect failure)" >&2; exit 1',
    )
    with structlog.testing.capture_logs() as logs:
        outcome = await actuator(tmp_path).apply(req())
    assert outcome.status == "failed-temporary"
    assert "Unable to contact slurm controller" in outcome.detail
    assert len((tmp_path / "calls").read_text().splitlines()) == 2
    assert [e["attempt"] for e in logs if e["event"] == "actuator.retry"] == [1]


async def test_a_command_that_hangs_is_killed_and_temporary(tmp_path: pathlib.Path) -> None:
    tool(tmp_path, "sinfo", "exec sleep 30")
    outcome = await actuator(tmp_path, call_timeout_s=0.2, retry_attempts=1).apply(req())
    assert outcome.status == "failed-temporary"
    assert "timed out" in outcome.detail


async def test_a_hung_command_whose_child_holds_its_output_is_still_killed_in_time(
    tmp_path: pathlib.Path,
) -> None:
    # the command's own child keeps the output pipe open: the command is killed and reaped, its pipes
    # are not read to their end (that would wait the child's 30 s)
    tool(tmp_path, "sinfo", f"sleep 30 &\necho $! > {tmp_path}/child\nexec sleep 30")
    try:
        outcome = await actuator(tmp_path, call_timeout_s=0.5, retry_attempts=1).apply(req())
        assert outcome.status == "failed-temporary"
        assert "timed out" in outcome.detail
        child = int((tmp_path / "child").read_text())
        os.kill(child, 0)  # still there: the outcome did not wait for it to let go of the pipe
    finally:
        os.kill(int((tmp_path / "child").read_text()), signal.SIGTERM)


async def test_missing_slurm_commands_are_a_permanent_failure(tmp_path: pathlib.Path) -> None:
    outcome = await actuator(tmp_path).apply(req())
    assert outcome.status == "failed-permanent"
    assert "not found" in outcome.detail


async def test_garbage_from_sinfo_is_not_taken_for_state(tmp_path: pathlib.Path) -> None:
    tool(tmp_path, "sinfo", "echo 'not json'")
    outcome = await actuator(tmp_path, retry_attempts=1).apply(req())
    assert outcome.status == "failed-temporary"
    assert "not JSON" in outcome.detail


async def test_missing_reason_text_is_permanent(tmp_path: pathlib.Path) -> None:
    tool(tmp_path, "sinfo", f"echo '{SINFO_IDLE}'")
    tool(
        tmp_path,
        "scontrol",
        'echo "You must specify a reason when DOWNING or DRAINING a node. Request denied" >&2; exit 1',
    )
    outcome = await actuator(tmp_path).apply(req())
    assert outcome.status == "failed-permanent"
    assert outcome.detail.startswith("You must specify a reason")


async def test_a_job_already_pending_counts_as_requeued(tmp_path: pathlib.Path) -> None:
    tool(tmp_path, "scontrol", 'echo "Job is pending execution for job 7" >&2; exit 1')
    item = await actuator(tmp_path).requeue("7")
    assert item == base.ItemResult(item="job 7", status="already-done", detail="already pending")


async def test_power_actions_are_not_the_slurm_actuators(tmp_path: pathlib.Path) -> None:
    outcome = await actuator(tmp_path).apply(req("power_limit"))
    assert outcome.status == "failed-permanent"


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("slurm_update error: Invalid node name specified", "PermanentError"),
        ("Invalid job id specified for job 9", "PermanentError"),
        ("Requested operation is presently disabled for job 2", "PermanentError"),
        ("Only batch jobs are accepted or processed for job 3", "PermanentError"),
        ("Socket timed out on send/recv operation", "TemporaryError"),
        ("Job can not be altered now, try again later", "TemporaryError"),
    ],
)
def test_slurm_error_texts_are_classified(text: str, kind: str) -> None:
    assert slurm.classify(text).__name__ == kind
