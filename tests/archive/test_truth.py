"""Checked against the truth (#42, item 5): a simulated fleet's five days of faults and recovery ladders
(healer/evals/archive_truth.py: 64 nodes x 8 GPUs, the realistic scenario's rates x 200, seed 1), its
incident feed published on a real nats-server, archived by ``healer archive``'s consumer and reported;
every figure the simulator knows matches the report.

Tolerances: the simulator's times are whole minutes, so durations must match to within 1 s and GPU-hours
to within 0.001 (float rounding only; an error of one GPU-minute, 0.017, would fail).
"""

from __future__ import annotations

import asyncio
import collections
import math
import pathlib
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml

from healer.archive import consumer, figures, page, store
from healer.bus import nats as natsbus
from healer.evals import archive_truth as at
from healer.rules import loader
from tests import conftest
from tests.archive import test_consumer
from tests.feed import helpers

ROOT = pathlib.Path(__file__).resolve().parents[2]
SETTINGS = at.Settings()
DURATION_TOL_S = 1.0
GPU_HOURS_TOL = 0.001


def simulated(settings: at.Settings = SETTINGS) -> at.Run:
    pack = loader.load_paths([ROOT / "rules"]).ruleset
    assert pack is not None
    scenario = yaml.safe_load((ROOT / "healer/sim/scenarios/realistic.yaml").read_text())
    rates = {e["kind"]: float(e["rate_per_gpu_hour"]) for e in scenario["random_faults"]}
    ladders = {lad.id: lad for lad in pack.ladders}
    return at.simulate(settings, rates, ladders, {r.id: r for r in pack.rules})


@pytest.fixture(scope="module")
def run() -> at.Run:
    return simulated()


def nearest_rank(values: list[float], p: float) -> float | None:
    ordered = sorted(values)
    return ordered[max(math.ceil(p / 100 * len(ordered)), 1) - 1] if ordered else None


async def archived_report(run: at.Run, bus: natsbus.NatsBus, db_path: pathlib.Path) -> dict[str, Any]:
    events = at.feed(run)
    for start in range(0, len(events), 64):  # 64 at a time: the stream keeps each subject's order
        await asyncio.gather(*(helpers.publish(bus, ev) for ev in events[start : start + 64]))
    db = store.Archive(db_path)
    archiver = consumer.Archiver(bus, helpers.SUBJ, db, test_consumer.FAST)
    stop = asyncio.Event()
    task = asyncio.create_task(archiver.run(stop))
    try:
        await conftest.until(lambda: archiver.counts.stored >= len(events), timeout=90)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    assert archiver.counts.stored == len(events)
    assert archiver.counts.malformed == 0
    s = run.settings
    opts = figures.Options(
        end=s.end, since_s=s.days * 86400.0, fleet_gpus=s.nodes * s.gpus, repeat_threshold=2
    )
    try:
        return figures.build(db, opts)
    finally:
        db.close()


def test_the_run_exercises_what_the_report_must_get_right(run: at.Run) -> None:
    """Otherwise the comparison below would pass on a run without the hard cases."""
    kinds = collections.Counter(f.kind for f in run.faults)
    assert set(kinds) == set(at.RULE_OF), kinds
    assert any(f.outcome == "hardware_replacement" for f in run.faults)
    assert any(f.back_at >= SETTINGS.end for f in run.faults), "some are still out at the end"
    every_interval_h = sum(
        (min(f.back_at, SETTINGS.end) - f.start) / 3600 * (SETTINGS.gpus if f.gpu is None else 1)
        for f in run.faults
    )
    assert every_interval_h > at.gpu_hours_out(run) + 1, "a node fault overlaps a GPU's time out"
    per_gpu = collections.Counter((f.node, f.gpu) for f in run.faults)
    assert max(per_gpu.values()) >= 2, "a repeat offender"


