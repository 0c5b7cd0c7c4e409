"""A port fault is one incident for its node and port (rules/fabric.yaml's port-scope rules), end to end
on a real nats-server: a node with two ports down (a recorded ConnectX-7 sysfs tree) is two incidents,
each naming its port on the feed, with one cordon and one recovery ladder for the node (the second
incident follows the first one's ladder: one link reset bounces both ports, and when it fails the node
reboots once); without a ladder, the node stays
cordoned until the last of its port incidents has ended, and is returned then."""

from __future__ import annotations

import asyncio
import os
import pathlib
import subprocess
import sys
from collections.abc import Callable

import yaml

from healer import testing
from healer.actuators import base
from healer.agent import daemon
from healer.bus import nats as natsbus
from healer.controller.incidents import gates
from healer.schemas import incidents
from healer.sim import node_source
from healer.telemetry import rdma
from tests.controller.conftest import Harness

REPO = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "sysfs"
PORTS = ["mlx5_3/1", "mlx5_6/1"]
"""The two ports down in cx7-ib-two-ports-down.txt."""


def tree(name: str) -> str:
    return (FIXTURES / name).read_text()


async def until(predicate: Callable[[], bool], polls: int = 1200) -> None:
    """Poll every 0.05 s, at most ``polls`` times (an upper bound, never a duration being measured)."""
    for _ in range(polls):
        if predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition never held")


def port_down_rules(*, ladder: bool) -> str:
    """rules/fabric.yaml's rdma-port-down as shipped (scope port), its holds shortened to fit a test;
    with ``ladder``, rules/ladders.yaml's fabric ladder with no soak."""
    doc = yaml.safe_load((REPO / "rules" / "fabric.yaml").read_text())
    (rule,) = [r for r in doc["rules"] if r["id"] == "rdma-port-down"]
    assert rule["scope"] == "port"
    rule["for"], rule["resolve"] = "0s", {"for": "0s"}
    out: dict[str, object] = {"rules": [rule]}
    if ladder:
        ladders = yaml.safe_load((REPO / "rules" / "ladders.yaml").read_text())["ladders"]
        (fabric,) = [lad for lad in ladders if lad["id"] == "fabric"]
        fabric["rules"], fabric["soak"] = ["rdma-port-down"], "0s"
        out["ladders"] = [fabric]
    return yaml.safe_dump(out)


class Drains(testing.RecordingActuator):
    """Answers as Slurm does: a cordon of a drained node is ``already-done``, so is an uncordon of one
    that is not; ``drains`` is the node's drained state after each request; ``on_reboot`` runs when a
    reboot is asked for (the links train again)."""

    def __init__(self, on_reboot: Callable[[], None] | None = None) -> None:
        super().__init__()
        self.drained = False
        self.drains: list[tuple[str, str, bool]] = []
        self.on_reboot = on_reboot

    async def apply(self, request: base.ActionRequest) -> base.ActionOutcome:
        self.requests.append(request)
        status: incidents.ActionStatus = incidents.ActionStatus.DONE
        if request.kind == "cordon":
            status = incidents.ActionStatus.ALREADY_DONE if self.drained else incidents.ActionStatus.DONE
            self.drained = True
        elif request.kind == "uncordon":
            status = incidents.ActionStatus.DONE if self.drained else incidents.ActionStatus.ALREADY_DONE
            self.drained = False
        elif request.kind == "reboot_node" and self.on_reboot is not None:
            self.on_reboot()
        self.drains.append((request.kind, status, self.drained))
        return base.ActionOutcome(status=status, detail=f"{request.kind} {request.node}: {status}")


def port_events(harness: Harness, change: str | None = None) -> list[incidents.IncidentEvent]:
    return [
        e
        for e in harness.feed.events
        if e.data.rule_id == "rdma-port-down" and (change is None or e.change == change)
    ]


