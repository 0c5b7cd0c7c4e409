"""Shared-cause domain incidents (#27 item 3): the pure findings and plan, and a controller on a real
nats-server that opens one leaf-switch incident, holds its members' repairs, heals elsewhere, and
resolves when the domain recovers, returning a held member without its repair."""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
from collections.abc import AsyncIterator

import pytest

from healer import config, testing
from healer.bus import subjects
from healer.controller.core import service
from healer.controller.incidents import book, shared_cause
from healer.controller.inventory import topology
from healer.schemas import codec, events, incidents
from tests.conftest import until
from tests.controller.conftest import Harness

LEAVES = topology.Topology(
    {"a": {"switch": "leaf-1", "rack": "r1"}, "b": {"switch": "leaf-1", "rack": "r1"},
     "c": {"switch": "leaf-1", "rack": "r2"}, "d": {"switch": "leaf-2", "rack": "r2"},
     "e": {"switch": "leaf-2", "rack": "r2"}, "f": {"switch": "leaf-2", "rack": "r2"}}
)  # fmt: skip
CS = config.ControllerSettings(shared_cause_window_s=20, shared_cause_min_nodes=3)


def incident(node: str, rule: str = "ib-down", opened_at: float = 100.0) -> book.Incident:
    return book.Incident(
        id=f"i-{node}-{rule}", rule_id=rule, severity="major", node=node, mode="enforce",
        opened_at=opened_at, updated_at=opened_at,
    )  # fmt: skip


def test_three_nodes_of_one_leaf_with_the_same_signal_suspect_the_leaf() -> None:
    found = shared_cause.findings([incident(n) for n in "abc"], LEAVES, 105.0, CS)
    assert [(f.domain, f.members, f.size) for f in found] == [("switch=leaf-1", ("a", "b", "c"), 3)]


def test_different_signals_fewer_nodes_or_an_old_fault_suspect_nothing() -> None:
    mixed = [incident("a"), incident("b"), incident("c", rule="thermal")]
    assert shared_cause.findings(mixed, LEAVES, 105.0, CS) == []
    assert shared_cause.findings([incident("a"), incident("b")], LEAVES, 105.0, CS) == []
    stale = [incident("a", opened_at=50.0), incident("b"), incident("c")]
    assert shared_cause.findings(stale, LEAVES, 105.0, CS) == []
    off = config.ControllerSettings(shared_cause_window_s=0)
    assert shared_cause.findings([incident(n) for n in "abc"], LEAVES, 105.0, off) == []


def test_the_domain_that_explains_the_most_nodes_wins_and_ties_go_to_the_smallest() -> None:
    # c, d, e, f: rack r2 (4 nodes) explains all four; leaf-2 only three of them
    found = shared_cause.findings([incident(n) for n in "cdef"], LEAVES, 105.0, CS)
    assert [f.domain for f in found] == ["rack=r2"]
    keys = config.ControllerSettings(
        shared_cause_window_s=20, shared_cause_min_nodes=3, shared_cause_keys=["switch"]
    )
    assert [f.domain for f in shared_cause.findings([incident(n) for n in "cdef"], LEAVES, 105.0, keys)] == [
        "switch=leaf-2"
    ]


def test_the_plan_opens_once_grows_with_new_members_and_resolves_when_none_fires() -> None:
    found = shared_cause.findings([incident(n) for n in "abc"], LEAVES, 105.0, CS)
    first = shared_cause.plan(found, [], {"i-a-ib-down"})
    assert [f.domain for f in first.open] == ["switch=leaf-1"]
    dom = shared_cause.new_incident(found[0], "dom", 105.0, CS)
    assert dom.node == "switch.leaf-1"
    assert dom.evidence["suspected"] == "switch leaf-1"
    assert shared_cause.members_of(dom) == ["a", "b", "c"]
    again = shared_cause.plan(found, [dom], {"i-a-ib-down"})
    assert again.open == [] and again.grow == [] and again.resolve == []  # noqa: PT018
    assert shared_cause.plan([], [dom], set()).resolve == [dom]