async def test_every_figure_the_simulator_knows_matches_the_report(
    run: at.Run, nats_bus: natsbus.NatsBus, tmp_path: pathlib.Path
) -> None:
    report = await archived_report(run, nats_bus, tmp_path / "archive.db")
    end = SETTINGS.end
    assert report["totals"]["incidents"] == len(run.faults)
    rows = {r["rule_id"]: r for r in report["by_rule"]}
    for kind, rule in at.RULE_OF.items():
        mine = [f for f in run.faults if f.kind == kind]
        row = rows[rule]
        assert row["kind"] == ("node" if kind in at.NODE_KINDS else "gpu")
        assert row["incidents"] == len(mine), kind
        assert row["open"] == sum(1 for f in mine if f.back_at >= end), kind
        assert row["escalated"] == sum(1 for f in mine if (f.replaced_from or math.inf) < end), kind
        assert set(row["ladder_outcomes"]) <= {"recovered", "hardware_replacement"}
        # the latest event of each incident carries its ending: recovered when resolved, a replacement
        # from its escalation on
        ended = collections.Counter(
            f.outcome for f in mine if f.outcome and min(f.back_at, f.replaced_from or math.inf) < end
        )
        assert row["ladder_outcomes"] == dict(ended), kind
        repairs = [f.back_at - f.start for f in mine if f.back_at < end]
        got = row["to_resolution"]
        assert got["count"] == len(repairs), kind
        for p in (50, 90):
            want = nearest_rank(repairs, p)
            assert (got[f"p{p}_s"] is None) == (want is None), kind
            if want is not None:
                assert abs(got[f"p{p}_s"] - want) <= DURATION_TOL_S, (kind, p)
        contained = [f.contained_at - f.start for f in mine if f.contained_at < end]
        assert row["to_containment"]["count"] == len(contained), kind
        assert row["to_containment"]["p90_s"] == pytest.approx(nearest_rank(contained, 90), abs=1)
    replaced = [f for f in run.faults if (f.replaced_from or math.inf) < end]
    assert rows[at.REPLACEMENT_RULE]["incidents"] == len(replaced)
    repairs = sorted(f.back_at - f.start for f in run.faults if f.back_at < end)
    assert sorted(report["repair_times_s"]) == pytest.approx(repairs, abs=DURATION_TOL_S)

    truth_h = at.gpu_hours_out(run)
    assert report["totals"]["gpu_hours_lost"] == pytest.approx(truth_h, abs=GPU_HOURS_TOL)
    by_rule: dict[str, float] = collections.defaultdict(float)
    for c in report["gpu_hours_lost"]["by_cause"]:
        by_rule[c["rule_id"]] += c["gpu_hours"]
    for kind, hours in at.gpu_hours_by_kind(run).items():
        assert by_rule.pop(at.RULE_OF[kind]) == pytest.approx(hours, abs=GPU_HOURS_TOL), kind
    assert by_rule.pop(at.REPLACEMENT_RULE, 0.0) == pytest.approx(0.0, abs=GPU_HOURS_TOL)
    assert by_rule == {}
    first_day = datetime.fromtimestamp(SETTINGS.start, tz=UTC).date().toordinal()
    for day, hours in at.gpu_hours_by_day(run).items():
        key = datetime.fromordinal(first_day + day).strftime("%Y-%m-%d")
        got_h = sum(report["gpu_hours_lost"]["by_day"].get(key, {}).values())
        assert got_h == pytest.approx(hours, abs=GPU_HOURS_TOL), key
    fleet_h = SETTINGS.nodes * SETTINGS.gpus * SETTINGS.days * 24
    assert report["fleet"]["availability"] == pytest.approx(1 - truth_h / fleet_h, abs=1e-9)

    per_gpu = collections.Counter((run.node_name(f.node), f.gpu) for f in run.faults)
    repeat = {k for k, n in per_gpu.items() if n >= 2}
    assert {(o["node"], o["gpu_index"]) for o in report["repeat_offenders"]} == repeat
    assert page.render(report).startswith("<!doctype html>")
