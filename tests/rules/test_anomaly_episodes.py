"""The default pack's anomaly rule turns a flapping score into one incident per episode: hysteresis
between firing (0.9 for 5 minutes) and resolving (below 0.6 for 15 minutes), then an hour's cooldown."""

from __future__ import annotations

import itertools
import pathlib

import numpy as np

from healer.rules import engine, loader
from tests.rules.rules_helpers import T0, frame

PACK = pathlib.Path(__file__).parents[2] / "rules" / "anomaly.yaml"


def _fired(scores: list[float], step_s: float = 30.0) -> list[float]:
    result = loader.load_paths([PACK])
    assert result.ruleset is not None
    eng = engine.Engine(result.ruleset, gpus_per_node=8, stale_after_s=300.0)
    fired = []
    for k, s in enumerate(scores):
        t = k * step_s
        eng.ingest(frame("n", t, gpus=8))
        eng.set_anomaly_scores("n", {0: s})
        fired += [t for f in eng.evaluate(T0 + t) if f.status == "fired" and f.gpu == 0]
    return fired


def test_a_score_flapping_around_the_threshold_for_hours_opens_one_incident() -> None:
    rng = np.random.default_rng(5)
    # three hours of a fault whose score wanders between 0.75 and 1.0, crossing 0.9 every few minutes
    flapping = list(np.clip(0.88 + 0.08 * np.sin(np.arange(360) / 4.0) + rng.normal(0, 0.03, 360), 0, 1))
    assert sum(a < 0.9 <= b for a, b in itertools.pairwise(flapping)) > 20
    assert len(_fired(flapping)) == 1


def test_a_second_episode_after_the_cooldown_is_a_second_incident() -> None:
    episode = [0.95] * 20 + [0.2] * 40  # 10 minutes high, 20 minutes quiet: resolved
    fired = _fired(episode + [0.95] * 40 + [0.2] * 40 + [0.95] * 60)
    assert len(fired) == 2  # the return at 30 min is inside the cooldown; the one at 1h20 is not
    assert fired[1] - fired[0] >= 3600
