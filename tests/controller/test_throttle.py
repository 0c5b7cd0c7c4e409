"""Throttled log lines: every occurrence counted, at most one line per interval, none hidden."""

from __future__ import annotations

import structlog.testing

from healer.controller.observability import drops, throttle


def test_a_flood_is_one_line_per_interval_with_the_counts_since_the_last() -> None:
    now = [0.0]
    log = structlog.get_logger("test")
    bad = throttle.Throttled(log, "controller.bad_frame", every_s=10.0, clock=lambda: now[0])
    with structlog.testing.capture_logs() as logs:
        for i in range(1000):
            now[0] = i * 0.01  # 1,000 bad frames in 10 s
            bad.note("json" if i % 2 else "validation", subject="healer.telemetry.n1")
        now[0] = 10.0
        bad.note("json", subject="healer.telemetry.n1")
    assert [e["event"] for e in logs] == ["controller.bad_frame", "controller.bad_frame"]
    assert logs[0]["since_last"] == {"validation": 1}
    assert logs[1]["since_last"] == {"json": 501, "validation": 499}  # this line's own included
    assert logs[1]["subject"] == "healer.telemetry.n1"


def test_the_last_line_of_a_burst_tells_its_end_and_the_totals_match_the_count() -> None:
    """The chaos run's log said 1 where the metric said 400,118: the only line came at the first drop.
    After a burst, a flush writes what was still untold, and every line carries the running totals."""
    now = [0.0]
    bad = throttle.Throttled(
        structlog.get_logger("t"), "controller.bad_frame", every_s=10.0, clock=lambda: now[0]
    )
    with structlog.testing.capture_logs() as logs:
        for i in range(400):
            now[0] = i * 0.01  # a burst of 4 s: one line at its start
            bad.note("json", subject="healer.telemetry.flood")
        bad.flush()
        assert len(logs) == 1, "nothing more within the interval"
        now[0] = 14.0
        assert bad.flush()
        assert not bad.flush(), "nothing untold any more"
    assert [e["since_last"] for e in logs] == [{"json": 1}, {"json": 399}]
    assert logs[-1]["total"] == {"json": 400} == dict(bad.totals)


def test_frames_dropped_are_reported_with_the_metrics_total_and_once_more_when_they_stop() -> None:
    now = [0.0]
    report = drops.DropLog(structlog.get_logger("t"), every_s=10.0, clock=lambda: now[0])
    with structlog.testing.capture_logs() as logs:
        assert report.report(dropped=1)  # the first drop: told at once
        for i in range(1, 40):
            now[0] = i * 0.5  # still dropping for 20 s
            report.report(dropped=1010 * i)
        now[0] = 20.5
        assert report.report(dropped=39_390), "stopped growing: the final count"
        assert not report.report(dropped=39_390)
    assert [e["dropped_total"] for e in logs] == [1, 20_200, 39_390]
    assert logs[-1]["dropped_total"] == 39_390, "what the metric counts"
    assert logs[-1]["ended"] is True
    assert sum(e["since_last"] for e in logs) == 39_390
