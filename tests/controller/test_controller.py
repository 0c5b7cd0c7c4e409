"""The controller against a real nats-server: faults become incidents and actions, safely."""

from __future__ import annotations

import asyncio
import json
import pathlib
import time
from collections.abc import MutableMapping
from typing import Any

import pytest
import structlog.testing

from healer import errors, testing
from healer.actuators import base as actuators
from healer.anomaly import scoring
from healer.bus import subjects
from healer.schemas import codec
from tests.conftest import sample, until
from tests.controller.conftest import DBE_RULES, Fleet, Harness, metric, run_until, warm

ROOT = pathlib.Path(__file__).resolve().parents[2]


async def test_new_dbe_opens_an_incident_then_acts_in_order(harness: Harness) -> None:
    actuator = testing.RecordingActuator()
    await harness.controller(actuator)
    fleet = Fleet(harness.bus, ["n1", "n2"])
    await warm(fleet)
    fleet.overrides[("n1", 1)] = {"ecc_dbe_volatile": 1}
    await run_until(fleet, lambda: len(harness.feed.changes("n1")) >= 3)
    assert harness.feed.changes("n1")[:3] == ["opened", "action", "action"]
    opened = harness.feed.events[0]
    assert opened.data.rule_id == "ecc-dbe"
    assert opened.data.gpu_index == 1
    assert opened.subject == "node/n1/gpu/1"
    assert opened.data.evidence
    assert [(r.kind, r.node) for r in actuator.executed()] == [("cordon", "n1"), ("migrate", "n1")]
    assert all(r.fencing_token >= 1 for r in actuator.requests)
    action = harness.feed.events[2].data
    assert [(a.kind, a.status) for a in action.actions] == [("cordon", "done"), ("migrate", "done")]
    assert harness.feed.changes("n2") == []


async def test_dry_run_makes_the_same_decisions_and_touches_nothing(harness: Harness) -> None:
    actuator = testing.RecordingActuator()
    await harness.controller(actuator, mode="dry-run")
    fleet = Fleet(harness.bus, ["n1"])
    fleet.overrides[("n1", 0)] = {"ecc_dbe_volatile": 0}
    await warm(fleet)
    fleet.overrides[("n1", 0)] = {"ecc_dbe_volatile": 2}
    await run_until(fleet, lambda: len(harness.feed.changes("n1")) >= 3)
    assert harness.feed.changes("n1")[:3] == ["opened", "action", "action"]
    assert actuator.executed() == []
    assert [r.kind for r in actuator.requests] == ["cordon", "migrate"]
    assert all(r.dry_run for r in actuator.requests)
    last = harness.feed.events[2].data
    assert last.mode == "dry-run"
    assert [a.status for a in last.actions] == ["planned", "planned"]


async def test_incident_resolves_and_undoes_healers_own_cordon(harness: Harness) -> None:
    actuator = testing.RecordingActuator()
    await harness.controller(actuator)
    fleet = Fleet(harness.bus, ["n1"])
    await warm(fleet)
    fleet.overrides[("n1", 0)] = {"ecc_dbe_volatile": 1}
    await run_until(fleet, lambda: "action" in harness.feed.changes())
    fleet.overrides[("n1", 0)] = {"ecc_dbe_volatile": 0}  # the GPU was reset
    await run_until(fleet, lambda: len(actuator.executed("uncordon")) == 1)
    assert "resolved" in harness.feed.changes("n1")


async def test_restarted_controller_resumes_without_repeating_actions(harness: Harness) -> None:
    actuator = testing.RecordingActuator()
    first = await harness.controller(actuator)
    fleet = Fleet(harness.bus, ["n1"])
    await warm(fleet)
    fleet.overrides[("n1", 0)] = {"ecc_dbe_volatile": 1}
    await run_until(fleet, lambda: len(actuator.executed()) == 2)
    incident_id = harness.feed.events[0].data.incident_id
    await harness.crash(first)
    second = await harness.controller(actuator)
    await run_until(fleet, lambda: second.leader and bool(second.book.open), timeout=20)
    assert [i.id for i in second.book.open.values()] == [incident_id]
    for _ in range(10):
        await fleet.publish()
        await asyncio.sleep(0.2)
    assert len(actuator.executed()) == 2, "the new controller must not act again"
    assert harness.feed.changes("n1").count("opened") == 1


