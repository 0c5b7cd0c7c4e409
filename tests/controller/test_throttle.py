"""Throttled log lines: every occurrence counted, at most one line per interval, none hidden."""

from __future__ import annotations

import structlog.testing

from healer.controller import throttle


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
