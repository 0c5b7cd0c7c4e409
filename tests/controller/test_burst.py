"""A burst of fatal faults (#43): the breaker decides a batch of asks exactly as one admission each would,
and a burst past the shipped breaker, on the memory bus, trips it at its limit once, with one breaker
incident, and loses no fault."""

from __future__ import annotations

import asyncio
import pathlib
import random
import types
from typing import Any

import yaml

from healer import config, errors, testing
from healer.bus import subjects
from healer.controller.core import service
from healer.controller.incidents import book, feed_publisher, gates
from healer.controller.inventory import blast, topology
from healer.controller.remediation import breaker_batch, healing
from healer.controller.store import kv
from healer.schemas import codec, events
from healer.schemas import incidents as incidents_schema
from tests import conftest

RULES = pathlib.Path(__file__).resolve().parents[2] / "rules"

RACKS = topology.Topology({f"n{i}": {"rack": f"r{i // 4}"} for i in range(16)})


def _fold(
    state: dict[str, Any], asks: list[breaker_batch.Ask], now: float, cs: config.ControllerSettings
) -> tuple[list[gates.BreakerAdmission], dict[str, Any] | None]:
    """One ``gates.breaker_admission`` per ask, each against the document the one before wrote."""
    out, written = [], None
    for a in asks:
        adm = gates.breaker_admission(state, a.node, a.fleet_size, a.incident_id, now, cs, a.domains)
        out.append(adm)
        if adm.state is not None:
            state = written = adm.state
    return out, written


def _verdict(a: gates.BreakerAdmission) -> tuple[Any, ...]:
    return (a.allowed, a.reason, a.tripped, a.held)


def test_a_batch_gets_the_verdicts_one_admission_per_ask_would_get() -> None:
    rng = random.Random(43)
    for trial in range(300):
        limits = rng.choice([{}, {"rack": {"max_nodes": 2}}, {"rack": {"max_percent": 50}}])
        cs = config.ControllerSettings.model_validate(
            {"breaker_max_nodes": rng.randint(1, 10), "breaker_max_percent": 100.0,
             "breaker_window_s": 600.0, "domain_limits": limits}
        )  # fmt: skip
        entries = [
            [f"n{rng.randrange(16)}", rng.choice([0.0, 900.0]), "old"] for _ in range(rng.randrange(5))
        ]
        state: dict[str, Any] = {
            "open": rng.random() < 0.1,
            "entries": entries,
            "opened_at": 1.0,
            "reason": "r",
        }
        asks = [
            breaker_batch.Ask(node, 16, f"i{k}", blast.View.of(RACKS, node, cs.domain_limits))
            for k, node in enumerate(f"n{rng.randrange(16)}" for _ in range(rng.randint(1, 12)))
        ]
        expected, expected_doc = _fold(state, asks, 1000.0, cs)
        got, doc, parsed = breaker_batch.admit_all(state, asks, 1000.0, cs)
        assert [_verdict(a) for a in got] == [_verdict(a) for a in expected], trial
        assert doc == expected_doc, trial
        if doc is not None:
            assert parsed == tuple(map(gates.BreakerEntry.of, doc["entries"])), "the next batch's Known"
        tripped = [(g.state, e.state) for g, e in zip(got, expected, strict=True) if e.tripped]
        assert all(g == e for g, e in tripped), "the tripping ask carries the counted entries"


XID_RULE = """
rules:
  - id: xid-fatal
    description: fatal XID
    on_event: {kind: xid, xid: [48]}
    severity: critical
    actions: [cordon]
    resolve: {for: 1h}
"""


