"""Blast radius per failure domain (#27 item 2): the pure decision, its state in KV on a real nats-server
(read back by a restarted controller), and a controller that holds a full rack and heals elsewhere, also
after a failover."""

from __future__ import annotations

import pathlib

import pytest

from healer import config, testing
from healer.bus import embedded, provision, subjects
from healer.bus import nats as natsbus
from healer.controller.core import service
from healer.controller.incidents import gates
from healer.controller.inventory import blast, topology
from healer.controller.remediation import policy
from healer.controller.store import kv
from healer.schemas import codec, events
from tests.conftest import until
from tests.controller.conftest import Harness, metric

RACKS = topology.Topology(
    {"a1": {"rack": "r1"}, "a2": {"rack": "r1"}, "a3": {"rack": "r1"}, "a4": {"rack": "r1"},
     "b1": {"rack": "r2", "switch": "s2"}, "b2": {"rack": "r2", "switch": "s2"}}
)  # fmt: skip


def settings(**limits: dict[str, float]) -> config.ControllerSettings:
    return config.ControllerSettings.model_validate(
        {"breaker_max_nodes": 50, "breaker_max_percent": 100, "domain_limits": limits}
    )


def entries(*nodes: str) -> dict[str, object]:
    return {"open": False, "entries": [[n, 100.0, f"i-{n}"] for n in nodes]}


def admit(state: dict[str, object], node: str, cs: config.ControllerSettings) -> gates.BreakerAdmission:
    view = blast.View.of(RACKS, node, cs.domain_limits)
    return gates.breaker_admission(state, node, 6, f"i-{node}", 110.0, cs, view)


@pytest.mark.parametrize(
    ("size", "limit", "allowed"),
    [
        (8, {"max_nodes": 2}, 2),
        (8, {"max_percent": 25}, 2),
        (3, {"max_percent": 10}, 1),  # never below one
        (8, {"max_nodes": 3, "max_percent": 25}, 2),  # the stricter
        (8, {}, 8),
    ],
)
def test_a_domains_limit_is_the_stricter_of_nodes_and_percent(
    size: int, limit: dict[str, float], allowed: int
) -> None:
    assert blast.limit_of(size, config.DomainLimit.model_validate(limit)) == allowed


def test_a_rack_at_its_limit_holds_the_next_node_and_names_the_domain_and_limit() -> None:
    cs = settings(rack={"max_nodes": 2})
    held = admit(entries("a1", "a2"), "a3", cs)
    assert not held.allowed
    assert held.held is not None
    assert (held.held.domain, held.held.limit, held.held.counted) == ("rack=r1", 2, ("a1", "a2"))
    assert "rack=r1" in held.reason
    assert "limit 2" in held.reason
    assert "max_nodes=2" in held.reason
    assert held.state is None, "a held domain writes nothing"
    assert not held.tripped, "a held domain opens nothing"


def test_a_rack_at_its_limit_does_not_stop_a_node_in_another_rack() -> None:
    cs = settings(rack={"max_nodes": 2})
    elsewhere = admit(entries("a1", "a2"), "b1", cs)
    assert elsewhere.allowed
    assert elsewhere.held is None
    assert elsewhere.state is not None
    assert [e[0] for e in elsewhere.state["entries"]] == ["a1", "a2", "b1"]


def test_a_percent_limit_counts_the_domains_own_size() -> None:
    cs = settings(rack={"max_percent": 50})  # r1: 4 nodes -> 2; r2: 2 nodes -> 1
    assert admit(entries("a1"), "a2", cs).allowed
    assert admit(entries("b1"), "b2", cs).held is not None


def test_every_limited_key_counts_and_unlimited_keys_do_not() -> None:
    cs = settings(switch={"max_nodes": 1})
    assert admit(entries("a1", "a2", "a3"), "a4", cs).allowed, "rack has no limit, a4 has no switch"
    hold = admit(entries("b1"), "b2", cs).held
    assert hold is not None
    assert hold.domain == "switch=s2"


def test_a_node_already_counted_is_not_held_again() -> None:
    cs = settings(rack={"max_nodes": 1})
    assert admit(entries("a1"), "a1", cs).allowed


def test_a_full_domain_is_held_before_the_fleet_breaker_could_trip() -> None:
    cs = config.ControllerSettings.model_validate(
        {"breaker_max_nodes": 2, "domain_limits": {"rack": {"max_nodes": 2}}}
    )
    view = blast.View.of(RACKS, "a3", cs.domain_limits)
    verdict = gates.breaker_admission(entries("a1", "a2"), "a3", 6, "i", 110.0, cs, view)
    assert verdict.held is not None
    assert not verdict.tripped


