"""Evaluation over FleetState: values of range functions, null semantics, hysteresis, selectors, events."""

from __future__ import annotations

import math
import pathlib

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest
import structlog
import structlog.testing

from healer.rules import engine, evaluate, loader, state, windows
from healer.schemas import codec, events, telemetry
from tests.rules.rules_helpers import T0, frame, make_engine, rule

REPO = pathlib.Path(__file__).resolve().parents[2]


def statuses(firings: list[engine.Firing]) -> set[tuple[str, str, int | None, str]]:
    return {(f.rule_id, f.node, f.gpu, f.status) for f in firings}


def value_of(expr: str, frames: list[telemetry.NodeFrame], now: float, *, scope: str = "gpu") -> float:
    """Evaluate one numeric expression (as evidence of ``expr > -1e18``) on GPU 0 / the node."""
    eng = make_engine(rule(f"{expr} > -1e18 or {expr} <= -1e18", scope=scope))
    for f in frames:
        eng.ingest(f)
    eng.state.flush()
    ev = evaluate.Evaluator(eng.state, now)
    root = eng.rules.rules[0].when
    assert root is not None
    _, evidence = ev.condition(root, eng.rules.rules[0].when_text)
    arr = np.broadcast_to(np.asarray(evidence[expr]), (eng.state.n, eng.state.gpus))
    return float(arr[0, 0])


def test_increase_handles_counter_resets_like_prometheus() -> None:
    counts = [0, 5, 10, 2, 4]  # a reset between 10 and 2: increase is 10 + 2 + 2
    frames = [frame("n", i * 10.0, ecc_dbe_volatile=c) for i, c in enumerate(counts)]
    assert value_of("increase(ecc_dbe_volatile[5m])", frames, T0 + 40) == 14.0
    assert value_of("rate(ecc_dbe_volatile[5m])", frames, T0 + 40) == 14.0 / 300


def test_gauge_window_functions() -> None:
    temps = [60, 70, 65, 80, 75]
    frames = [frame("n", i * 10.0, temp_c=t) for i, t in enumerate(temps)]
    now = T0 + 40
    assert value_of("max_over_time(temp_c[5m])", frames, now) == 80
    assert value_of("min_over_time(temp_c[5m])", frames, now) == 60
    assert value_of("avg_over_time(temp_c[5m])", frames, now) == 70
    assert value_of("delta(temp_c[5m])", frames, now) == 15
    assert value_of("changes(temp_c[5m])", frames, now) == 4


def test_window_forgets_samples_older_than_the_window() -> None:
    frames = [frame("n", 0.0, temp_c=95), *(frame("n", t, temp_c=60) for t in range(60, 700, 60))]
    assert value_of("max_over_time(temp_c[5m])", frames, T0 + 660) == 60


def test_window_without_samples_is_missing_not_zero() -> None:
    frames = [frame("n", 0.0, ecc_dbe_volatile=None)]
    assert math.isnan(value_of("increase(ecc_dbe_volatile[5m])", frames, T0))


def test_null_reading_fires_nothing_not_even_under_not() -> None:
    eng = make_engine(rule("not (temp_c > 80)"))
    eng.ingest(frame("n", 0.0, temp_c={0: None, 1: 50.0}))
    assert statuses(eng.evaluate(T0)) == {("r", "n", 1, "fired")}


def test_kleene_logic_false_and_unknown_is_false_true_or_unknown_is_true() -> None:
    eng = make_engine(rule("temp_c > 80 or power_w > 500"))
    eng.ingest(frame("n", 0.0, temp_c=None, power_w={0: 600.0, 1: 100.0}))
    assert statuses(eng.evaluate(T0)) == {("r", "n", 0, "fired")}
    eng = make_engine(rule("not (temp_c > 80 and power_w > 500)"))
    eng.ingest(frame("n", 0.0, temp_c=None, power_w={0: 600.0, 1: 100.0}))
    assert statuses(eng.evaluate(T0)) == {("r", "n", 1, "fired")}


