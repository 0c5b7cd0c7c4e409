"""Condition rules evaluated as frames arrive (``Engine.evaluate_frames``): only the rules without ``for``,
only the nodes whose frames arrived, and exactly the ``fired`` transitions the next tick would report."""

from __future__ import annotations

import pathlib
from typing import Any

import hypothesis
import hypothesis.strategies as st

from healer.rules import engine
from healer.schemas import fabric, telemetry
from healer.telemetry import rdma
from tests.rules.rules_helpers import T0, frame, make_engine, rule

FIXTURES = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "sysfs"

PACK = """
rules:
  - id: hot
    scope: gpu
    when: temp_c > 80
    severity: warning
    cooldown: 3s
  - id: dbe
    scope: gpu
    when: increase(ecc_dbe_volatile[1m]) > 0
    severity: critical
  - id: node-hot
    scope: node
    when: count(temp_c > 85) >= 2
    severity: major
  - id: power
    scope: gpu
    when: power_w > 700
    resolve: {when: power_w < 300}
    severity: warning
  - id: slow-hot
    scope: gpu
    when: temp_c > 80
    for: 2s
    severity: warning
"""


def keys(firings: list[engine.Firing], status: str | None = None) -> set[engine.Key]:
    return {f.key for f in firings if status is None or f.status == status}


def test_a_prompt_rule_fires_at_arrival_and_the_tick_reports_it_ongoing() -> None:
    eng = make_engine(PACK)
    eng.ingest(frame("n", 0.0, ecc_dbe_volatile=0), at=T0)
    assert eng.evaluate(T0) == []
    eng.ingest(frame("n", 0.3, ecc_dbe_volatile={1: 2}), at=T0 + 0.3)
    (fired,) = eng.evaluate_frames(T0 + 0.35)
    assert (fired.key, fired.status, fired.since) == (("dbe", "n", 1, None), "fired", T0 + 0.35)
    assert fired.evidence["increase(ecc_dbe_volatile[1m])"] == 2.0
    assert fired.gpu_uuid == "GPU-n-1"
    assert eng.evaluate_frames(T0 + 0.4) == []  # nothing arrived since
    tick = eng.evaluate(T0 + 1.0)
    assert [(f.key, f.status, f.since) for f in tick] == [(("dbe", "n", 1, None), "firing", T0 + 0.35)]


def test_only_the_nodes_whose_frames_arrived_are_read() -> None:
    eng = make_engine(rule("temp_c > 80"))
    eng.ingest(frame("a", 0.0, temp_c=50), at=T0)
    eng.ingest(frame("b", 0.0, temp_c=50), at=T0)
    eng.evaluate(T0)
    eng.ingest(frame("b", 0.5, temp_c={0: 90}), at=T0 + 0.5)
    assert keys(eng.evaluate_frames(T0 + 0.5)) == {("r", "b", 0, None)}
    # a reading that holds on a node with no new frame is read by the tick, not by an arrival
    eng.ingest(frame("a", 0.6, temp_c={1: 95}), at=T0 + 0.6)
    eng.state.flush()
    eng.state.take_arrived()
    assert eng.evaluate_frames(T0 + 0.7) == []
    assert keys(eng.evaluate(T0 + 1.0), "fired") == {("r", "a", 1, None)}


def test_a_rule_with_for_waits_for_the_tick() -> None:
    eng = make_engine(PACK)
    eng.ingest(frame("n", 0.0, temp_c=50), at=T0)
    eng.evaluate(T0)
    eng.ingest(frame("n", 0.2, temp_c={0: 82}), at=T0 + 0.2)
    assert keys(eng.evaluate_frames(T0 + 0.2)) == {("hot", "n", 0, None)}
    assert keys(eng.evaluate(T0 + 1.0), "fired") == set()  # slow-hot is pending: 2 s to go
    assert keys(eng.evaluate(T0 + 3.0), "fired") == {("slow-hot", "n", 0, None)}


def test_a_cooling_down_target_fires_at_arrival_only_once_its_cooldown_ended() -> None:
    eng = make_engine(PACK)
    eng.ingest(frame("n", 0.0, temp_c={0: 90}), at=T0)
    assert keys(eng.evaluate(T0), "fired") >= {("hot", "n", 0, None)}
    eng.ingest(frame("n", 1.0, temp_c=50), at=T0 + 1)
    assert ("hot", "n", 0, None) in keys(eng.evaluate(T0 + 1), "resolved")
    eng.ingest(frame("n", 2.0, temp_c={0: 90}), at=T0 + 2)
    assert eng.evaluate_frames(T0 + 2) == []  # cooling down until T0 + 4
    eng.ingest(frame("n", 4.5, temp_c={0: 90}), at=T0 + 4.5)
    assert keys(eng.evaluate_frames(T0 + 4.5)) == {("hot", "n", 0, None)}


