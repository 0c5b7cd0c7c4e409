"""``healer model train|eval|info`` end to end on small simulated fleets."""

from __future__ import annotations

import json
import pathlib

import pytest

from healer import cli
from healer.anomaly import persist


def test_train_from_file_then_info_prints_the_card(
    healthy_recording: pathlib.Path, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "m"
    rc = cli.main(
        [
            "model",
            "train",
            "--from",
            str(healthy_recording),
            "--out",
            str(out),
            "--trees",
            "20",
            "--max-rows",
            "3000",
        ]
    )
    assert rc == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["out"] == str(out)
    assert cli.main(["model", "info", str(out), "--check"]) == 0
    assert json.loads(capsys.readouterr().out)["features"] == persist.read_card(out)["features"]


def test_info_check_fails_on_a_model_that_does_not_fit(
    trained: pathlib.Path, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    card = persist.read_card(trained)
    card["format"] = "something-else/9"
    (tmp_path / "m").mkdir()
    persist.write_card(tmp_path / "m", card)
    assert cli.main(["model", "info", str(tmp_path / "m"), "--check"]) == 1
    assert "format" in capsys.readouterr().err


def test_eval_reports_recall_lead_and_false_incidents_per_kind(
    trained: pathlib.Path, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    model = shutil.copytree(trained, tmp_path / "m")
    rc = cli.main(
        [
            "model",
            "eval",
            "--model",
            str(model),
            "--scenarios",
            "healthy,pcie-storm",
            "--nodes",
            "5",
            "--hours",
            "0.75",
            "--hold",
            "300",  # the small test model is noisier than the default one
            "--json",
            "--write-card",
            "--plots",
            str(tmp_path / "plots"),
        ]
    )
    assert rc == 0
    result = json.loads(capsys.readouterr().out)
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
        "healthy_margin.png",
        "lead_time.png",
        "score_traces.png",
    ]
    (traced,) = [r["traces"] for r in result["raw"] if r["traces"]]
    assert len(traced) == 4
    assert {t["kind"] for t in traced} == {"pcie_replay_storm"}
    assert len(traced[0]["ts"]) == len(traced[0]["score"]) > 10
    pcie = result["per_kind"]["pcie_replay_storm"]
    assert pcie["faults"] == 4
    assert pcie["model_recall"] == 1.0
    assert pcie["rule_recall"] == 1.0
    assert pcie["rule"] == "pcie-replay-rate"
    assert result["healthy_node_days"] > 0.1
    assert result["model_false_per_1000_node_days"] is not None
    assert persist.read_card(model)["evaluation"]["per_kind"]["pcie_replay_storm"]["faults"] == 4


def test_cli_default_scenarios_are_the_evaluation_set() -> None:
    from healer.cli import model_cmd
    from healer.evals import model_eval as evaluation

    assert model_cmd.DEFAULT_SCENARIOS.split(",") == list(evaluation.EVAL_SCENARIOS)


def test_eval_holds_a_score_as_long_as_the_rule_pack_does(tmp_path: pathlib.Path) -> None:
    from healer.cli import model_cmd

    repo = pathlib.Path(__file__).resolve().parents[2]
    assert model_cmd.anomaly_hold_s([str(repo / "rules")]) == 120.0  # rules/anomaly.yaml: for 2m
    (tmp_path / "a.yaml").write_text(
        "rules:\n  - id: anomaly-score-high\n    description: d\n    scope: gpu\n"
        "    when: anomaly_score >= 0.9\n    for: 2m\n    severity: warning\n    actions: [notify]\n"
    )
    assert model_cmd.anomaly_hold_s([str(tmp_path)]) == 120.0
    (tmp_path / "a.yaml").unlink()
    assert model_cmd.anomaly_hold_s([str(tmp_path)]) == model_cmd.DEFAULT_HOLD_S


def test_eval_counts_episodes_as_the_rule_pack_resolves_and_cools_them_down() -> None:
    import numpy as np

    from healer.anomaly import dataset
    from healer.cli import model_cmd
    from healer.evals import model_eval as evaluation

    repo = pathlib.Path(__file__).resolve().parents[2]
    ep = model_cmd.anomaly_episodes([str(repo / "rules")], None)
    assert (ep.hold_s, ep.resolve_below, ep.resolve_s, ep.cooldown_s) == (120.0, 0.6, 900.0, 3600.0)
    # 20 minutes high, 5 dipping to 0.7, 20 high, 20 quiet, 20 high (inside the cooldown), 80 quiet,
    # 20 high: two episodes
    pattern = [0.95] * 40 + [0.7] * 10 + [0.95] * 40 + [0.3] * 40 + [0.95] * 40 + [0.3] * 160 + [0.95] * 40
    scores = np.array(pattern)[:, None, None]
    ts = 30.0 * np.arange(len(pattern), dtype=np.float64)
    w = dataset.Windows(ts, np.zeros((len(ts), 1, 1, 1)), np.ones(scores.shape, bool), ["n"], [["m"]], "t")
    incidents, flags = evaluation.incidents_from_scores(scores, w, ep.hold_s, ep)
    assert [t for _, _, t, _ in incidents] == [120.0, 30 * 330 + 120.0]  # the last run, after its hold
    assert len(flags) == 4  # each run at >= 0.9 still flags
    plain, _ = evaluation.incidents_from_scores(scores, w, 300.0)  # no resolve or cooldown: every run
    assert len(plain) == 4


def test_the_text_summary_says_what_drove_false_incidents_and_how_close_healthy_gpus_came() -> None:

    result = {
        "per_kind": {},
        "healthy_node_days": 100.0,
        "model_false_incidents": 2,
        "model_false_per_1000_node_days": 20.0,
        "rule_false_incidents": 0,
        "rule_false_per_1000_node_days": 0.0,
        "model_false_by_component": {"thermal_gpu": 2},
        "healthy_max_held": {"thermal_gpu": 0.71, "forest": 0.67},
    }
    from healer.cli import model_summary

    text = model_summary.format_summary(result)
    assert "false incidents by component: thermal_gpu 2" in text
    assert "0.71 of the level" in text
    assert "(thermal_gpu; forest 0.67, thermal_gpu 0.71)" in text


def test_calibrate_writes_a_state_that_a_scorer_imports_with_its_gpus_ready(
    trained: pathlib.Path,
    healthy_recording: pathlib.Path,
    tmp_path: pathlib.Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from healer.anomaly import scoring

    out = tmp_path / "state.json"
    args = [
        "model",
        "calibrate",
        "--model",
        str(trained),
        "--from",
        str(healthy_recording),
        "--out",
        str(out),
    ]
    assert cli.main(args) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["nodes"] == 8
    assert 0 < summary["gpus_ready"] <= summary["gpus"] == 64
    scorer = scoring.load(trained)
    assert scorer.import_state(json.loads(out.read_text())) == 8
    scorer.thermal.ensure([f"sim-{i:05d}" for i in range(8)])
    assert int(scorer.thermal.ready.sum()) == summary["gpus_ready"]
    # continuing from a state carries it on; a state for another model layout is refused with exit 1
    assert cli.main([*args[:-2], "--state", str(out), "--out", str(tmp_path / "s2.json")]) == 0
    capsys.readouterr()
    (tmp_path / "bad.json").write_text(json.dumps({"format": "healer-anomaly-state/1", "gpus": 4}))
    assert cli.main([*args[:-2], "--state", str(tmp_path / "bad.json"), "--out", str(tmp_path / "s3")]) == 1
    assert "GPUs per node" in capsys.readouterr().err


def test_progress_off_a_terminal_is_one_line_at_the_end(capsys: pytest.CaptureFixture[str]) -> None:
    from healer.cli import model_cmd

    show = model_cmd._bar("frames")
    for done in range(1, 6):
        show(done, 5)
    assert capsys.readouterr().err == "frames: 5/5\n"