def test_for_then_resolve_with_hysteresis_and_evidence() -> None:
    text = rule("temp_c > 85", extra="    for: 30s\n    resolve: {when: temp_c < 75, for: 20s}\n")
    eng = make_engine(text)
    temps = [90, 90, 90, 90, 80, 70, 70, 70]  # every 10 s
    seen = []
    for i, t in enumerate(temps):
        eng.ingest(frame("n", i * 10.0, gpus=1, temp_c=t))
        seen.append([(f.status, f.evidence) for f in eng.evaluate(T0 + i * 10)])
    assert seen[:3] == [[], [], []]
    assert [s for s, _ in seen[3]] == ["fired"]  # 30 s above 85
    assert seen[3][0][1]["temp_c"] == 90.0
    assert [s for s, _ in seen[4]] == ["firing"]  # 80: no longer hot, not yet cool
    assert [s for s, _ in seen[5]] == ["firing"]  # 70: resolving starts
    assert [s for s, _ in seen[6]] == ["firing"]
    assert [s for s, _ in seen[7]] == ["resolved"]  # 20 s below 75


def test_default_resolution_is_when_the_condition_is_definitely_false() -> None:
    eng = make_engine(rule("temp_c > 85"))
    eng.ingest(frame("n", 0.0, gpus=1, temp_c=90))
    assert statuses(eng.evaluate(T0)) == {("r", "n", 0, "fired")}
    eng.ingest(frame("n", 10.0, gpus=1, temp_c=None))
    assert statuses(eng.evaluate(T0 + 10)) == {("r", "n", 0, "firing")}  # unknown keeps it firing
    eng.ingest(frame("n", 20.0, gpus=1, temp_c=60))
    assert statuses(eng.evaluate(T0 + 20)) == {("r", "n", 0, "resolved")}


def test_cooldown_keeps_a_resolved_target_from_firing_again_too_soon() -> None:
    eng = make_engine(rule("temp_c > 85", extra="    cooldown: 1m\n"))
    temps = {0: 90, 10: 60, 20: 90, 80: 90}
    out = {}
    for t, temp in temps.items():
        eng.ingest(frame("n", float(t), gpus=1, temp_c=temp))
        out[t] = {f.status for f in eng.evaluate(T0 + t)}
    assert out == {0: {"fired"}, 10: {"resolved"}, 20: set(), 80: {"fired"}}


def test_node_scope_aggregations() -> None:
    eng = make_engine(
        rule("count(temp_c > 80) >= 2 and max(temp_c) > 89 and avg(power_w) < 500", scope="node")
    )
    eng.ingest(frame("hot", 0.0, gpus=4, temp_c={0: 90.0, 1: 85.0, 2: 60.0, 3: None}, power_w=400.0))
    eng.ingest(frame("warm", 0.0, gpus=4, temp_c={0: 90.0}, power_w=400.0))
    (f,) = eng.evaluate(T0)
    assert (f.node, f.gpu, f.status) == ("hot", None, "fired")
    assert f.evidence["count(temp_c > 80)"] == 2.0
    assert f.evidence["max(temp_c)"] == 90.0


def test_gpu_missing_against_expected_and_node_silence() -> None:
    text = (
        "rules:\n"
        "  - {id: missing, description: d, scope: node, when: gpus_missing > 0, severity: critical}\n"
        "  - {id: silent, description: d, scope: node, when: 'absent(telemetry[2m])', severity: major}\n"
    )
    eng = make_engine(text)
    eng.ingest(frame("a", 0.0, gpus=7, expected=8))
    eng.ingest(frame("b", 0.0, gpus=8, expected=8))
    assert statuses(eng.evaluate(T0)) == {("missing", "a", None, "fired")}
    eng.ingest(frame("a", 100.0, gpus=7, expected=8))
    assert statuses(eng.evaluate(T0 + 130)) == {
        ("missing", "a", None, "firing"),
        ("silent", "b", None, "fired"),
    }


def test_stale_node_reads_as_missing_so_instant_rules_neither_fire_nor_resolve() -> None:
    eng = make_engine(rule("temp_c > 85"), stale_after_s=60.0)
    eng.ingest(frame("n", 0.0, gpus=1, temp_c=95))
    assert statuses(eng.evaluate(T0)) == {("r", "n", 0, "fired")}
    assert statuses(eng.evaluate(T0 + 600)) == {("r", "n", 0, "firing")}
    assert math.isnan(eng.state.instant("temp_c", T0 + 600)[0, 0])


