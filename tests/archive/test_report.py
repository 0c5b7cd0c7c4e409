"""``healer report`` on a hand-built archive whose every figure is known (worked out in the comments)."""

from __future__ import annotations

import pathlib
from datetime import UTC, datetime

import orjson
import pytest

from healer import cli
from healer.archive import figures, page, store
from healer.schemas import codec, incidents, verdicts

H = 3600.0
END = datetime(2026, 12, 7, tzinfo=UTC).timestamp()  # the window: 2026-11-30 00:00 to 2026-12-07 00:00
DAY = 86400.0
SEQ = iter(range(1, 1000))
Evidence = dict[str, float | int | str | bool | None]


def incident(
    db: store.Archive, iid: str, rule: str, node: str, gpu: int | None, severity: incidents.Severity,
    opened: float, *, contained: float | None = None, contain_kind: str = "cordon",
    resolved: float | None = None, escalated: float | None = None, evidence: Evidence | None = None,
) -> None:  # fmt: skip
    """Its events: opened, then an action (containment), escalated, resolved, as the controller sends them."""
    acts: list[incidents.ActionRecord] = []
    steps: list[tuple[incidents.Change, float, incidents.IncidentState]] = [
        (incidents.Change.OPENED, opened, incidents.IncidentState.OPEN)
    ]
    if contained is not None:
        acts = [incidents.ActionRecord(kind=contain_kind, status="done", at=contained)]
        steps.append((incidents.Change.ACTION, contained, incidents.IncidentState.OPEN))
    if escalated is not None:
        steps.append((incidents.Change.ESCALATED, escalated, incidents.IncidentState.ESCALATED))
    if resolved is not None:
        steps.append((incidents.Change.RESOLVED, resolved, incidents.IncidentState.RESOLVED))
    for k, (change, ts, state) in enumerate(steps):
        data = incidents.IncidentData(
            incident_id=iid, rule_id=rule, severity=severity, node=node, gpu_index=gpu, state=state,
            summary=iid, evidence=evidence or {}, actions=acts if change != "opened" else [], mode="enforce",
        )  # fmt: skip
        ev = incidents.build(event_id=f"{iid}.{k}", cluster="c", change=change, data=data, ts=ts)
        assert db.add_incident(ev, codec.encode(ev), next(SEQ))


def verdict(db: store.Archive, iid: str, v: verdicts.Verdict, ts: float) -> None:
    ev = verdicts.build(
        cluster="c",
        data=verdicts.VerdictData(incident_id=iid, verdict=v, by="ana"),
        ts=ts,
        event_id=f"v-{ts}",
    )
    assert db.add_verdict(ev, codec.encode(ev), next(SEQ))


@pytest.fixture
def archive(tmp_path: pathlib.Path) -> pathlib.Path:
    return build_archive(tmp_path / "archive.db")


def build_archive(path: pathlib.Path) -> pathlib.Path:
    """The hand-built archive: every figure of its report is worked out in the comments."""
    with store.Archive(path) as db:
        d4, d5, d6 = END - 3 * DAY, END - 2 * DAY, END - DAY  # Dec 4, 5, 6 at midnight
        # n1/gpu0, ecc: contained after 10, 20, 30 min; repaired in 2 h, 4 h, 1 h: 7 GPU-hours
        incident(
            db, "inc-a", "ecc-uncorrectable", "n1", 0, "critical", d4, contained=d4 + 600, resolved=d4 + 2 * H
        )
        incident(db, "inc-b", "ecc-uncorrectable", "n1", 0, "critical", d5, contained=d5 + 1200,
                 resolved=d5 + 4 * H, evidence={"ladder": "gpu", "outcome": "recovered"})  # fmt: skip
        incident(
            db, "inc-c", "ecc-uncorrectable", "n1", 0, "critical", d6, contained=d6 + 1800, resolved=d6 + H
        )
        # n2 silent from Dec 6 22:00, still open at the end, escalated: 2 h x 4 GPUs (evidence) = 8
        incident(db, "inc-d", "node-silent", "n2", None, "major", END - 2 * H, escalated=END - H,
                 evidence={"gpus_expected": 4})  # fmt: skip
        # n3 silent Nov 29 23:00 to Nov 30 01:00: opened before the window, its last hour x 8 GPUs = 8
        incident(
            db, "inc-e", "node-silent", "n3", None, "major", END - 7 * DAY - H, resolved=END - 7 * DAY + H
        )
        # the breaker: a trip, no capacity
        incident(
            db,
            "inc-f",
            "circuit-breaker",
            "fleet",
            None,
            "critical",
            END - 4 * DAY,
            resolved=END - 4 * DAY + H,
        )
        # n4/gpu1 overheating Dec 2 12:00, capped after 5 min, 1 h: 1 GPU-hour; a false alarm
        g = END - 4.5 * DAY
        incident(db, "inc-g", "gpu-overheating", "n4", 1, "warning", g, contained=g + 300,
                 contain_kind="power_limit", resolved=g + H)  # fmt: skip
        # n4/gpu1 earlier: Nov 20 (in the 30-day repeat window) and Nov 1 (out of it)
        for iid, t in (("inc-h1", END - 36 * DAY), ("inc-h2", END - 17 * DAY)):
            incident(db, iid, "ecc-uncorrectable", "n4", 1, "critical", t, resolved=t + H)
        verdict(db, "inc-a", verdicts.Verdict.CONFIRMED, END - 10)
        verdict(db, "inc-b", verdicts.Verdict.FALSE_ALARM, END - 9)
        verdict(db, "inc-b", verdicts.Verdict.CONFIRMED, END - 8)  # the latest counts
        verdict(db, "inc-g", verdicts.Verdict.FALSE_ALARM, END - 7)
        db.commit()
    return path


