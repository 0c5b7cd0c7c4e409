"""``healer act``: one action by hand, the outcome printed as JSON, the exit status from the outcome."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterator

import pytest
import structlog

from healer import cli


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """The command configures logging onto the captured stderr; later tests must not log into it."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


SINFO_IDLE = '{"nodes": [{"name": "gpu01", "state": "idle", "state_flags": [], "reason": ""}]}'


def test_log_action_prints_its_outcome(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["act", "log", "notify", "gpu01", "--incident", "inc-9"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "done"


def test_slurm_dry_run_prints_the_command_with_the_mapped_node_name(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    sinfo = tmp_path / "sinfo"
    sinfo.write_text(f"#!/bin/sh\necho '{SINFO_IDLE}'\n")
    sinfo.chmod(0o755)
    monkeypatch.setenv("HEALER_ACTUATORS_SLURM_BIN_DIR", str(tmp_path))
    monkeypatch.setenv("HEALER_ACTUATORS_NODE_NAME_TEMPLATE", "{short}")
    code = cli.main(["act", "slurm", "cordon", "gpu01.dc1.example", "--incident", "inc-9", "--dry-run"])
    outcome = json.loads(capsys.readouterr().out)
    assert code == 0
    assert outcome["status"] == "planned"
    assert outcome["plan"] == [
        f"{tmp_path}/scontrol update NodeName=gpu01 State=DRAIN 'Reason=healer: inc-9 set by hand'"
    ]


def test_a_failed_action_exits_1(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HEALER_ACTUATORS_SLURM_BIN_DIR", str(tmp_path))
    assert cli.main(["act", "slurm", "cordon", "gpu01"]) == 1
    assert json.loads(capsys.readouterr().out)["status"] == "failed-permanent"