def test_match_selectors_model_node_and_labels() -> None:
    extra = '    match: {model: "*A100*", node: "gpu-*", labels: {pool: "train*"}}\n'
    eng = make_engine(rule("temp_c > 80", extra=extra))
    eng.set_labels("gpu-1", {"pool": "training"})
    eng.set_labels("gpu-2", {"pool": "inference"})
    a100 = "NVIDIA A100-SXM4-80GB"
    eng.ingest(frame("gpu-1", 0.0, temp_c=90, model={0: a100}))
    eng.ingest(frame("gpu-2", 0.0, temp_c=90, model=a100))
    eng.ingest(frame("cpu-1", 0.0, temp_c=90, model=a100))
    assert statuses(eng.evaluate(T0)) == {("r", "gpu-1", 0, "fired")}


def test_out_of_order_and_duplicate_frames_in_one_batch() -> None:
    eng = make_engine(rule("increase(ecc_dbe_volatile[5m]) > 2"))
    # Two frames from one node queued before one flush are applied in time order...
    eng.ingest(frame("n", 10.0, gpus=1, ecc_dbe_volatile=3))
    eng.ingest(frame("n", 0.0, gpus=1, ecc_dbe_volatile=0))
    assert statuses(eng.evaluate(T0 + 10)) == {("r", "n", 0, "fired")}
    # ... and a frame older than what was applied is dropped and counted.
    eng.ingest(frame("n", 5.0, gpus=1, ecc_dbe_volatile=100))
    with structlog.testing.capture_logs() as logs:
        eng.evaluate(T0 + 20)
    assert eng.state.dropped_frames == 1
    assert {
        "event": "frames_out_of_order_dropped",
        "count": 1,
        "nodes": ["n"],
        "log_level": "warning",
    } in logs


@pytest.mark.usefixtures("frame_decoder")
def test_frames_staged_in_many_planes_land_in_their_own_rows() -> None:
    """More GPU rows than one staging plane holds (state.STAGE_ROWS, state.PLANE_ROWS), frames of all
    kinds (pydantic NodeFrames, the strict views, and frames decoded straight into the staging plane by
    ``Engine.decode``, in runs and one by one), GPU counts varying by node and arrival out of time order:
    each node's newest values are its own, and its windows saw every frame."""
    eng = make_engine(rule("increase(ecc_dbe_volatile[5m]) > 0 and temp_c > 0"), capacity=4)
    nodes = 3 * state.PLANE_ROWS // 8 + 7
    for t in (2.0, 0.0, 1.0):  # the newest first
        for i in range(nodes):
            nf = frame(
                f"n{i}", t, gpus=1 + i % 4, temp_c={g: 30.0 + i + g / 10 + t for g in range(4)},
                ecc_dbe_volatile={g: int(t) * (i % 3) for g in range(4)},
            )  # fmt: skip
            kind = i % 5 if i < nodes // 2 else 4  # then a long run of plane frames
            if kind == 0:
                eng.ingest(nf)
            elif kind == 1:
                eng.ingest(codec.decode_frame_view(codec.encode(nf)))
            else:
                eng.ingest(eng.decode(codec.encode(nf)))
    fired = statuses(eng.evaluate(T0 + 2))
    assert fired == {("r", f"n{i}", g, "fired") for i in range(nodes) if i % 3 for g in range(1 + i % 4)}
    st_ = eng.state
    for i in range(nodes):
        row = st_.node_index(f"n{i}")
        assert row is not None
        temps = st_.latest[st_.col["temp_c"], row]
        gpus = 1 + i % 4
        assert temps[:gpus].tolist() == [30.0 + i + g / 10 + 2.0 for g in range(gpus)]
        assert np.isnan(temps[gpus:]).all()
        assert st_.present[row] == gpus


def test_each_node_keeps_its_newest_frame_when_a_flush_holds_several_of_some_nodes() -> None:
    """One evaluation after frames of nodes that sent 3, 2 and 1 of them: each node's latest readings
    are its newest frame's, however many the others sent, and its windows count every frame."""
    eng = make_engine(rule("increase(ecc_dbe_volatile[5m]) > 1 and temp_c > 0"))
    sent = {"a": 3, "b": 2, "c": 1}
    for t in range(3):
        for node, n in sent.items():
            if t < n:
                eng.ingest(frame(node, float(t), temp_c=40.0 + 10 * t, ecc_dbe_volatile=t * 2))
    fired = statuses(eng.evaluate(T0 + 3))
    assert fired == {("r", "a", g, "fired") for g in range(2)} | {("r", "b", g, "fired") for g in range(2)}
    st_ = eng.state
    latest = {n: st_.latest[st_.col["temp_c"], st_.node_index(n), 0] for n in sent}
    assert latest == {"a": 60.0, "b": 50.0, "c": 40.0}
    assert eng.latest_power_limit("c", 0) is not None