async def test_standby_takes_over_within_the_lease_ttl_and_old_token_is_stale(harness: Harness) -> None:
    actuator = testing.RecordingActuator()
    a = await harness.controller(actuator)
    fleet = Fleet(harness.bus, ["n1", "n2"])
    await run_until(fleet, lambda: a.leader)
    b = await harness.controller(actuator)
    await warm(fleet)
    assert not b.leader
    old_token = a.lease.token
    assert old_token is not None
    await harness.crash(a)
    loop = asyncio.get_running_loop()
    crashed_at = loop.time()
    await run_until(fleet, lambda: b.leader, timeout=10)
    assert loop.time() - crashed_at < 3 * 2.0, "standby must lead within about the lease TTL"
    assert b.lease.token is not None
    assert b.lease.token > old_token
    fleet.overrides[("n2", 1)] = {"ecc_dbe_volatile": 1}
    await run_until(fleet, lambda: len(actuator.executed()) == 2)
    for _ in range(5):
        await fleet.publish()
        await asyncio.sleep(0.2)
    assert [(r.kind, r.node, r.fencing_token) for r in actuator.executed()] == [
        ("cordon", "n2", b.lease.token),
        ("migrate", "n2", b.lease.token),
    ]


async def test_mass_fault_trips_the_breaker_and_stops(harness: Harness) -> None:
    actuator = testing.RecordingActuator()
    ctl = await harness.controller(actuator, breaker_max_percent=10.0)
    nodes = [f"n{i:02d}" for i in range(20)]
    fleet = Fleet(harness.bus, nodes)
    await run_until(fleet, lambda: len(ctl.nodes) == 20)
    for node in nodes[:12]:  # 60 % of the fleet
        fleet.overrides[(node, 0)] = {"ecc_dbe_volatile": 1}
    await run_until(fleet, lambda: any(e.data.rule_id == "circuit-breaker" for e in harness.feed.events))
    for _ in range(10):
        await fleet.publish()
        await asyncio.sleep(0.2)
    cordoned = {r.node for r in actuator.executed("cordon")}
    assert len(cordoned) == 2, "10 % of 20 nodes"
    breaker_events = [e for e in harness.feed.events if e.data.rule_id == "circuit-breaker"]
    assert len(breaker_events) == 1
    assert breaker_events[0].change == "escalated"
    assert breaker_events[0].data.severity == "critical"
    refused = [
        e for e in harness.feed.events if e.change == "action" and e.data.actions[0].status == "refused"
    ]
    assert refused, "the actions past the limit are refused and published"
    status = await ctl.breaker.status()
    assert status["open"] is True
    await ctl.breaker.reset(by="test")
    assert (await ctl.breaker.status())["open"] is False


async def test_excluded_node_gets_incidents_but_no_actions(harness: Harness) -> None:
    actuator = testing.RecordingActuator()
    ctl = await harness.controller(actuator)
    await ctl.exclusions.add("n1", by="test", reason="firmware upgrade")
    fleet = Fleet(harness.bus, ["n1"])
    await run_until(fleet, lambda: ctl.leader and "n1" in ctl.exclusions.nodes)
    fleet.overrides[("n1", 0)] = {"ecc_dbe_volatile": 1}
    await run_until(fleet, lambda: "action" in harness.feed.changes("n1"))
    assert actuator.executed() == []
    first = next(e for e in harness.feed.events if e.change == "action")
    assert first.data.actions[0].status == "skipped"
    assert "firmware upgrade" in first.data.actions[0].detail