def test_an_ended_firing_whose_condition_held_waits_to_be_seen_false_first() -> None:
    eng = make_engine(rule("temp_c > 80"))
    eng.ingest(frame("n", 0.0, temp_c={0: 90}), at=T0)
    eng.evaluate(T0)
    eng.release("r", "n", 0)  # a ladder closed the incident; the reading still holds
    eng.ingest(frame("n", 0.5, temp_c={0: 90}), at=T0 + 0.5)
    assert eng.evaluate_frames(T0 + 0.5) == []
    eng.ingest(frame("n", 0.7, temp_c={0: 50}), at=T0 + 0.7)
    assert eng.evaluate_frames(T0 + 0.7) == []  # seen false: armed again
    eng.ingest(frame("n", 0.9, temp_c={0: 90}), at=T0 + 0.9)
    assert keys(eng.evaluate_frames(T0 + 0.9)) == {("r", "n", 0, None)}


def test_a_restored_firing_is_not_fired_again_at_arrival() -> None:
    eng = make_engine(rule("temp_c > 80"))
    assert eng.restore("r", "n", 0, since=T0 - 60, last=T0 - 60, evidence={})
    eng.ingest(frame("n", 0.0, temp_c={0: 90}), at=T0)
    assert eng.evaluate_frames(T0) == []
    tick = eng.evaluate(T0 + 1)
    assert [(f.key, f.status, f.since) for f in tick] == [(("r", "n", 0, None), "firing", T0 - 60)]


def test_a_port_rule_fires_at_arrival_naming_its_port(tmp_path: pathlib.Path) -> None:
    eng = make_engine(
        "rules:\n  - id: down\n    scope: port\n    when: port_state != 4\n    severity: major\n"
    )
    root = rdma.write_tree((FIXTURES / "cx7-ib-healthy.txt").read_text(), tmp_path / "t")
    ports = rdma.PortReader(root).read()

    def frame_with(ps: list[fabric.PortSample], ts: float) -> telemetry.NodeFrame:
        return telemetry.NodeFrame(
            node="n", ts=ts, seq=0, boot_id="b", agent_version="t", source="replay", gpus=[], ports=ps,
            schema=telemetry.SCHEMA_V2,
        )  # fmt: skip

    eng.ingest(frame_with(ports, T0), at=T0)
    assert eng.evaluate(T0) == []
    broken = [p.model_copy(update={"state": 1}) if p.device == "mlx5_3" else p for p in ports]
    eng.ingest(frame_with(broken, T0 + 0.5), at=T0 + 0.5)
    (fired,) = eng.evaluate_frames(T0 + 0.5)
    assert (fired.rule_id, fired.port, fired.status) == ("down", "mlx5_3/1", "fired")


READINGS = st.fixed_dictionaries(
    {
        "temp_c": st.sampled_from([50.0, 82.0, 90.0, None]),
        "power_w": st.sampled_from([100.0, 400.0, 750.0]),
        "ecc_dbe_volatile": st.integers(0, 3),
    }
)


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(
    st.lists(  # per tick, per arrival: which node sends which GPU 0 / GPU 1 readings
        st.lists(st.tuples(st.sampled_from("abc"), READINGS, READINGS), max_size=4), min_size=1, max_size=12
    )
)
def test_arrivals_then_tick_report_what_the_tick_alone_would(ticks: list[Any]) -> None:
    """Two engines fed the same frames: one evaluates arrivals at the tick's clock before each tick,
    the other only ticks. What the first fires at arrival the second fires at the tick, the rest of
    every tick is the same, and so is each target's state after."""
    both, alone = make_engine(PACK), make_engine(PACK)
    ecc: dict[str, int] = {}
    for k, sends in enumerate(ticks):
        now = T0 + k
        for node, g0, g1 in sends:
            ecc[node] = ecc.get(node, 0) + g0["ecc_dbe_volatile"]
            per_gpu: dict[str, Any] = {name: {0: g0[name], 1: g1[name]} for name in ("temp_c", "power_w")}
            f = frame(node, k, ecc_dbe_volatile={0: ecc[node], 1: ecc[node]}, **per_gpu)
            both.ingest(f, at=now)
            alone.ingest(f, at=now)
        early = both.evaluate_frames(now)
        assert {f.status for f in early} <= {"fired"}
        assert all(f.rule_id != "slow-hot" for f in early)  # a rule with ``for`` waits for the tick
        tick_both, tick_alone = both.evaluate(now), alone.evaluate(now)
        want = {(f.key, f.status, f.since) for f in tick_alone}
        got = {(f.key, "fired" if f.key in keys(early) else f.status, f.since) for f in tick_both}
        got |= {(f.key, f.status, f.since) for f in early if f.key not in keys(tick_both)}
        assert got == want
        for rule_id, track in alone._tracks.items():
            other = both._tracks[rule_id]
            assert (track.state == other.state).all()
            assert (track.rearm == other.rearm).all()