@pytest.mark.usefixtures("frame_decoder")
def test_a_decoded_frame_is_ingested_with_its_own_values_whatever_happened_in_between() -> None:
    """``Engine.decode`` writes a frame's rows where the next one's go: a frame decoded before another
    (or before a flush) and ingested after it still lands with its own values, never the other's."""
    eng = make_engine(rule("temp_c > 0"))
    a = eng.decode(codec.encode(frame("a", 0.0, temp_c=41.0)))
    b = eng.decode(codec.encode(frame("b", 0.0, temp_c=52.0)))
    eng.ingest(a)
    eng.ingest(b)
    c = eng.decode(codec.encode(frame("c", 0.0, temp_c=63.0)))
    assert eng.summary("a", 0, T0)["latest.temp_c"] == 41.0  # flushes between c's decode and its ingest
    eng.ingest(c)
    rejected = eng.decode(codec.encode(frame("d", 0.0, temp_c=99.0)))
    assert rejected.node == "d"  # never ingested: costs nothing
    eng.ingest(eng.decode(codec.encode(frame("e", 0.0, temp_c=74.0))))
    eng.evaluate(T0)
    st_ = eng.state
    latest = {n: st_.latest[st_.col["temp_c"], st_.node_index(n), 0] for n in "abce"}
    assert latest == {"a": 41.0, "b": 52.0, "c": 63.0, "e": 74.0}
    assert st_.node_index("d") is None


@pytest.mark.usefixtures("frame_decoder")
def test_the_newest_power_limit_of_each_gpu_is_kept_whatever_the_rules_read() -> None:
    eng = make_engine(rule("temp_c > 90"))
    eng.ingest(eng.decode(codec.encode(frame("n", 0.0, power_limit_w={0: 700.0, 1: 650.0}))))
    eng.ingest(frame("n", 1.0, power_limit_w={0: 500.0, 1: None}))
    assert eng.latest_power_limit("n", 0) == (T0 + 1, 500.0)
    assert eng.latest_power_limit("n", 1) is None  # null in the newest frame
    assert eng.latest_power_limit("n", 2) is None
    assert eng.latest_power_limit("other", 0) is None
    eng.ingest(eng.decode(codec.encode(frame("n", 2.0, gpus=1, power_limit_w=450.0))))
    assert eng.latest_power_limit("n", 0) == (T0 + 2, 450.0)
    assert eng.latest_power_limit("n", 1) is None  # absent from the newest frame


def test_fleet_and_gpu_count_grow_without_losing_state() -> None:
    eng = make_engine(rule("increase(ecc_dbe_volatile[5m]) > 0"), capacity=2, gpus_per_node=2)
    for i in range(5):
        eng.ingest(frame(f"n{i}", 0.0, gpus=2, ecc_dbe_volatile=0))
    eng.evaluate(T0)
    for i in range(5):
        eng.ingest(frame(f"n{i}", 10.0, gpus=4, ecc_dbe_volatile={0: 0, 1: 1, 3: 0}))
    assert statuses(eng.evaluate(T0 + 10)) == {("r", f"n{i}", 1, "fired") for i in range(5)}
    assert eng.state.cap >= 5
    assert eng.state.gpus == 4


def test_reload_keeps_state_of_unchanged_rules_and_drops_removed_ones() -> None:
    both = (
        "rules:\n"
        "  - {id: a, description: d, when: 'temp_c > 80', for: 20s, severity: info}\n"
        "  - {id: b, description: d, when: 'increase(ecc_dbe_volatile[5m]) > 0', severity: info}\n"
    )
    eng = make_engine(both)
    eng.ingest(frame("n", 0.0, gpus=1, temp_c=90, ecc_dbe_volatile=0))
    eng.evaluate(T0)
    only_a = loader.load_text(
        "rules:\n  - {id: a, description: d, when: 'temp_c > 80', for: 20s, severity: info}\n"
    )
    assert only_a.ruleset is not None
    assert eng.set_rules(only_a.ruleset) == []  # nothing of b was firing
    assert "ecc_dbe_volatile" not in eng.state.history
    eng.ingest(frame("n", 20.0, gpus=1, temp_c=90))
    assert statuses(eng.evaluate(T0 + 20)) == {("a", "n", 0, "fired")}  # pending since t=0 survived