async def test_broken_rule_file_is_rejected_and_old_rules_stay(harness: Harness) -> None:
    from healer.bus import base

    rejected: list[bytes] = []

    async def on_rejected(msg: base.Msg) -> None:
        rejected.append(msg.data)

    await harness.bus.subscribe("healer.incidents.rules.rejected", on_rejected)
    actuator = testing.RecordingActuator()
    ctl = await harness.controller(actuator)
    fleet = Fleet(harness.bus, ["n1"])
    await run_until(fleet, lambda: ctl.leader)
    (harness.rules / "broken.yaml").write_text("rules:\n  - id: x\n    scope: gpu\n    when: temp_c >>> 3\n")
    await run_until(fleet, lambda: bool(rejected))
    assert b"broken.yaml" in rejected[0]
    assert metric(ctl.metrics, "rules_rejected_total") == 1
    fleet.overrides[("n1", 0)] = {"ecc_dbe_volatile": 1}
    await run_until(fleet, lambda: len(actuator.executed()) == 2)


async def test_two_shards_split_the_fleet_each_with_its_own_lease(harness: Harness) -> None:
    from healer.controller.core import service

    actuators = [testing.RecordingActuator(), testing.RecordingActuator()]
    shards = [
        await harness.controller(actuators[i], shards=2, shard=i, breaker_max_percent=50) for i in range(2)
    ]
    nodes = [f"node-{i:02d}" for i in range(8)]
    owner = {n: service.shard_of(n, 2) for n in nodes}
    assert set(owner.values()) == {0, 1}, "the test needs nodes on both shards"
    fleet = Fleet(harness.bus, nodes)
    await run_until(fleet, lambda: all(s.leader for s in shards))
    await warm(fleet)
    faulty = [next(n for n in nodes if owner[n] == 0), next(n for n in nodes if owner[n] == 1)]
    for node in faulty:
        fleet.overrides[(node, 0)] = {"ecc_dbe_volatile": 1}
    await run_until(fleet, lambda: all(len(a.executed("cordon")) == 1 for a in actuators))
    for i in range(2):
        assert [r.node for r in actuators[i].executed("cordon")] == [faulty[i]]
        assert shards[i].nodes == {n for n in nodes if owner[n] == i}
    assert shards[0].lease.key != shards[1].lease.key
    status = await shards[0].breaker.status()
    assert sorted(e[0] for e in status["entries"]) == sorted(faulty), "one breaker, shared through KV"


async def test_repeat_faults_count_episodes_not_rules(harness: Harness) -> None:
    ctl = await harness.controller(testing.RecordingActuator())
    t = 1_000_000.0
    # one DBE fires three rules within seconds: one episode
    assert [await ctl.incidents.count_repeat("n1", 2, t + dt) for dt in (0, 2, 5)] == [1, 1, 1]
    assert await ctl.incidents.count_repeat("n1", 2, t + 300) == 2
    assert await ctl.incidents.count_repeat("n1", 2, t + 900) == 3
    assert await ctl.incidents.count_repeat("n1", 2, t + 900 + ctl.cs.repeat_window_s) == 1, (
        "old episodes age out"
    )
    assert await ctl.incidents.count_repeat("n1", None, t) == 0, "node-level incidents are not GPU faults"