def build(path: pathlib.Path, **opts: object) -> dict[str, object]:
    with store.Archive(path) as db:
        return figures.build(db, figures.Options(end=END, since_s=7 * DAY, **opts))  # type: ignore[arg-type]


def test_every_figure_of_the_report(archive: pathlib.Path) -> None:
    r = build(archive, fleet_gpus=100)
    assert r["totals"] == {"incidents": 5, "gpu_hours_lost": pytest.approx(24.0)}  # a, b, c, d, g
    assert r["by_rule"] == [
        {"rule_id": "ecc-uncorrectable", "kind": "gpu", "incidents": 3, "escalated": 0, "open": 0,
         "waiting_for_a_person": 0, "to_containment": {"count": 3, "p50_s": 1200.0, "p90_s": 1800.0},
         "to_resolution": {"count": 3, "p50_s": 7200.0, "p90_s": 14400.0},
         "ladder_outcomes": {"recovered": 1}},
        {"rule_id": "gpu-overheating", "kind": "gpu", "incidents": 1, "escalated": 0, "open": 0,
         "waiting_for_a_person": 0, "to_containment": {"count": 1, "p50_s": 300.0, "p90_s": 300.0},
         "to_resolution": {"count": 1, "p50_s": 3600.0, "p90_s": 3600.0}, "ladder_outcomes": {}},
        {"rule_id": "node-silent", "kind": "node", "incidents": 1, "escalated": 1, "open": 1,
         "waiting_for_a_person": 1, "to_containment": {"count": 0, "p50_s": None, "p90_s": None},
         "to_resolution": {"count": 0, "p50_s": None, "p90_s": None}, "ladder_outcomes": {}},
    ]  # fmt: skip
    lost = r["gpu_hours_lost"]
    assert isinstance(lost, dict)
    assert lost["by_cause"] == [
        {"rule_id": "ecc-uncorrectable", "kind": "gpu", "gpu_hours": pytest.approx(7.0)},
        {"rule_id": "gpu-overheating", "kind": "gpu", "gpu_hours": pytest.approx(1.0)},
        {"rule_id": "node-silent", "kind": "node", "gpu_hours": pytest.approx(16.0)},
    ]
    assert lost["by_day"] == {
        "2026-11-30": {"node-silent": pytest.approx(8.0)},
        "2026-12-02": {"gpu-overheating": pytest.approx(1.0)},
        "2026-12-04": {"ecc-uncorrectable": pytest.approx(2.0)},
        "2026-12-05": {"ecc-uncorrectable": pytest.approx(4.0)},
        "2026-12-06": {"ecc-uncorrectable": pytest.approx(1.0), "node-silent": pytest.approx(8.0)},
    }
    assert r["repair_times_s"] == [3600.0, 7200.0, 14400.0, 3600.0]  # g, a, b, c by open time
    assert r["repeat_offenders"] == [
        {"node": "n1", "gpu_index": 0, "gpu_uuid": None, "incidents": 3, "mean_time_between_s": DAY,
         "rules": ["ecc-uncorrectable"], "incident_ids": ["inc-a", "inc-b", "inc-c"]},
    ]  # fmt: skip
    assert r["breaker_trips"] == [
        {"incident_id": "inc-f", "opened_at": END - 4 * DAY, "resolved_at": END - 4 * DAY + H}
    ]
    assert r["precision"] == [
        {"rule_id": "ecc-uncorrectable", "confirmed": 2, "false_alarms": 0, "precision": 1.0},
        {"rule_id": "gpu-overheating", "confirmed": 0, "false_alarms": 1, "precision": 0.0},
    ]
    # 100 GPUs x 168 h = 16800 GPU-hours; weighted: 7 critical x 1 + 16 major x 2/3 + 1 warning x 1/3 = 18
    assert r["fleet"] == {
        "availability": pytest.approx(1 - 24 / 16800),
        "health_score": pytest.approx(100 * (1 - 18 / 16800)),
        "availability_by_label": {},  # no pool sized (--label-gpus)
    }
    assert r["assumptions"] == {
        "node_gpus": 8, "fleet_gpus": 100, "fleet_gpus_source": "given", "percentile": "nearest rank"
    }  # fmt: skip