def test_anomaly_score_reads_zero_until_fed() -> None:
    eng = make_engine(rule("anomaly_score >= 0.9"))
    eng.ingest(frame("n", 0.0))
    assert eng.evaluate(T0) == []
    eng.set_anomaly_scores("n", {1: 0.95})
    assert statuses(eng.evaluate(T0 + 1)) == {("r", "n", 1, "fired")}


def test_derived_clock_flags_read_bits_of_the_bitmask() -> None:
    eng = make_engine(rule("clocks_hw_power_brake and not clocks_sw_power_cap"))
    eng.ingest(frame("n", 0.0, clocks_event_reasons={0: 0x80, 1: 0x84}))
    assert statuses(eng.evaluate(T0)) == {("r", "n", 0, "fired")}


def test_event_rules_fire_on_matching_events_only() -> None:
    text = (
        "rules:\n"
        "  - id: fatal\n    description: d\n    on_event: {kind: xid, xid: [79]}\n    severity: critical\n"
        "    actions: [cordon]\n    resolve: {for: 10m}\n"
        "  - id: once\n    description: d\n    scope: node\n    on_event: {kind: nvml_error}\n"
        "    severity: info\n    actions: [notify]\n"
    )
    eng = make_engine(text)
    eng.ingest_event(events.new("n", "xid", gpu_index=2, xid=13, ts=T0))
    eng.ingest_event(events.new("n", "xid", gpu_index=2, xid=79, ts=T0))
    eng.ingest_event(events.new("n", "nvml_error", ts=T0))
    (a, b) = eng.evaluate(T0)
    assert statuses([a, b]) == {("fatal", "n", 2, "fired"), ("once", "n", None, "fired")}
    assert a.evidence["xid"] == 79
    assert statuses(eng.evaluate(T0 + 60)) == {("fatal", "n", 2, "firing")}  # one-shot rule is gone
    assert statuses(eng.evaluate(T0 + 600)) == {("fatal", "n", 2, "resolved")}


def test_state_keeps_only_what_the_rules_read() -> None:
    ruleset = loader.load_text(rule("increase(ecc_dbe_volatile[10m]) > 0 and temp_c > 1")).ruleset
    assert ruleset is not None
    needs = windows.needs_of(ruleset)
    assert needs.columns == ("temp_c", "ecc_dbe_volatile")
    assert needs.windows == {"ecc_dbe_volatile": {"inc": (600.0,)}}


def test_reload_resolves_what_a_removed_or_changed_rule_had_firing() -> None:
    eng = make_engine(rule("temp_c > 80"))
    eng.ingest(frame("n", 0.0, gpus=1, temp_c=90))
    assert statuses(eng.evaluate(T0)) == {("r", "n", 0, "fired")}
    changed = loader.load_text(rule("temp_c > 85")).ruleset
    assert changed is not None
    (gone,) = eng.set_rules(changed)
    assert (gone.rule_id, gone.node, gone.gpu, gone.status) == ("r", "n", 0, "resolved")
    assert gone.evidence == {"reason": "rule removed or changed by a reload"}
    assert statuses(eng.evaluate(T0 + 1)) == {("r", "n", 0, "fired")}  # the new rule starts afresh


def test_receive_time_not_the_node_clock_decides_silence() -> None:
    text = (
        "rules:\n  - {id: s, description: d, scope: node, when: 'absent(telemetry[2m])', severity: major}\n"
    )
    eng = make_engine(text)
    skewed = frame("n", -600.0, gpus=1)  # the node's clock is 10 minutes behind
    eng.ingest(skewed, at=T0)
    assert eng.evaluate(T0 + 60) == []
    eng.ingest(frame("n", -600.0 + 100, gpus=1), at=T0 + 100)
    assert eng.evaluate(T0 + 200) == []
    assert statuses(eng.evaluate(T0 + 221)) == {("s", "n", None, "fired")}