async def test_a_burst_past_the_shipped_breaker_trips_it_once_and_loses_no_fault(
    tmp_path: pathlib.Path,
) -> None:
    subj = subjects.Subjects()
    bus = conftest.make_memory_bus(subj)
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "xid.yaml").write_text(XID_RULE)
    fleet = [f"gpu-{i:03d}" for i in range(100)]
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump({"nodes": fleet}))
    # the shipped breaker: at most 50 nodes and 10 % of the fleet, so 10 of these 100
    cs = config.ControllerSettings.model_validate(
        {"rules_dir": str(rules), "tick_s": 0.2, "mode": "enforce", "admission": "file",
         "inventory_file": str(inventory), "actions_per_minute": 1000}
    )  # fmt: skip
    assert (cs.breaker_max_nodes, cs.breaker_max_percent) == (
        config.ControllerSettings().breaker_max_nodes,
        config.ControllerSettings().breaker_max_percent,
    )
    actuator = testing.RecordingActuator()
    ctl = await service.build(config.Settings(controller=cs), bus, scheduler=actuator)
    await ctl.start()
    burst = fleet[::3][:30]
    try:
        await conftest.until(lambda: ctl.leader)
        await asyncio.gather(
            *(
                bus.publish_durable(subj.events(node), codec.encode(e), msg_id=e.id)
                for node in burst
                for e in [events.new(node, "xid", gpu_index=0, xid=48)]
            )
        )
        feed = bus.stream(subj.stream_incidents)

        def incidents() -> list[Any]:
            return [codec.decode_incident(m.data) for m in feed.messages]

        def settled(inc: Any) -> bool:
            return any(a.status is not None for a in inc.data.actions)

        def every_fault_settled() -> bool:
            last = {i.data.node: i for i in incidents() if i.data.rule_id == "xid-fatal"}
            return set(last) == set(burst) and all(settled(i) for i in last.values())

        await conftest.until(every_fault_settled, timeout=30)
        cordoned = [r.node for r in actuator.executed("cordon")]
        assert len(cordoned) == len(set(cordoned)) == 10, "the breaker's limit, each node once"
        last = {i.data.node: i.data for i in incidents() if i.data.rule_id == "xid-fatal"}
        assert set(last) == set(burst), "every fault has its incident: none lost"
        refused = {n for n, d in last.items() if d.actions[0].status == "refused"}
        assert refused == set(burst) - set(cordoned)
        details = [last[n].actions[0].detail for n in refused]
        assert all("circuit breaker open" in d or "would exceed" in d for d in details), details
        breakers = {i.data.incident_id for i in incidents() if i.data.rule_id == "circuit-breaker"}
        assert len(breakers) == 1, "one breaker incident"
        [opened] = [i.data for i in incidents() if i.data.rule_id == "circuit-breaker"][:1]
        assert opened.evidence["counted"] == 10
        assert set(str(opened.evidence["counted_nodes"]).split(", ")) == set(cordoned)
        status = await ctl.breaker.status()
        assert status["open"]
        assert sorted(e[0] for e in status["entries"]) == sorted(cordoned)
    finally:
        await ctl.stop()