async def test_anomaly_scores_reach_the_rules_in_batches(harness: Harness) -> None:
    """The scorer sees every frame (cheap observe) and is asked for one batch per interval; its scores
    are what `anomaly_score` reads."""

    class FakeScorer:
        """Stands in for healer.anomaly.scoring.Scorer: scores GPU 1 of n1 as anomalous."""

        def __init__(self) -> None:
            self.observed = 0
            self.batches = 0
            self.last_cost_s = 0.001

        def observe(self, frame: object, at: float | None = None) -> None:
            self.observed += 1

        def score(self, now: float) -> dict[str, dict[int, float]]:
            self.batches += 1
            return {"n1": {0: 0.1, 1: 0.97}}

    (harness.rules / "anomaly.yaml").write_text(
        "rules:\n  - id: anomalous\n    description: model says so\n    scope: gpu\n"
        "    when: anomaly_score >= 0.9\n    severity: warning\n    actions: [notify]\n"
    )
    ctl = await harness.controller(testing.RecordingActuator(), anomaly_interval_s=0.5)
    scorer = FakeScorer()
    ctl.learning.scorer = scorer  # type: ignore[assignment]
    fleet = Fleet(harness.bus, ["n1", "n2"])
    await run_until(fleet, lambda: "opened" in harness.feed.changes("n1"))
    opened = next(e for e in harness.feed.events if e.change == "opened")
    assert (opened.data.rule_id, opened.data.node, opened.data.gpu_index) == ("anomalous", "n1", 1)
    assert scorer.observed >= 2
    assert 1 <= scorer.batches < scorer.observed, "scored in batches, not per frame"
    assert metric(ctl.metrics, "anomaly_score_seconds_sum") > 0


async def test_a_model_that_does_not_load_leaves_the_controller_running(harness: Harness) -> None:
    broken = harness.tmp / "model"
    broken.mkdir()
    (broken / "card.json").write_text("{}")
    ctl = await harness.controller(testing.RecordingActuator(), model=str(broken))
    assert metric(ctl.metrics, "anomaly_model_loaded") == 0
    fleet = Fleet(harness.bus, ["n1"])
    await warm(fleet)
    fleet.overrides[("n1", 0)] = {"ecc_dbe_volatile": 1}
    await run_until(fleet, lambda: "opened" in harness.feed.changes("n1"))


async def test_the_default_model_loads_and_scores(harness: Harness) -> None:
    model = ROOT / "models" / "default"
    ctl = await harness.controller(testing.RecordingActuator(), model=str(model), anomaly_interval_s=0.5)
    assert metric(ctl.metrics, "anomaly_model_loaded") == 1
    fleet = Fleet(harness.bus, ["n1"])
    await run_until(fleet, lambda: metric(ctl.metrics, "anomaly_score_seconds_sum") > 0)


async def test_the_model_compares_each_node_with_the_nodes_of_its_cooling_domain(
    harness: Harness, tmp_path: pathlib.Path
) -> None:
    """The admitted fleet's cooling domains (a CDU where the inventory names one, else the rack) reach
    the anomaly model's thermal peers, and follow the inventory when it changes."""
    inventory = tmp_path / "nodes.yaml"
    inventory.write_text(
        "nodes:\n  n1: {rack: r1, cdu: c1}\n  n2: {rack: r1}\n  n3: {rack: r2, pdu: p1}\n  n4: {pdu: p1}\n"
    )
    model = ROOT / "models" / "default"
    ctl = await harness.controller(
        testing.RecordingActuator(),
        model=str(model),
        admission="file",
        inventory_file=str(inventory),
        reload_check_s=0.1,
    )
    scorer = ctl.learning.learning_scorer()
    assert scorer is not None
    await until(lambda: bool(scorer.thermal.domains))
    assert scorer.thermal.domains == {"n1": "cdu=c1", "n2": "rack=r1", "n3": "rack=r2"}
    inventory.write_text("nodes:\n  n1: {rack: r1, cdu: c1}\n  n2: {rack: r3}\n")
    await until(lambda: scorer.thermal.domains == {"n1": "cdu=c1", "n2": "rack=r3"}, timeout=20)