def test_a_node_known_only_by_its_labels_is_not_reported_silent() -> None:
    text = (
        "rules:\n  - {id: s, description: d, scope: node, when: 'absent(telemetry[2m])', severity: major}\n"
    )
    eng = make_engine(text)
    eng.set_labels("never-reported", {"pool": "a"})  # e.g. a controller that just started
    assert eng.evaluate(T0 + 3600) == []


@hypothesis.given(
    st.lists(st.one_of(st.none(), st.integers(min_value=0, max_value=50)), min_size=1, max_size=70),
    st.sampled_from([60.0, 300.0]),
)
@hypothesis.settings(max_examples=100, deadline=None)
def test_increase_and_max_match_a_sample_by_sample_reference(
    values: list[int | None], window_s: float
) -> None:
    """Against a plain loop over raw samples (10 s apart) using the same bucket boundaries."""
    w = f"[{int(window_s)}s]"
    eng = make_engine(rule(f"increase(ecc_dbe_volatile{w}) > 0 or max_over_time(temp_c{w}) > 0"))
    for i, v in enumerate(values):
        eng.ingest(frame("n", i * 10.0, gpus=1, ecc_dbe_volatile=v, temp_c=v))
        eng.evaluate(T0 + i * 10.0)
    now = T0 + (len(values) - 1) * 10.0
    width = window_s / 20
    first_bucket = math.floor(now / width) - round(window_s / width) + 1
    prev, total, peak, last_valid = None, 0.0, math.nan, -math.inf
    for i, v in enumerate(values):
        ts = T0 + i * 10.0
        if v is None:
            continue
        in_window = math.floor(ts / width) >= first_bucket
        if prev is not None and in_window:
            total += v if v < prev else v - prev
        if in_window:
            peak = v if math.isnan(peak) else max(peak, v)
        prev, last_valid = v, ts
    expected_increase = total if last_valid >= now - window_s else math.nan
    got_increase = eng.state.window("increase", "ecc_dbe_volatile", window_s, now)[0, 0]
    got_max = eng.state.window("max_over_time", "temp_c", window_s, now)[0, 0]
    assert same(got_increase, expected_increase)
    if last_valid >= now - window_s:
        assert same(got_max, peak)


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def test_default_pack_on_an_empty_fleet_and_a_frame_without_gpus() -> None:
    result = loader.load_paths([REPO / "rules"])
    assert result.ruleset is not None
    eng = engine.Engine(result.ruleset)
    assert eng.evaluate(T0) == []
    eng.ingest(frame("n", 0.0, gpus=0, expected=8))
    assert statuses(eng.evaluate(T0)) == {("gpu-missing", "n", None, "fired")}


def test_a_failing_rule_costs_one_tick_of_that_rule_not_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    text = (
        "rules:\n"
        "  - {id: broken, description: d, when: 'power_w > 1', severity: info}\n"
        "  - {id: fine, description: d, when: 'temp_c > 1', severity: info}\n"
    )
    eng = make_engine(text)
    real = evaluate.Evaluator.condition

    def flaky(self: evaluate.Evaluator, root: object, text: str) -> object:
        if text == "power_w > 1":
            raise RuntimeError("bug")
        return real(self, root, text)  # type: ignore[arg-type]

    monkeypatch.setattr(evaluate.Evaluator, "condition", flaky)
    eng.ingest(frame("n", 0.0, gpus=1))
    with structlog.testing.capture_logs() as logs:
        assert statuses(eng.evaluate(T0)) == {("fine", "n", 0, "fired")}
    assert eng.rule_errors == 1
    assert any(e["event"] == "rule_evaluation_failed" and e["rule_id"] == "broken" for e in logs)


def test_restored_event_firing_resolves_after_its_quiet_period() -> None:
    """A new process takes back an event rule's firing from the incident store: quiet since ``last``,
    it resolves on the rule's terms instead of staying open for ever."""
    text = (
        "rules:\n  - id: fatal\n    description: d\n    on_event: {kind: xid, xid: [79]}\n"
        "    severity: critical\n    actions: [cordon]\n    resolve: {for: 10m}\n"
    )
    eng = make_engine(text)
    assert eng.restore("fatal", "n", 2, since=T0, last=T0 + 60, evidence={"xid": 79})
    assert statuses(eng.evaluate(T0 + 600)) == {("fatal", "n", 2, "firing")}  # 9 min quiet
    eng.ingest_event(events.new("n", "xid", gpu_index=2, xid=79, ts=T0 + 610))
    assert statuses(eng.evaluate(T0 + 620)) == {("fatal", "n", 2, "firing")}, "a new event, not a new fire"
    assert statuses(eng.evaluate(T0 + 1210)) == {("fatal", "n", 2, "firing")}
    # 10 min after 620, when the evaluator saw the event (its own ts says 610: data, not time)
    assert statuses(eng.evaluate(T0 + 1220)) == {("fatal", "n", 2, "resolved")}
    assert not eng.restore("gone", "n", 2, since=T0, last=T0, evidence={})