def test_only_repairs_of_members_are_held_containment_is_not() -> None:
    dom = shared_cause.new_incident(
        shared_cause.findings([incident(n) for n in "abc"], LEAVES, 105.0, CS)[0], "dom", 105.0, CS
    )
    assert shared_cause.holding("a", "reboot_node", [dom]) is dom
    assert shared_cause.holding("a", "reset_gpu", [dom]) is dom
    assert shared_cause.holding("a", "cordon", [dom]) is None
    assert shared_cause.holding("a", "drain", [dom]) is None
    assert shared_cause.holding("d", "reboot_node", [dom]) is None


XID_RESET = (
    "rules:\n  - id: xid-lost\n    description: GPU fell off the bus\n    on_event: {kind: xid, xid: [79]}\n"
    "    scope: gpu\n    severity: critical\n    actions: [cordon, reset_gpu]\n    resolve: {for: 2s}\n"
    "    on_resolve: [uncordon]\n"
)


async def xid(harness: Harness, node: str) -> None:
    event = events.new(node, "xid", gpu_index=0, xid=79)
    await harness.bus.publish_durable(subjects.Subjects().events(node), codec.encode(event), msg_id=event.id)


class Firing:
    """Keeps publishing the XID on ``nodes`` (each event refreshes the rule's quiet period), so the
    members fire until the test lets the domain recover, however slow the machine."""

    def __init__(self, harness: Harness) -> None:
        self.harness = harness
        self.nodes: list[str] = []
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(self._run())

    async def add(self, node: str) -> None:
        self.nodes.append(node)
        await xid(self.harness, node)

    async def _run(self) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), 0.3)
            for node in [] if self.stop.is_set() else list(self.nodes):
                await xid(self.harness, node)

    async def recover(self) -> None:
        self.stop.set()
        await self.task


@pytest.fixture
async def firing(harness: Harness) -> AsyncIterator[Firing]:
    keeper = Firing(harness)
    try:
        yield keeper
    finally:
        await keeper.recover()  # also when the test failed: no task outlives it


def of(ctl: service.Controller, node: str) -> book.Incident | None:
    return next((i for i in ctl.book.all() if i.node == node), None)