async def test_what_the_model_learned_survives_a_restart_and_each_gpu_explains_itself(
    harness: Harness,
) -> None:
    """The leader saves the model's learned state to KV (every ``anomaly_save_s`` and at shutdown); the
    next controller starts from it instead of warming up again. Each scored GPU's components are there
    for the status page."""
    model = str(ROOT / "models" / "default")
    first = await harness.controller(testing.RecordingActuator(), model=model, anomaly_interval_s=0.5)
    fleet = Fleet(harness.bus, ["n1", "n2"])
    await run_until(fleet, lambda: first.leader and first.components("n1", 0) is not None, timeout=30)
    comps = first.components("n1", 0)
    assert comps is not None
    assert 0.0 <= comps["anomaly_score"] <= 1.0
    assert {"forest", "counters"} <= set(comps), comps
    assert first.components("n9", 0) is None, "a node never scored has no components"
    assert isinstance(first.learning.scorer, scoring.Scorer)
    learned = first.learning.scorer.export_state()
    assert {"n1", "n2"} <= set(learned["nodes"])
    await first.stop()
    saved = await first.state.get("anomaly.state")
    assert saved is not None
    assert saved.value["nodes"] == len(learned["nodes"])
    with structlog.testing.capture_logs() as logs:
        second = await harness.controller(testing.RecordingActuator(), model=model, anomaly_interval_s=0.5)
    restored = [e for e in logs if e["event"] == "controller.anomaly_state_restored"]
    assert [e["nodes"] for e in restored] == [len(learned["nodes"])]
    assert isinstance(second.learning.scorer, scoring.Scorer)
    assert set(second.learning.scorer.export_state()["nodes"]) >= {"n1", "n2"}


async def test_an_anomaly_incident_says_which_component_and_against_what(harness: Harness) -> None:
    from healer.anomaly import scoring

    class Explaining(scoring.Scorer):
        """The real Scorer's explain contract with fixed scores (GPU 1 of n1 anomalous)."""

        def __init__(self) -> None:
            self.last_cost_s = 0.0
            self.cfar = None  # no calibration: no pools, no shadow would-be incidents
            self.shadow_events = []

        def observe(self, frame: object, at: float | None = None) -> None:
            pass

        def score(self, now: float) -> dict[str, dict[int, float]]:
            return {"n1": {0: 0.1, 1: 0.97}}

        def export_state(self) -> dict[str, object]:
            return {"format": "test", "nodes": {}}

        def explain(self, node: str, gpu: int) -> dict[str, float | str]:
            against = scoring.AGAINST["thermal_rise"]
            return {"anomaly_score": 0.97, "component": "thermal_rise", "against": against,
                    "component_thermal_rise": 1.4, "residual_c": 6.5}  # fmt: skip

    (harness.rules / "anomaly.yaml").write_text(
        "rules:\n  - id: anomalous\n    description: model says so\n    scope: gpu\n"
        "    when: anomaly_score >= 0.9\n    severity: warning\n    actions: [notify]\n"
    )
    ctl = await harness.controller(testing.RecordingActuator(), anomaly_interval_s=0.5)
    ctl.learning.scorer = Explaining()
    fleet = Fleet(harness.bus, ["n1"])
    await run_until(fleet, lambda: "opened" in harness.feed.changes("n1"))
    opened = next(e for e in harness.feed.events if e.change == "opened")
    assert opened.data.evidence["anomaly.component"] == "thermal_rise"
    assert opened.data.evidence["anomaly.against"] == "its own baseline at its node's inlet"
    assert opened.data.evidence["anomaly.residual_c"] == 6.5