def test_entries_past_the_window_no_longer_count() -> None:
    cs = settings(rack={"max_nodes": 1})
    view = blast.View.of(RACKS, "a2", cs.domain_limits)
    late = 100.0 + cs.breaker_window_s + 1
    assert gates.breaker_admission(entries("a1"), "a2", 6, "i", late, cs, view).allowed


async def test_the_domain_count_lives_in_kv_and_a_restarted_controller_reads_it_back(
    nats_server: embedded.EmbeddedServer,
) -> None:
    url = nats_server.url
    subj = subjects.Subjects()
    cs = settings(rack={"max_nodes": 2})
    first = await natsbus.NatsBus.connect(url, name="first")
    await provision.ensure(first, subj, config.NatsSettings())
    try:
        breaker = policy.Breaker(kv.Store(await first.key_value(subj.kv_state)), cs)
        for node in ("a1", "a2"):
            assert (
                await breaker.admit(node, 6, f"i-{node}", blast.View.of(RACKS, node, cs.domain_limits))
            ).allowed
    finally:
        await first.close()
    second = await natsbus.NatsBus.connect(url, name="second")
    try:
        restarted = policy.Breaker(kv.Store(await second.key_value(subj.kv_state)), cs)
        held = await restarted.admit("a3", 6, "i-a3", blast.View.of(RACKS, "a3", cs.domain_limits))
        assert held.held is not None
        assert held.held.counted == ("a1", "a2")
        assert (await restarted.admit("b1", 6, "i-b1", blast.View.of(RACKS, "b1", cs.domain_limits))).allowed
        assert not (await restarted.status())["open"]
    finally:
        await second.close()


XID_CORDON = (
    "rules:\n  - id: xid-fatal\n    description: fatal XID\n    on_event: {kind: xid, xid: [48]}\n"
    "    scope: gpu\n    severity: critical\n    actions: [cordon]\n    resolve: {for: 10m}\n"
)


async def xid(harness: Harness, node: str) -> None:
    event = events.new(node, "xid", gpu_index=0, xid=48)
    await harness.bus.publish_durable(subjects.Subjects().events(node), codec.encode(event), msg_id=event.id)


def held_by(ctl: service.Controller, node: str) -> object:
    for inc in ctl.book.open.values():
        if inc.node == node:
            return inc.evidence.get("held_by_domain")
    return None


async def test_a_full_rack_is_held_while_the_rest_heals_also_after_a_failover(
    harness: Harness, tmp_path: pathlib.Path
) -> None:
    (harness.rules / "xid.yaml").write_text(XID_CORDON)
    inventory = tmp_path / "nodes.yaml"
    inventory.write_text(
        "nodes:\n  gpu-a: {rack: r1}\n  gpu-b: {rack: r1}\n  gpu-c: {rack: r1}\n  gpu-d: {rack: r2}\n"
    )
    limits = {
        "admission": "file",
        "inventory_file": str(inventory),
        "breaker_max_percent": 100,
        "domain_limits": {"rack": {"max_nodes": 1}},
    }
    actuator = testing.RecordingActuator()
    first = await harness.controller(actuator, **limits)
    await until(lambda: first.leader)
    await xid(harness, "gpu-a")
    await until(lambda: len(actuator.executed("cordon")) == 1)
    await xid(harness, "gpu-b")
    await until(lambda: held_by(first, "gpu-b") == "rack=r1")
    await xid(harness, "gpu-d")
    await until(lambda: len(actuator.executed("cordon")) == 2)
    assert [r.node for r in actuator.executed("cordon")] == ["gpu-a", "gpu-d"]
    held = next(i for i in first.book.open.values() if i.node == "gpu-b")
    assert held.evidence["domain_limit"] == 1
    assert held.evidence["domain_out"] == "gpu-a"
    assert metric(first.metrics, "domain_holds_total") == 1
    assert not (await policy.Breaker(first.state, first.cs).status())["open"]

    await harness.crash(first)
    second = await harness.controller(actuator, **limits)
    await until(lambda: second.leader and len(second.book.open) == 3, timeout=20)
    await xid(harness, "gpu-c")
    await until(lambda: held_by(second, "gpu-c") == "rack=r1", timeout=20)
    assert held_by(second, "gpu-b") == "rack=r1", "the held incident stays held after the failover"
    assert [r.node for r in actuator.executed("cordon")] == ["gpu-a", "gpu-d"], "no node of r1 beyond 1"