async def test_a_leaf_switch_loss_is_one_incident_that_holds_repairs_and_resolves_with_the_domain(
    harness: Harness, tmp_path: pathlib.Path, firing: Firing
) -> None:
    (harness.rules / "xid.yaml").write_text(XID_RESET)
    inventory = tmp_path / "nodes.yaml"
    inventory.write_text(
        "nodes:\n"
        + "".join(f"  gpu-{n}: {{switch: leaf-01}}\n" for n in "abce")
        + "  gpu-d: {switch: leaf-02}\n"
    )
    actuator = testing.RecordingActuator()
    ctl = await harness.controller(
        actuator, admission="file", inventory_file=str(inventory), breaker_max_percent=100,
        shared_cause_min_nodes=3, shared_cause_window_s=60,
    )  # fmt: skip
    await until(lambda: ctl.leader)
    for n in "abc":
        await firing.add(f"gpu-{n}")
    await until(lambda: of(ctl, "switch.leaf-01") is not None)
    dom = of(ctl, "switch.leaf-01")
    assert dom is not None
    assert dom.rule_id == "shared-cause"
    assert shared_cause.members_of(dom) == ["gpu-a", "gpu-b", "gpu-c"]

    await firing.add("gpu-e")  # a later member: its repair waits
    await until(lambda: (i := of(ctl, "gpu-e")) is not None and i.evidence.get("held_by_incident") == dom.id)
    await until(lambda: "gpu-e" in shared_cause.members_of(dom))
    await until(
        lambda: any("held by shared-cause" in a.detail for a in of(ctl, "gpu-e").actions)  # type: ignore[union-attr]
    )
    held = of(ctl, "gpu-e")
    assert held is not None
    reset = next(a for a in held.actions if a.kind == "reset_gpu")
    assert reset.status is None
    assert "held by shared-cause" in reset.detail

    await xid(harness, "gpu-d")  # another switch: not held
    await until(lambda: (i := of(ctl, "gpu-d")) is not None and i.actions[-1].status is not None)
    other = of(ctl, "gpu-d")
    assert other is not None
    assert "held" not in other.actions[-1].detail
    assert dom.state != "resolved"

    await firing.recover()  # the switch is back: no member fires any more
    await until(lambda: dom.state == "resolved", timeout=20)
    assert dom.evidence["outcome"] == "domain recovered"
    await until(lambda: any(r.node == "gpu-e" for r in actuator.executed("uncordon")), timeout=20)
    assert reset.status == "skipped"
    assert "recovered while its domain was suspected" in reset.detail
    # the resolution reaches the feed (a core subscription here) after the book has it: wait, not sample
    await until(lambda: "resolved" in harness.feed.changes("switch.leaf-01"))
    opened = [e for e in harness.feed.events if e.data.node == "switch.leaf-01" and e.change == "opened"]
    assert len(opened) == 1, "one domain incident"
    assert opened[0].data.evidence["members"] == "gpu-a,gpu-b,gpu-c"
    assert opened[0].data.schema_ == "healer.incident.v2"
    assert opened[0].data.domain is not None
    assert (opened[0].data.domain.key, opened[0].data.domain.value) == ("switch", "leaf-01")
    assert opened[0].data.domain.members == ["gpu-a", "gpu-b", "gpu-c"]
    assert opened[0].data.domain.suspected == "switch leaf-01"
    grown = [e for e in harness.feed.events if e.data.node == "switch.leaf-01" and e.change == "updated"]
    assert any(e.data.domain is not None and "gpu-e" in e.data.domain.members for e in grown)
    assert all(e.data.domain is None for e in harness.feed.events if e.data.node == "gpu-d"), "v1 stays v1"
    assert not any(r.kind == "reset_gpu" for r in actuator.requests), "no repair reached an actuator"


async def test_a_domain_incident_survives_a_failover_holds_and_still_resolves(
    harness: Harness, tmp_path: pathlib.Path, firing: Firing
) -> None:
    (harness.rules / "xid.yaml").write_text(XID_RESET)
    inventory = tmp_path / "nodes.yaml"
    inventory.write_text("nodes:\n" + "".join(f"  gpu-{n}: {{pdu: p1}}\n" for n in "abcd"))
    settings = {
        "admission": "file", "inventory_file": str(inventory), "breaker_max_percent": 100,
        "shared_cause_min_nodes": 3, "shared_cause_window_s": 60,
    }  # fmt: skip
    actuator = testing.RecordingActuator()
    first = await harness.controller(actuator, **settings)
    await until(lambda: first.leader)
    # the members fire across the takeover
    for n in "abc":
        await firing.add(f"gpu-{n}")
    await until(lambda: of(first, "pdu.p1") is not None)
    # a member that fired a tick before the third had its (rule-named, so only recorded) reset settled
    # before any domain could hold it: nothing is left to hold there
    settled = {
        f"gpu-{n}"
        for n in "abc"
        if any(
            a.kind == "reset_gpu" and a.status is not None
            for a in getattr(of(first, f"gpu-{n}"), "actions", [])
        )
    }
    assert settled <= {"gpu-a", "gpu-b"}, "the member that makes the domain is held from its first tick"
    await harness.crash(first)
    second = await harness.controller(actuator, **settings)
    await until(lambda: second.leader and of(second, "pdu.p1") is not None, timeout=20)
    dom = of(second, "pdu.p1")
    assert dom is not None
    await firing.add("gpu-d")
    await until(  # the new leader is still catching up the stream's backlog of members' XIDs
        lambda: (i := of(second, "gpu-d")) is not None and i.evidence.get("held_by_incident") == dom.id,
        timeout=30,
    )

    def held_by_the_new_leader() -> bool:  # every member's open repair, old members' and the new one's
        members = [of(second, f"gpu-{n}") for n in "abcd" if f"gpu-{n}" not in settled]
        return all(
            i is not None
            and any(
                a.kind == "reset_gpu" and a.status is None and "held by shared-cause" in a.detail
                for a in i.actions
            )
            for i in members
        )

    await until(held_by_the_new_leader, timeout=20)
    assert shared_cause.members_of(dom) == ["gpu-a", "gpu-b", "gpu-c", "gpu-d"]
    assert dom.domain is not None
    assert dom.domain.members == ["gpu-a", "gpu-b", "gpu-c", "gpu-d"], "the structured members, from KV"
    await firing.recover()
    await until(lambda: dom.state == "resolved", timeout=40)
    assert [e.change for e in harness.feed.events if e.data.node == "pdu.p1"].count(
        incidents.Change.OPENED
    ) == 1