def test_the_fleet_size_and_the_repeat_threshold_can_be_left_to_defaults_or_set(
    archive: pathlib.Path,
) -> None:
    r = build(archive)
    assert r["assumptions"]["fleet_gpus"] == 32  # type: ignore[index]  # n1..n4 seen, 8 GPUs each
    offenders = build(archive, repeat_threshold=2)["repeat_offenders"]
    assert [(o["node"], o["gpu_index"], o["incident_ids"]) for o in offenders] == [  # type: ignore[attr-defined]
        ("n1", 0, ["inc-a", "inc-b", "inc-c"]),
        ("n4", 1, ["inc-h2", "inc-g"]),  # inc-h1 is 36 days old: outside the 30-day window
    ]


def test_percentiles_are_nearest_rank() -> None:
    assert figures.percentile([], 50) is None
    assert [figures.percentile([4.0, 1.0, 3.0, 2.0], p) for p in (1, 25, 50, 51, 90, 100)] == [
        1,
        1,
        2,
        3,
        4,
        4,
    ]


def test_the_page_is_self_contained_with_both_plots(archive: pathlib.Path) -> None:
    r = build(archive, fleet_gpus=100)
    text = page.render(r)
    for outside in ("src=", "href=", "@import", "url(", "<script", "<link"):
        assert outside not in text, outside
    assert text.count("<svg") == 3  # repair times, GPU-hours per day, the repeat offenders' map
    assert page.repair_histogram(r["repair_times_s"]) == [  # type: ignore[arg-type]
        ("0-5m", 0), ("5m-15m", 0), ("15m-1h", 0), ("1h-4h", 3), ("4h-1d", 1), (">1d", 0)
    ]  # fmt: skip
    assert "inc-a, inc-b, inc-c" in text  # the repeat offender's evidence
    assert "99.9" in text  # the health score, 99.89...


