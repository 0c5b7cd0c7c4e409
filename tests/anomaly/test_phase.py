"""The same frames give the same anomaly incidents whatever the phase of the scoring timer (#39)."""

from __future__ import annotations

import pathlib

import numpy as np

from healer.anomaly import cfar, persist, scoring
from healer.evals import backtest
from healer.schemas import codec

MODEL = pathlib.Path(__file__).resolve().parents[2] / "models" / "default"


def incidents(lines: list[bytes], offset_s: float) -> list[tuple[str, int | None, float, str]]:
    m = persist.load(MODEL)[0]
    bt = backtest.Backtest(None, {"m": m}, score_offset_s=offset_s).run(lines)
    return [(h.node, h.gpu, h.at, h.component) for h in bt.model_hits["m"]]


def test_one_recording_scored_at_several_offsets_opens_the_same_incidents(
    overheat_lines: list[bytes],
) -> None:
    first = incidents(overheat_lines, 0.0)
    assert len(first) >= 8  # the inlet failure's node at least: the comparison is not of empty lists
    for offset in (7.0, 13.5, 29.0):
        assert incidents(overheat_lines, offset) == first, offset


def test_a_second_call_in_one_bucket_learns_nothing_and_a_late_call_catches_up(
    overheat_lines: list[bytes],
) -> None:
    m = persist.load(MODEL)[0]
    steady, late = scoring.Scorer(m, {}), scoring.Scorer(m, {})
    scored: list[float] = []
    for data in overheat_lines[: 8 * 12 * 20]:  # 20 minutes of 8 nodes at 5 s
        frame = codec.decode_frame_view(data)
        for s in (steady, late):
            s.observe(frame)
        grid = steady.grid_at(frame.ts)
        if not scored or grid > scored[-1]:
            steady.score_array(grid + 1.0)
            again, _ = steady.score_array(grid + 29.0)  # the same bucket: the same scores
            np.testing.assert_array_equal(again, steady.last_scores)
            if len(scored) % 2 == 0:  # the late scorer misses every other instant (the ring keeps one)
                late.score_array(grid + 2.0)
            scored.append(grid)
    late.score_array(scored[-1] + 3.0)
    assert late.scored_at == steady.scored_at == scored[-1]
    np.testing.assert_allclose(late.last_scores, steady.last_scores, rtol=1e-9, atol=1e-12)
    # what they learned: the same (to rounding: one flush per call, summed in another order)
    for a, b in ((late.thermal.stats, steady.thermal.stats), (late.thermal.level, steady.thermal.level)):
        np.testing.assert_allclose(a, b, rtol=1e-9)


def test_a_pool_not_calibrated_yet_opens_nothing_and_counts_what_it_would_have(
    overheat_lines: list[bytes],
) -> None:
    m = persist.load(MODEL)[0]
    live = backtest.Backtest(None, {"m": m}).run(overheat_lines)
    assert live.model_hits["m"]  # uncalibrated, the model opens incidents on this recording
    shadow = backtest.Backtest(None, {"m": m}, calibration=cfar.CfarSettings(min_node_days=2.0))
    shadow.run(overheat_lines)
    scorer = shadow.scorers["m"]
    assert shadow.model_hits["m"] == []
    assert float(scorer.last_scores.max()) <= cfar.SHADOW_CAP
    assert sum(scorer.shadow_counts.values()) >= 1
    assert scorer.cfar is not None
    assert [p["state"] for p in scorer.cfar.status()] == ["shadow"]
    # what it learned travels with the thermal baselines
    state = scorer.export_state()
    other = backtest.Backtest(None, {"m": m}, calibration=cfar.CfarSettings()).scorers["m"]
    other.import_state(state)
    assert other.cfar is not None
    assert other.cfar.pools == scorer.cfar.pools