XID_LADDER = XID_RESET.replace("actions: [cordon, reset_gpu]", "actions: [cordon]") + (
    "ladders:\n  - id: xid-recovery\n    rules: [xid-lost]\n    steps: [reset_gpu, reboot_node]\n"
    "    soak: 0s\n    dcgm_level: 0\n    repeat_limit: {count: 3, within: 30d}\n"
)


def test_the_catalogue_says_which_repairs_a_domain_incident_holds() -> None:
    from healer import actions

    held = {k for k, spec in actions.CATALOG.items() if spec.held_by_shared_cause}
    assert held == {"reset_gpu", "reset_port", "reboot_node", "hardware_replacement"}
    assert not any(actions.CATALOG[k].held_by_shared_cause for k in ("cordon", "drain", "migrate", "notify"))


async def test_members_that_recover_on_their_own_are_returned_by_their_ladder_without_a_reset_or_reboot(
    harness: Harness, tmp_path: pathlib.Path, firing: Firing
) -> None:
    (harness.rules / "xid.yaml").write_text(XID_LADDER)
    inventory = tmp_path / "nodes.yaml"
    inventory.write_text("nodes:\n" + "".join(f"  gpu-{n}: {{switch: leaf-01}}\n" for n in "abc"))
    actuator, gpu = testing.RecordingActuator(), testing.RecordingGpuActuator()
    ctl = await harness.controller(
        actuator, gpu, admission="file", inventory_file=str(inventory), breaker_max_percent=100,
        shared_cause_min_nodes=3, shared_cause_window_s=60,
    )  # fmt: skip
    await until(lambda: ctl.leader)
    for n in "abc":
        await firing.add(f"gpu-{n}")
    await until(lambda: of(ctl, "switch.leaf-01") is not None)
    members = {n: of(ctl, f"gpu-{n}") for n in "abc"}
    # each member is contained (cordoned), its ladder's first rung (the GPU reset) held by the domain
    await until(
        lambda: all(
            i is not None
            and any(a.kind == "reset_gpu" and "held by shared-cause" in a.detail for a in i.actions)
            for i in members.values()
        ),
        timeout=20,
    )
    assert {r.node for r in actuator.executed("cordon")} == {"gpu-a", "gpu-b", "gpu-c"}

    await firing.recover()  # the leaf is back: every member recovers by itself
    await until(lambda: all(i is not None and i.state == "resolved" for i in members.values()), timeout=30)
    for inc in members.values():
        assert inc is not None
        assert inc.evidence["outcome"] == "recovered"
        reset = next(a for a in inc.actions if a.kind == "reset_gpu")
        assert reset.status == "skipped"
        assert reset.facts.get(shared_cause.RECOVERED_FACT) == "true"
        returned = next(a for a in inc.actions if a.kind == "return_to_service")
        assert returned.status == "done"
        assert not any(a.kind == "reboot_node" for a in inc.actions), "the ladder never got to a reboot"
    assert {r.node for r in actuator.executed("uncordon")} == {"gpu-a", "gpu-b", "gpu-c"}, "all returned"
    assert gpu.requests == [], "no GPU reset (nor validation) was asked of any node agent"
    assert not any(r.kind == "reboot_node" for r in actuator.requests), "no reboot was issued"
    await until(lambda: "resolved" in harness.feed.changes("switch.leaf-01"))