def test_the_command_prints_the_json_and_writes_the_page(
    archive: pathlib.Path, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report.html"
    argv = [
        "report",
        "--db",
        str(archive),
        "--since",
        "7d",
        "--json",
        "--html",
        str(out),
        "--fleet-gpus",
        "100",
    ]
    assert cli.main([*argv, "--now", str(END)]) == 0
    printed = orjson.loads(capsys.readouterr().out)
    assert printed == orjson.loads(orjson.dumps(build(archive, fleet_gpus=100)))
    assert out.read_text().startswith("<!doctype html>")
    assert cli.main(["report", "--db", str(archive), "--fleet-gpus", "100", "--now", str(END)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "incidents 5, GPU-hours lost 24.00, fleet health score 99.9",
        "  ecc-uncorrectable (gpu): 3 incidents, repair p50 2h",
        "  gpu-overheating (gpu): 1 incidents, repair p50 1h",
        "  node-silent (node): 1 incidents, repair p50 -",
        "  repeat offender n1/gpu0: 3 incidents (ecc-uncorrectable)",
    ]
    assert cli.main(["report", "--db", str(tmp_path / "none.db")]) == 2
    for bad in ("pool", "pool=a", "pool=a:0", "=a:8"):  # KEY=VALUE:GPUS, GPUS > 0
        with pytest.raises(SystemExit) as refused:
            cli.main(["report", "--db", str(archive), "--label-gpus", bad])
        assert refused.value.code == 2, bad
    assert (
        cli.main(["report", "--db", str(archive), "--json", "--label-gpus", "pool=x:8", "--now", str(END)])
        == 0
    )
    assert orjson.loads(capsys.readouterr().out)["fleet"]["availability_by_label"] == {"pool": {"x": 1.0}}


def test_a_gpu_two_incidents_cover_at_once_counts_once_and_a_replacement_is_no_new_fault(
    tmp_path: pathlib.Path,
) -> None:
    with store.Archive(tmp_path / "overlap.db") as db:
        t = END - 2 * DAY  # Dec 5 00:00
        # n5 silent 00:00-02:00 (8 GPUs: 16 GPU-hours); its GPU 2 has an ECC incident 01:00-03:00, whose
        # first hour the node's incident already covers: 1 GPU-hour more, not 2
        incident(db, "o-node", "node-silent", "n5", None, "major", t, resolved=t + 2 * H)
        incident(db, "o-gpu", "ecc-uncorrectable", "n5", 2, "critical", t + H, resolved=t + 3 * H)
        # n6/gpu0: a fault 10:00-15:00 whose ladder ends in a replacement opened at 11:00 and closed with
        # it: 5 GPU-hours, all the fault's; the replacement is listed but is no incident of its own
        f = t + 10 * H
        ended: Evidence = {"outcome": "hardware_replacement"}
        incident(db, "o-fault", "ecc-uncorrectable", "n6", 0, "critical", f, contained=f + 600,
                 escalated=f + H, resolved=f + 5 * H, evidence=ended)  # fmt: skip
        incident(db, "o-rep", figures.REPLACEMENT_RULE, "n6", 0, "critical", f + H, resolved=f + 5 * H,
                 evidence={"incident": "o-fault"})  # fmt: skip
        db.commit()
        r = figures.build(db, figures.Options(end=END, since_s=7 * DAY, fleet_gpus=100, repeat_threshold=2))
    assert r["totals"] == {"incidents": 3, "gpu_hours_lost": pytest.approx(16 + 1 + 5)}
    assert r["gpu_hours_lost"]["by_cause"] == [
        {"rule_id": "ecc-uncorrectable", "kind": "gpu", "gpu_hours": pytest.approx(1 + 5)},
        {"rule_id": "node-silent", "kind": "node", "gpu_hours": pytest.approx(16)},
    ]  # the replacement lost nothing the fault had not: no row of its own
    assert [(b["rule_id"], b["incidents"]) for b in r["by_rule"]] == [
        ("ecc-uncorrectable", 2), (figures.REPLACEMENT_RULE, 1), ("node-silent", 1)
    ]  # fmt: skip
    assert sorted(r["repair_times_s"]) == [2 * H, 2 * H, 5 * H]  # the replacement's is not a repair
    assert r["repeat_offenders"] == []  # n6/gpu0: one fault; its replacement is not a second


def test_precision_per_anomaly_component_from_the_latest_verdicts(tmp_path: pathlib.Path) -> None:
    with store.Archive(tmp_path / "anomaly.db") as db:
        t = END - DAY
        for n, component in enumerate(("thermal_gpu", "thermal_gpu", "forest", "thermal_gpu")):
            iid = f"an-{n}"
            incident(db, iid, "anomaly-score-high", "n7", n, "warning", t + n * H, resolved=t + n * H + 600,
                     evidence={"anomaly.component": component, "anomaly_score": 0.95})  # fmt: skip
        incident(db, "ecc", "ecc-uncorrectable", "n8", 0, "critical", t, resolved=t + H)  # no component
        verdict(db, "an-0", verdicts.Verdict.CONFIRMED, END - 50)
        verdict(db, "an-1", verdicts.Verdict.CONFIRMED, END - 49)
        verdict(db, "an-1", verdicts.Verdict.FALSE_ALARM, END - 48)  # the latest counts
        verdict(db, "an-2", verdicts.Verdict.FALSE_ALARM, END - 47)
        verdict(db, "ecc", verdicts.Verdict.CONFIRMED, END - 46)
        db.commit()  # an-3 has no verdict: it counts toward nothing
        r = figures.build(db, figures.Options(end=END, since_s=7 * DAY))
    assert r["precision_by_component"] == [
        {"component": "forest", "confirmed": 0, "false_alarms": 1, "precision": 0.0},
        {"component": "thermal_gpu", "confirmed": 1, "false_alarms": 1, "precision": 0.5},
    ]
    assert [(p["rule_id"], p["precision"]) for p in r["precision"]] == [
        ("anomaly-score-high", pytest.approx(1 / 3)), ("ecc-uncorrectable", 1.0)
    ]  # fmt: skip
    text = page.render(r)
    assert "<td>thermal_gpu</td>" in text


def test_the_map_of_repeat_offenders_draws_the_worst_nodes_only() -> None:
    rows = [{"node": f"n{i:03d}", "counts": {"0": 3 + (i == 7)}} for i in range(page.MAP_NODES_MAX + 5)]
    svg = page.offender_map_svg(rows)
    assert svg.count("<text") == 9 + page.MAP_NODES_MAX  # the header's 9 cells, a name per node drawn
    assert ">n007<" in svg, "the node with the most incidents is drawn"
    assert "and 5 more nodes" in svg