@pytest.mark.usefixtures("frame_decoder")
async def test_bad_frames_are_counted_and_lax_frames_still_act(harness: Harness) -> None:
    """Malformed frames are counted by reason and change nothing; a frame that is valid only after
    pydantic's coercion (the strict fast decoder refuses it) is still ingested, and counted as lax."""
    ctl = await harness.controller(testing.RecordingActuator())
    fleet = Fleet(harness.bus, ["n1"])
    await warm(fleet)
    subject = subjects.Subjects().telemetry("n1")
    good = json.loads(codec.encode(fleet.frame("n1")))
    await harness.bus.publish(subject, b"{not json")
    await harness.bus.publish(subject, json.dumps({**good, "schema": "healer.telemetry.v9"}).encode())
    await harness.bus.publish(subject, json.dumps({**good, "seq": -1}).encode())
    lax = {**good, "ts": time.time(), "seq": float(good["seq"] + 1)}  # 12.0 for an integer: lax
    lax["gpus"][1]["ecc_dbe_volatile"] = 1
    await harness.bus.publish(subject, json.dumps(lax).encode())
    await until(lambda: "opened" in harness.feed.changes("n1"))
    errors_by = {
        s.labels["reason"]: s.value
        for s in next(iter(ctl.metrics.decode_errors.collect())).samples
        if s.name.endswith("_total") and s.labels["kind"] == "frame"
    }
    assert errors_by == {"too_large": 0, "json": 1, "schema_version": 1, "validation": 1}
    assert metric(ctl.metrics, "frames_lax_total") == 1
    assert harness.feed.events[0].data.gpu_index == 1


async def test_a_full_frame_backlog_drops_frames_and_counts_every_one(harness: Harness) -> None:
    """A node whose frames come faster than they are ingested loses its own oldest ones (the fair
    backlog keeps ``frames_per_node`` of them, within ``frames_buffer_mib``); each one is counted, none
    silently lost: ingested + dropped == published, and the log's last ``controller.frames_dropped``
    line says the metric's total. (A 5 KB buffer holds two 2-GPU frames; a burst of 300 arrives in
    socket reads of many frames each, faster than the handler can run in between.)"""
    ctl = await harness.controller(testing.RecordingActuator(), frames_buffer_mib=0.005)
    fleet = Fleet(harness.bus, ["n1"])
    subject = subjects.Subjects().telemetry("n1")
    frames = []
    for _ in range(300):
        fleet.seq += 1
        frames.append(codec.encode(fleet.frame("n1")))

    def accounted() -> float:
        return metric(ctl.metrics, "frames_ingested_total") + sample(
            ctl.metrics.registry, "healer_controller_frames_dropped_total"
        )

    with structlog.testing.capture_logs() as logs:
        for data in frames:
            await harness.bus.publish(subject, data)
        await harness.bus.flush()
        await until(lambda: accounted() == 300)
        dropped = metric(ctl.metrics, "frames_dropped_total")

        def told() -> list[MutableMapping[str, Any]]:
            return [e for e in logs if e["event"] == "controller.frames_dropped"]

        await until(lambda: bool(told()) and told()[-1]["dropped_total"] == dropped)
    assert dropped > 1
    assert len(told()) <= 2, "a line at the first drop and one when they stop, not one per frame"
    assert ctl.ingest.frames_sub.dropped == dropped


async def test_incidents_from_before_a_restart_resolve_on_their_rules_terms(harness: Harness) -> None:
    """A new process knows the open incidents from KV; the engine takes their firings back, so an event
    rule's incident resolves after its quiet period and a condition rule's when its resolve condition
    holds on fresh data, even if the fault cleared while no controller ran."""
    from healer.schemas import events

    (harness.rules / "xid.yaml").write_text(
        "rules:\n  - id: xid-fatal\n    description: fatal XID\n    on_event: {kind: xid, xid: [79]}\n"
        "    severity: critical\n    actions: [notify]\n    resolve: {for: 4s}\n"
    )
    actuator = testing.RecordingActuator()
    first = await harness.controller(actuator)
    fleet = Fleet(harness.bus, ["n1", "n2"])
    await warm(fleet)
    fleet.overrides[("n1", 0)] = {"ecc_dbe_volatile": 1}
    event = events.new("n2", "xid", gpu_index=1, xid=79, message="fallen off the bus")
    await harness.bus.publish_durable(subjects.Subjects().events("n2"), codec.encode(event), msg_id=event.id)
    await run_until(
        fleet, lambda: {"n1", "n2"} <= {e.data.node for e in harness.feed.events if e.change == "opened"}
    )
    await harness.crash(first)
    fleet.overrides[("n1", 0)] = {"ecc_dbe_volatile": 0}  # cleared while no controller ran
    second = await harness.controller(actuator)
    await run_until(
        fleet, lambda: {"n1", "n2"} <= {e.data.node for e in harness.feed.events if e.change == "resolved"}
    )
    assert not second.book.open
    resolved = {e.data.node: e.data.rule_id for e in harness.feed.events if e.change == "resolved"}
    assert resolved == {"n1": "ecc-dbe", "n2": "xid-fatal"}