async def test_two_ports_down_are_two_incidents_one_cordon_and_one_ladder_through_the_agent_process(
    harness: Harness, tmp_path: pathlib.Path
) -> None:
    (harness.rules / "dbe.yaml").unlink()
    (harness.rules / "fabric.yaml").write_text(port_down_rules(ladder=True))
    root = rdma.write_tree(tree("cx7-ib-two-ports-down.txt"), tmp_path / "sys")

    def reboot() -> None:  # the node comes back with both ports up
        rdma.write_tree(tree("cx7-ib-healthy.txt"), root)

    sched = Drains(on_reboot=reboot)
    gpu = testing.RecordingGpuActuator(script={"reset_port": [incidents.ActionStatus.FAILED_PERMANENT]})
    ctl = await harness.controller(sched, gpu=gpu)
    agent = subprocess.Popen(  # noqa: ASYNC220 - started once, then only awaited on
        [sys.executable, "-m", "healer", "agent", "--nats", harness.srv.url, "--node", "ib-node",
         "--source", "sim", "--sim-gpus", "2", "--interval", "0.1", "--state-dir", str(tmp_path / "state")],
        env={**os.environ, "HEALER_AGENT_SYSFS_ROOT": str(root), "HEALER_LOG_FORMAT": "json"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        await until(lambda: len(port_events(harness, "resolved")) == 2)
    finally:
        agent.terminate()
        await asyncio.to_thread(agent.wait, 20)
    opened = port_events(harness, "opened")
    assert sorted(incidents.port_of(e.data) or "" for e in opened) == PORTS, "one incident per port"
    assert sorted(e.subject for e in opened) == [f"node/ib-node/port/{p}" for p in PORTS]
    assert all(e.data.node == "ib-node" and e.data.gpu_index is None for e in opened)
    lead, follower = sorted(opened, key=lambda e: "ladder.joined" in e.data.evidence)
    assert follower.data.evidence[gates.LADDER_JOINED] == lead.data.incident_id, "it follows the ladder"
    (reset,) = [r for r in gpu.requests if r.kind == "reset_port"]
    assert reset.incident_id == lead.data.incident_id
    assert sorted(reset.params["ports"]) == PORTS, "one link reset for both ports of the node"
    assert [r.kind for r in sched.executed("reboot_node")] == ["reboot_node"], "the node reboots once"
    assert [(k, s) for k, s, _ in sched.drains if k == "cordon"] == [
        ("cordon", "done"),
        ("cordon", "already-done"),
    ]
    assert [(k, s, d) for k, s, d in sched.drains if k == "uncordon"] == [("uncordon", "done", False)]
    resolved = {e.data.incident_id: e.data for e in port_events(harness, "resolved")}
    assert {d.evidence["outcome"] for d in resolved.values()} == {"recovered"}
    assert [a.kind for a in resolved[lead.data.incident_id].actions if a.kind == "reboot_node"] == [
        "reboot_node"
    ]
    assert not [a for a in resolved[follower.data.incident_id].actions if a.kind == "reboot_node"]
    assert not ctl.book.open, "both incidents ended"


async def test_a_node_stays_cordoned_until_its_last_port_incident_ends(
    harness: Harness, tmp_path: pathlib.Path
) -> None:
    (harness.rules / "dbe.yaml").unlink()
    (harness.rules / "fabric.yaml").write_text(port_down_rules(ladder=False))
    sched = Drains()
    ctl = await harness.controller(sched)
    root = rdma.write_tree(tree("cx7-ib-two-ports-down.txt"), tmp_path / "sys")
    bus = await natsbus.NatsBus.connect(harness.srv.url, name="agent-n1")
    agent = daemon.Agent(
        node="n1", source=node_source.SimSource("n1", gpus=2), bus=bus, state_dir=tmp_path / "agent",
        interval_s=0.1, ports=rdma.PortReader(root),
    )  # fmt: skip
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))

    def resolved_ports() -> list[str | None]:
        return [incidents.port_of(e.data) for e in port_events(harness, "resolved")]

    def uncordon_settled(port: str) -> bool:
        return any(
            incidents.port_of(e.data) == port and any(a.kind == "uncordon" for a in e.data.actions)
            for e in port_events(harness, "action")
        )

    try:
        await until(lambda: len(port_events(harness, "opened")) == 2 and len(sched.executed("cordon")) == 2)
        rdma.write_tree(tree("cx7-ib-link-down.txt"), root)  # mlx5_6/1 trained up; mlx5_3/1 still down
        await until(lambda: resolved_ports() == ["mlx5_6/1"] and uncordon_settled("mlx5_6/1"))
        assert sched.drained, "no uncordon while mlx5_3/1 is down"
        assert not sched.executed("uncordon")
        (still,) = ctl.book.open.values()
        assert still.port == "mlx5_3/1"
        assert still.evidence.get(gates.HANDED_OVER), "healer's cordon passed to the incident still open"
        rdma.write_tree(tree("cx7-ib-healthy.txt"), root)
        await until(lambda: resolved_ports() == ["mlx5_6/1", "mlx5_3/1"] and bool(sched.executed("uncordon")))
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await bus.close()
    assert [(k, s, d) for k, s, d in sched.drains if k in ("cordon", "uncordon")] == [
        ("cordon", "done", True), ("cordon", "already-done", True), ("uncordon", "done", False),
    ]  # fmt: skip
    (first,) = [e.data for e in port_events(harness, "resolved") if incidents.port_of(e.data) == "mlx5_6/1"]
    assert first.incident_id != sched.executed("uncordon")[0].incident_id, "the last incident returned it"
