"""The ``healer sim`` / ``healer sim record`` / ``healer replay`` commands end to end."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import orjson
import pytest
import structlog

from healer import cli
from healer.bus import embedded
from healer.sim import recording


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """The commands configure structlog onto the captured stderr; put the old setup back after."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


def _last_json(out: str) -> dict[str, object]:
    doc: dict[str, object] = orjson.loads(out.strip().splitlines()[-1])
    return doc


def test_record_writes_a_recording_and_its_truth_file(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "fleet.npz"
    argv = ["sim", "record", "--scenario", "ecc", "--nodes", "6", "--sim-hours", "0.1", "--interval", "5"]
    assert cli.main([*argv, "--out", str(out)]) == 0
    summary = _last_json(capsys.readouterr().out)
    assert summary["steps"] == 72
    assert summary["faults"] == 5
    truth_lines = (tmp_path / "fleet.npz.truth.jsonl").read_bytes().splitlines()
    with recording.Recording(out) as rec:
        assert [orjson.loads(line) for line in truth_lines] == rec.truth()
        assert rec.meta["scenario"] == "ecc"


def test_bad_scenario_is_a_usage_error(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["sim", "record", "--scenario", "nope", "--out", str(tmp_path / "x.npz")]) == 2
    assert "no scenario 'nope'" in capsys.readouterr().err
    assert cli.main(["sim", "record", "--interval", "0", "--out", str(tmp_path / "x.npz")]) == 2
    assert "--interval must be more than 0" in capsys.readouterr().err


def test_scenarios_are_listed_and_shown(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["sim", "scenarios"]) == 0
    assert "realistic" in capsys.readouterr().out
    assert cli.main(["sim", "show", "realistic"]) == 0
    assert "Table 5" in capsys.readouterr().out


def test_live_sim_and_replay_run_against_a_real_server(
    nats_server: embedded.EmbeddedServer, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = tmp_path / "quick.yaml"
    scenario.write_text("name: quick\nfaults:\n  - {kind: fell_off_bus, at_s: 0.2}\n")
    truth = tmp_path / "truth.jsonl"
    argv = ["sim", "--nats", nats_server.url, "--provision", "--nodes", "3", "--gpus-per-node", "2"]
    argv += ["--scenario", str(scenario), "--interval", "0.2", "--duration", "1", "--truth", str(truth)]
    assert cli.main(argv) == 0
    stats = _last_json(capsys.readouterr().out)
    assert isinstance(stats["frames"], int)
    assert stats["frames"] >= 3
    assert stats["events"] == 3 + 2 + 3  # agent_start x3, XID 79 and gpu_lost, agent_stop x3
    assert orjson.loads(truth.read_text().splitlines()[0])["kind"] == "fell_off_bus"

    rec = tmp_path / "r.npz"
    assert cli.main(["sim", "record", "--nodes", "2", "--sim-hours", "0.01", "--out", str(rec)]) == 0
    capsys.readouterr()
    assert cli.main(["replay", str(rec), "--nats", nats_server.url, "--speed", "0"]) == 0
    replayed = _last_json(capsys.readouterr().out)
    assert replayed["frames"] == 2 * 36
    assert (replayed["events"], replayed["events_failed"]) == (2, 0)