def test_an_event_firing_is_not_quiet_until_the_events_backlog_is_read() -> None:
    """After a failover the new leader's first tick came before it had pulled the XIDs that arrived while
    nobody led: a firing restored with its last event 2 s old resolved at once (its quiet period 2 s),
    then the backlog reopened it as a new incident and its repair ran again. No event firing resolves
    while the backlog is unread; once read, quiet is judged as before."""
    text = (
        "rules:\n  - id: fatal\n    description: d\n    on_event: {kind: xid, xid: [79]}\n"
        "    severity: critical\n    actions: [cordon]\n    resolve: {for: 2s}\n"
    )
    eng = make_engine(text)
    eng.events_read = False  # what Leadership does at a takeover
    assert eng.restore("fatal", "n", 2, since=T0, last=T0, evidence={"xid": 79})
    assert statuses(eng.evaluate(T0 + 3)) == {("fatal", "n", 2, "firing")}, "not quiet: the backlog is unread"
    eng.ingest_event(events.new("n", "xid", gpu_index=2, xid=79, ts=T0 + 1))  # from the backlog
    eng.events_read = True  # the pull found the stream drained
    assert statuses(eng.evaluate(T0 + 4)) == {("fatal", "n", 2, "firing")}, (
        "the backlog's event, not a new fire"
    )
    assert statuses(eng.evaluate(T0 + 6)) == {("fatal", "n", 2, "resolved")}, "2 s after it was read"


def test_restored_condition_firing_waits_for_data_then_follows_the_resolve_condition() -> None:
    text = rule("temp_c > 85", extra="    for: 30s\n    resolve: {when: temp_c < 75, for: 20s}\n")
    eng = make_engine(text)
    assert eng.restore("r", "n", 0, since=T0 - 500, last=T0 - 100, evidence={"temp_c": 90.0})
    assert eng.evaluate(T0) == [], "no frame from the GPU yet: neither firing nor resolved"
    eng.ingest(frame("n", 10.0, gpus=1, temp_c=90))
    (still,) = eng.evaluate(T0 + 10)
    assert (still.status, still.since) == ("firing", T0 - 500), "still hot: the same firing, not a new one"
    seen = []
    for i, t in enumerate([70, 70, 70], start=2):
        eng.ingest(frame("n", i * 10.0, gpus=1, temp_c=t))
        seen.append([f.status for f in eng.evaluate(T0 + i * 10)])
    assert seen == [["firing"], ["firing"], ["resolved"]]  # 20 s below 75


def test_a_restored_firing_never_resolves_on_readings_from_before_the_restore() -> None:
    """The chaos run uncordoned a node with a live DBE: the standby that took over had lost the node's
    telemetry 20 s before the fault, still held its last healthy reading (fresh enough), and resolved
    the incident the old leader opened on it. Only a frame received after the restore may resolve it."""
    text = rule("ecc_dbe_volatile > 0", extra="    resolve: {when: ecc_dbe_volatile == 0, for: 0s}\n")
    eng = make_engine(text, stale_after_s=30.0)
    eng.ingest(frame("n", 0.0, gpus=1, ecc_dbe_volatile=0), at=T0)
    assert eng.evaluate(T0) == []
    assert eng.restore("r", "n", 0, since=T0 + 5, last=T0 + 9, evidence={"ecc_dbe_volatile": 1})
    assert eng.evaluate(T0 + 10) == [], "the healthy reading predates the incident: wait for a frame"
    eng.ingest(frame("n", 11.0, gpus=1, ecc_dbe_volatile=1), at=T0 + 11)
    (still,) = eng.evaluate(T0 + 11)
    assert (still.status, still.since) == ("firing", T0 + 5), "the same firing, neither resolved nor new"
    eng.ingest(frame("n", 12.0, gpus=1, ecc_dbe_volatile=0), at=T0 + 12)
    assert statuses(eng.evaluate(T0 + 12)) == {("r", "n", 0, "resolved")}, "a fresh healthy frame resolves"


