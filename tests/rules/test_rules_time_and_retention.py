"""The engine judges time on its own clock (DESIGN §8): a node's ``ts`` is data. Frames are ordered by
when they count (the controller's receive time), event quiet periods run on the evaluation clock, and
nodes silent past their retention are forgotten, their rows reused."""

from __future__ import annotations

import structlog.testing

from healer.rules import engine
from healer.schemas import events
from tests.rules.rules_helpers import T0, frame, make_engine, rule

TEN_YEARS_S = 10 * 365 * 86400.0
SILENT = (
    "rules:\n  - id: node-silent\n    description: d\n    scope: node\n"
    "    when: absent(telemetry[2m])\n    severity: major\n    actions: [cordon]\n"
)
XID = (
    "rules:\n  - id: fatal\n    description: d\n    on_event: {kind: xid, xid: [48]}\n"
    "    severity: critical\n    actions: [cordon]\n    resolve: {for: 10m}\n"
)


def test_a_frame_from_the_future_does_not_make_later_frames_old() -> None:
    eng = make_engine(SILENT + rule("temp_c > 80").removeprefix("rules:\n"))
    bad = frame("n", TEN_YEARS_S, gpus=1, temp_c=40)
    eng.ingest(bad, at=T0)
    eng.evaluate(T0)
    with structlog.testing.capture_logs() as logs:
        for t in range(1, 200):
            eng.ingest(frame("n", float(t), gpus=1, temp_c=90 if t > 150 else 40), at=T0 + t)
            out = eng.evaluate(T0 + t)
            assert ("node-silent", "n") not in {(f.rule_id, f.node) for f in out}, f"silent at {t}"
    assert eng.state.dropped_frames == 0
    assert not [e for e in logs if e["event"] == "frames_out_of_order_dropped"]
    assert {(f.rule_id, f.status) for f in out} == {("r", "firing")}, "the newest frame's values count"


def test_a_frame_from_the_past_is_not_replayed_over_newer_data() -> None:
    """Received later, it counts later: its values are the newest, whatever its ts says."""
    eng = make_engine(rule("temp_c > 80"))
    eng.ingest(frame("n", 10.0, gpus=1, temp_c=40), at=T0 + 10)
    eng.ingest(frame("n", -1000.0, gpus=1, temp_c=90), at=T0 + 11)
    assert {(f.rule_id, f.status) for f in eng.evaluate(T0 + 11)} == {("r", "fired")}


def test_event_quiet_time_runs_on_the_evaluation_clock_not_the_event_ts() -> None:
    eng = make_engine(XID)
    # A ts ten years ahead: once quiet for 10 minutes on the evaluator's clock, it resolves.
    eng.ingest_event(events.new("a", "xid", gpu_index=0, xid=48, ts=T0 + TEN_YEARS_S))
    # A ts in 1970: it does not open and resolve in the same tick.
    eng.ingest_event(events.new("b", "xid", gpu_index=0, xid=48, ts=1000.0))
    assert {(f.node, f.status) for f in eng.evaluate(T0)} == {("a", "fired"), ("b", "fired")}
    assert {(f.node, f.status) for f in eng.evaluate(T0 + 599)} == {("a", "firing"), ("b", "firing")}
    assert {(f.node, f.status) for f in eng.evaluate(T0 + 600)} == {("a", "resolved"), ("b", "resolved")}


def test_a_node_silent_past_its_retention_is_forgotten_and_its_row_reused() -> None:
    eng = make_engine(SILENT, capacity=2)
    eng.ingest(frame("gone", 0.0), at=T0)
    eng.ingest(frame("stays", 0.0), at=T0)
    eng.evaluate(T0)
    for t in (60.0, 180.0):
        eng.ingest(frame("stays", t), at=T0 + t)
    assert {(f.node, f.status) for f in eng.evaluate(T0 + 180)} == {("gone", "fired")}
    assert eng.forget_silent(T0 + 180, retention_s=3600).nodes == []
    forgotten = eng.forget_silent(T0 + 3700, retention_s=3600)
    assert forgotten.nodes == ["gone"]
    [resolved] = forgotten.resolved
    assert (resolved.rule_id, resolved.node, resolved.status) == ("node-silent", "gone", "resolved")
    assert resolved.evidence["reason"] == engine.FORGOTTEN
    assert eng.state.node_index("gone") is None
    # A new node takes the freed row: the fleet state does not grow.
    eng.ingest(frame("new", 3700.0), at=T0 + 3700)
    eng.ingest(frame("stays", 3700.0), at=T0 + 3700)
    out = eng.evaluate(T0 + 3700)
    assert eng.state.cap == 2
    assert eng.state.n == 2
    assert eng.state.node_index("new") == 0
    assert not out, "nothing of the forgotten node lives on in its row"
