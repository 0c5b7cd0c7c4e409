"""``healer bench …`` and ``healer model eval`` run from the command line, with the bench harnesses in
healer/evals/ (imported by the CLI only when a bench command runs): each command runs end to end at toy
scale and prints its report. The figures themselves are their own tests' business (tests/controller/
test_bench.py, test_power_bench.py, test_straggler_eval.py, tests/anomaly/test_cli.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from healer import cli


def _report(capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    out = capsys.readouterr().out
    report = json.loads(out)
    assert isinstance(report, dict)
    return report


def test_importing_the_cli_leaves_the_evaluation_code_unloaded() -> None:
    code = (
        "import sys\nfrom healer import cli\n"
        "print(sorted(m for m in sys.modules if m == 'healer.evals' or m.startswith('healer.evals.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]"


def test_bench_stragglers_runs_on_the_simulator(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["bench", "stragglers", "--simulator", "--nodes", "4", "--hours", "0.5", "--seeds", "1", "--json"]
    assert cli.main(args) == 0
    report = _report(capsys)
    assert "simulator" in str(report["fleet"])
    assert report["summary"]["seeds"] == [1]  # type: ignore[index]


@pytest.mark.slow
def test_bench_power_runs_through_the_wired_controller(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["bench", "power", "--nodes", "1", "--steady", "60", "--speed", "40", "--json"]
    rc = cli.main(args)
    report = _report(capsys)
    # exit 1 says a target was missed (a toy rack on a loaded test machine may miss one); either way the
    # bench ran to its end and reported every target it measures
    assert rc in (0, 1)
    assert "under_after_hold_s" in report
    assert report["nodes"] == 1
    assert report["simulated_s"] > 0  # type: ignore[operator]


@pytest.mark.slow
@pytest.mark.nats
def test_bench_controller_runs_at_toy_scale(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["bench", "controller", "--nodes", "40", "--seconds", "1", "--latency-nodes", "20"]
    args += ["--faults", "2"]
    args += ["--rounds", "1", "--latency-shards", "2", "--xid-events", "3", "--json"]
    assert cli.main(args) == 0
    report = _report(capsys)
    assert report["nodes"] == 40
    assert report["controller_frames_per_s"] > 0  # type: ignore[operator]


def test_model_eval_runs_with_the_default_model(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["model", "eval", "--model", "models/default", "--scenarios", "healthy", "--nodes", "2"]
    assert cli.main([*args, "--hours", "0.25", "--json"]) == 0
    report = _report(capsys)
    assert report["healthy_node_days"] > 0  # type: ignore[operator]