class LabelledScheduler(testing.RecordingActuator):
    """A RecordingActuator that also answers node_labels, as the Slurm and Kubernetes actuators do."""

    def __init__(self, labels: dict[str, dict[str, str]]) -> None:
        super().__init__()
        self.labels = labels
        self.asked = 0
        self.broken = False

    async def node_labels(self, nodes: list[str]) -> dict[str, dict[str, str]]:
        self.asked += 1
        if self.broken:
            raise errors.TemporaryError("scheduler unreachable")
        return {n: self.labels[n] for n in nodes if n in self.labels}


async def test_rules_match_node_labels_read_from_the_scheduler(harness: Harness) -> None:
    (harness.rules / "dbe.yaml").write_text(
        DBE_RULES.replace("    scope: gpu\n", "    scope: gpu\n    match: {labels: {pool: train*}}\n")
    )
    scheduler = LabelledScheduler({"n1": {"pool": "training"}, "n2": {"pool": "inference"}})
    ctl = await harness.controller(scheduler, labels_refresh_s=0.3)
    fleet = Fleet(harness.bus, ["n1", "n2"])
    await run_until(fleet, lambda: scheduler.asked >= 2)
    await warm(fleet)
    fleet.overrides[("n1", 0)] = {"ecc_dbe_volatile": 1}
    fleet.overrides[("n2", 0)] = {"ecc_dbe_volatile": 1}
    await run_until(fleet, lambda: "opened" in harness.feed.changes("n1"))
    for _ in range(5):
        await fleet.publish()
        await asyncio.sleep(0.2)
    assert harness.feed.changes("n2") == [], "n2 is not in a train* pool"
    scheduler.broken = True
    failures = metric(ctl.metrics, "label_refresh_failures_total")
    await run_until(
        fleet,
        lambda: metric(ctl.metrics, "label_refresh_failures_total") > failures,
    )
    assert ctl.engine is not None
    n1 = ctl.engine.state.node_index("n1")
    assert n1 is not None
    assert ctl.engine.state.labels[n1] == {"pool": "training"}, "kept"


class BuggyActuator(testing.RecordingActuator):
    """An actuator with a bug: ``apply`` raises (a real one never does)."""

    async def apply(self, request: actuators.ActionRequest) -> actuators.ActionOutcome:
        raise RuntimeError("bug in the actuator")


async def test_a_bug_in_an_action_task_is_logged_once_and_counted(harness: Harness) -> None:
    ctl = await harness.controller(BuggyActuator())
    fleet = Fleet(harness.bus, ["n1"])
    await warm(fleet)

    def failed() -> float:
        return (
            ctl.metrics.registry.get_sample_value(
                "healer_controller_task_failures_total", {"task": "actions"}
            )
            or 0.0
        )

    with structlog.testing.capture_logs() as logs:
        fleet.overrides[("n1", 0)] = {"ecc_dbe_volatile": 1}
        await run_until(fleet, lambda: failed() >= 1)
        count = failed()  # read with the logs, no await between: counting and logging happen together
        reported = [e for e in logs if e["event"] == "controller.task_failed" and e["task"] == "actions"]
    assert reported, "the bug is logged"
    assert all("bug in the actuator" in e["error"] and e["incident_id"] for e in reported)
    assert len(reported) == count, "each failure logged once and counted once"