def test_each_kind_of_signal_may_have_its_own_window_and_count() -> None:
    cs = config.ControllerSettings.model_validate(
        {"shared_cause_window_s": 20, "shared_cause_min_nodes": 3,
         "shared_cause_rules": {"node-silent": {"min_nodes": 2}, "inlet-*": {"window_s": 300},
                                "inlet-rise-fast": {"window_s": 5, "min_nodes": 4}, "off": {"window_s": 0}}}
    )  # fmt: skip
    assert shared_cause.terms("ib-down", cs) == shared_cause.Terms(20, 3)  # the fleet-wide defaults
    assert shared_cause.terms("node-silent", cs) == shared_cause.Terms(20, 2)  # unset window: fleet-wide
    assert shared_cause.terms("inlet-rise", cs) == shared_cause.Terms(300, 3)  # a glob
    assert shared_cause.terms("inlet-rise-fast", cs) == shared_cause.Terms(5, 4)  # an exact id wins
    assert shared_cause.longest_window_s(cs) == 300
    # two silent nodes of a leaf are enough; two IB-down nodes are not
    two = [incident("a", "node-silent"), incident("b", "node-silent"), incident("a"), incident("b")]
    assert [(f.rule_id, f.members) for f in shared_cause.findings(two, LEAVES, 105.0, cs)] == [
        ("node-silent", ("a", "b"))
    ]
    # an inlet rise over three nodes within five minutes is one; IB down that long ago is not
    slow = [incident(n, "inlet-rise", opened_at=100.0) for n in "abc"] + [incident(n) for n in "def"]
    assert [f.rule_id for f in shared_cause.findings(slow, LEAVES, 250.0, cs)] == ["inlet-rise"]
    assert shared_cause.findings([incident(n, "off") for n in "abc"], LEAVES, 100.0, cs) == []
    dom = shared_cause.new_incident(shared_cause.findings(slow, LEAVES, 250.0, cs)[0], "d", 250.0, cs)
    assert "within 300s" in dom.summary
    off = config.ControllerSettings.model_validate(
        {"shared_cause_window_s": 0, "shared_cause_rules": {"inlet-*": {"window_s": 300}}}
    )
    assert shared_cause.findings(slow, LEAVES, 250.0, off) == [], "0 turns it off for every rule"


XID_SUPPORT = XID_RESET.replace("actions: [cordon, reset_gpu]", "actions: [cordon]") + (
    "ladders:\n  - id: xid-support\n    rules: [xid-lost]\n    contact_support: true\n"
)


async def test_a_members_replacement_waits_for_its_domain_and_is_never_opened_once_it_recovered(
    harness: Harness, tmp_path: pathlib.Path, firing: Firing
) -> None:
    (harness.rules / "xid.yaml").write_text(XID_SUPPORT)
    inventory = tmp_path / "nodes.yaml"
    inventory.write_text("nodes:\n" + "".join(f"  gpu-{n}: {{pdu: p1}}\n" for n in "abc"))
    actuator = testing.RecordingActuator()
    ctl = await harness.controller(
        actuator, admission="file", inventory_file=str(inventory), breaker_max_percent=100,
        shared_cause_min_nodes=3, shared_cause_window_s=60,
    )  # fmt: skip
    await until(lambda: ctl.leader)
    firing.nodes.extend(f"gpu-{n}" for n in "abc")
    await asyncio.gather(*(xid(harness, f"gpu-{n}") for n in "abc"))  # the PDU's three nodes at once
    await until(lambda: of(ctl, "pdu.p1") is not None)
    await until(
        lambda: all(
            (i := of(ctl, f"gpu-{n}")) is not None
            and "held by its domain" in str(i.evidence.get("ladder.next"))
            for n in "abc"
        ),
        timeout=20,
    )
    await firing.recover()
    await until(
        lambda: {r.node for r in actuator.executed("uncordon")} == {"gpu-a", "gpu-b", "gpu-c"}, timeout=30
    )
    assert not [e for e in harness.feed.events if e.data.rule_id == "hardware-replacement"], "no replacement"