def _by_incident(ids: list[str]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for event_id in ids:
        inc, seq = event_id.rsplit(".", 1)
        out.setdefault(inc, []).append(int(seq))
    return out


async def test_the_feed_sends_a_window_together_and_keeps_each_incidents_order_through_failures() -> None:
    """Events of distinct incidents go out together; one that fails stays with every later event of its
    incident, so each incident's events reach the stream in order, each once, none lost."""
    rng = random.Random(43)
    stored: list[str] = []
    in_flight = [0, 0]  # now, most at once

    async def flaky(subject: str, data: bytes, msg_id: str, timeout: float = 5.0) -> bool:
        in_flight[0] += 1
        in_flight[1] = max(in_flight)
        await asyncio.sleep(0)
        in_flight[0] -= 1
        if rng.random() < 0.2:
            raise errors.TemporaryError("publish: no stream leader")
        stored.append(msg_id)
        return True

    feed = feed_publisher.FeedPublisher(
        types.SimpleNamespace(publish_durable=flaky), subjects.Subjects(), "c"
    )
    incs = [
        book.Incident(id=f"inc-{i}", rule_id="xid-fatal", severity="critical", node=f"n{i}", mode="enforce",
                      opened_at=0.0, updated_at=0.0)
        for i in range(40)
    ]  # fmt: skip
    queued = []
    for _ in range(5):  # each incident changes five times, the changes interleaved
        for inc in rng.sample(incs, len(incs)):
            inc.seq += 1
            event = feed.build(inc, incidents_schema.Change.UPDATED)
            feed.enqueue(event)
            queued.append(event.id)
    for _ in range(200):
        await feed.flush()
        if not feed.outbox:
            break
    assert not feed.outbox
    assert not feed.waiting
    assert sorted(stored) == sorted(queued), "every event stored once: none lost, none twice"
    assert all(seqs == [1, 2, 3, 4, 5] for seqs in _by_incident(stored).values()), "each in its order"
    assert in_flight[1] > 1, "a window goes out together"
    assert feed.published == len(queued)


async def test_a_burst_with_the_limits_open_acts_on_every_node_once_and_a_restart_redoes_nothing(
    tmp_path: pathlib.Path,
) -> None:
    """The default pack (cordon, migrate, then the reset-then-reboot ladder) on a burst handled node by
    node concurrently: every node is cordoned, migrated and reset exactly once, each incident's feed
    events are complete and in order, what KV holds matches; a new controller taking over from KV does
    none of it again."""
    subj = subjects.Subjects()
    bus = conftest.make_memory_bus(subj)
    fleet = [f"gpu-{i:03d}" for i in range(200)]
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        yaml.safe_dump({"nodes": [{"name": n, "rack": f"r{i // 10}"} for i, n in enumerate(fleet)]})
    )
    cs = config.ControllerSettings.model_validate(
        {"rules_dir": str(RULES), "tick_s": 0.2, "mode": "enforce", "admission": "file",
         "inventory_file": str(inventory), "breaker_max_nodes": 200, "breaker_max_percent": 100.0,
         "domain_limits": {"rack": {"max_percent": 100.0}}, "actions_per_minute": 100_000,
         "shared_cause_window_s": 0.0}
    )  # fmt: skip
    scheduler, gpu = testing.RecordingActuator(), testing.RecordingGpuActuator()
    burst = fleet[::2][:100]
    ctl = await service.build(config.Settings(controller=cs), bus, scheduler=scheduler, gpu=gpu)
    await ctl.start()
    try:
        await conftest.until(lambda: ctl.leader)
        await asyncio.gather(
            *(
                bus.publish_durable(subj.events(node), codec.encode(e), msg_id=e.id)
                for node in burst
                for e in [events.new(node, "xid", gpu_index=3, xid=48)]
            )
        )
        await conftest.until(
            lambda: {r.node for r in gpu.requests if r.kind == "reset_gpu"} == set(burst), 30
        )
        await conftest.until(lambda: not ctl.feed.outbox)
    finally:
        await ctl.stop()
    for kind in ("cordon", "migrate"):
        nodes = [r.node for r in scheduler.executed(kind)]
        assert sorted(nodes) == sorted(burst), f"every node's {kind}, once"
    resets = [r.node for r in gpu.executed("reset_gpu")]
    assert sorted(resets) == sorted(burst), "every ladder's first rung, once"
    ids = [codec.decode_incident(m.data).id for m in bus.stream(subj.stream_incidents).messages]
    assert len(ids) == len(set(ids)), "no feed event twice"
    seqs = _by_incident(ids)
    assert len(seqs) == len(burst)
    assert all(s == list(range(1, len(s) + 1)) for s in seqs.values()), "each incident's events, in order"
    state = kv.Store(await bus.key_value(subj.kv_state))
    for key in await state.keys(book.PREFIX):
        doc = await state.get(key)
        assert doc is not None
        inc = book.Incident.model_validate(doc.value)
        assert [a.status for a in inc.actions[:2]] == ["done", "done"], inc.actions
        assert inc.seq == len(seqs[inc.id]), "KV holds the state the feed last announced"
        lad = await state.get(healing.PREFIX + inc.id)
        assert lad is not None
        rung = lad.value["pending"]["action"]
        assert rung is None or inc.actions[2].kind == "reset_gpu", (
            "the ladder's step is the incident's action"
        )

    again, gpu_again = testing.RecordingActuator(), testing.RecordingGpuActuator()
    second = await service.build(config.Settings(controller=cs), bus, scheduler=again, gpu=gpu_again)
    await second.start()
    try:
        await conftest.until(lambda: second.leader and second.role.took_over, 15)
        assert len(second.book.open) == len(burst)
        assert len(second.recovery.ladders) == len(burst)
        await asyncio.sleep(1.0)  # a few ticks of the new leader
    finally:
        await second.stop()
    assert not again.executed("cordon")
    assert not again.executed("migrate")
    assert not gpu_again.executed("reset_gpu"), "no rung done twice"