def test_restored_condition_firing_that_cleared_while_down_resolves() -> None:
    eng = make_engine(rule("temp_c > 85"))
    eng.restore("r", "n", 0, since=T0 - 500, last=T0 - 100, evidence={})
    eng.ingest(frame("n", 0.0, gpus=1, temp_c=60))
    assert statuses(eng.evaluate(T0)) == {("r", "n", 0, "resolved")}


def test_a_firing_that_ended_while_its_condition_held_fires_again_only_after_it_was_false() -> None:
    """A DBE rule (``increase(...[10m]) > 0``) that resolves on ``ecc_dbe_volatile == 0``: the counter's
    step stays in the window for 10 minutes, and used to open a new incident on the next tick (a second
    cordon, a second reset). It fires again only once the condition has been false."""
    text = rule(
        "increase(ecc_dbe_volatile[10m]) > 0",
        extra="    resolve: {when: ecc_dbe_volatile == 0, for: 0s}\n",
    )
    eng = make_engine(text)
    seen = []
    for t, dbe in [(0, 0), (10, 1), (20, 0), (30, 0), (40, 0)]:
        eng.ingest(frame("n", float(t), gpus=1, ecc_dbe_volatile=dbe), at=T0 + t)
        seen.append(sorted(f.status for f in eng.evaluate(T0 + t)))
    assert seen == [[], ["fired"], ["resolved"], [], []], "no second firing on the same step"
    eng.ingest(frame("n", 700.0, gpus=1, ecc_dbe_volatile=0), at=T0 + 700)  # the step left the window
    assert eng.evaluate(T0 + 700) == []
    eng.ingest(frame("n", 710.0, gpus=1, ecc_dbe_volatile=1), at=T0 + 710)  # a new error
    assert [f.status for f in eng.evaluate(T0 + 710)] == ["fired"]


def test_a_released_firing_does_not_fire_again_on_the_same_evidence() -> None:
    """A recovery ladder closed the incident (``release``): the GPU was reset and validated, yet the
    DBE's step is still inside the rule's window. A new error after the condition cleared fires anew."""
    eng = make_engine(rule("increase(ecc_dbe_volatile[10m]) > 0"))
    eng.ingest(frame("n", 0.0, gpus=1, ecc_dbe_volatile=0), at=T0)
    eng.ingest(frame("n", 10.0, gpus=1, ecc_dbe_volatile=1), at=T0 + 10)
    assert [f.status for f in eng.evaluate(T0 + 10)] == ["fired"]
    eng.release("r", "n", 0)
    eng.ingest(frame("n", 20.0, gpus=1, ecc_dbe_volatile=0), at=T0 + 20)  # reset: the counter is 0 again
    assert eng.evaluate(T0 + 20) == [], "the old step is still in the window: not a new fault"
    eng.ingest(frame("n", 700.0, gpus=1, ecc_dbe_volatile=0), at=T0 + 700)
    assert eng.evaluate(T0 + 700) == []
    eng.ingest(frame("n", 710.0, gpus=1, ecc_dbe_volatile=1), at=T0 + 710)
    assert [f.status for f in eng.evaluate(T0 + 710)] == ["fired"]


def test_summary_is_the_gpus_telemetry_as_the_engine_holds_it() -> None:
    text = rule("temp_c > 85") + (
        "  - id: r2\n    description: hot for long\n    scope: gpu\n"
        "    when: max_over_time(temp_c[10m]) > 90\n    severity: warning\n"
    )
    eng = make_engine(text)
    for t in range(0, 120, 10):
        eng.ingest(frame("n", float(t), gpus=2, temp_c={0: 50, 1: 60 + t / 10}), at=T0 + t)
    assert eng.summary("n", 1, T0 + 115) == {"age_s": 5.0, "latest.temp_c": 71.0, "max_10m.temp_c": 71.0}
    assert eng.summary("n", 0, T0 + 115)["latest.temp_c"] == 50.0
    assert eng.summary("n", 5, T0 + 115) == {}, "no such GPU"
    assert eng.summary("elsewhere", 0, T0) == {}, "a node never seen"
