"""End to end: an agent reading a recorded sysfs tree with a port down, a real nats-server, and a controller
running the fabric rule (with a short hold): one incident for the node and port, naming the port, the node
cordoned; the port back up, the incident resolves and the node is uncordoned."""

from __future__ import annotations

import asyncio
import pathlib

import yaml

from healer import testing
from healer.agent import daemon
from healer.bus import nats as natsbus
from healer.schemas import incidents
from healer.sim import node_source
from healer.telemetry import rdma
from tests.controller.conftest import Harness

REPO = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "sysfs"


async def _until(predicate: object, polls: int = 600) -> None:
    """Poll every 0.05 s, at most ``polls`` times (an upper bound, never a duration being measured)."""
    assert callable(predicate)
    for _ in range(polls):
        if predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition never held")


def fast_fabric_rules() -> str:
    """rules/fabric.yaml's rdma-port-down as shipped, with its holds shortened to fit a test."""
    doc = yaml.safe_load((REPO / "rules" / "fabric.yaml").read_text())
    (rule,) = [r for r in doc["rules"] if r["id"] == "rdma-port-down"]
    rule["for"], rule["resolve"] = "0s", {"for": "0s"}
    return yaml.safe_dump({"rules": [rule]})


async def test_a_port_down_on_the_node_is_one_incident_naming_the_port_and_it_resolves(
    harness: Harness, tmp_path: pathlib.Path
) -> None:
    (harness.rules / "dbe.yaml").unlink()
    (harness.rules / "fabric.yaml").write_text(fast_fabric_rules())
    actuator = testing.RecordingActuator()
    await harness.controller(actuator)
    root = rdma.write_tree((FIXTURES / "cx7-ib-link-down.txt").read_text(), tmp_path / "sys")
    bus = await natsbus.NatsBus.connect(harness.srv.url, name="agent-n1")
    agent = daemon.Agent(
        node="n1", source=node_source.SimSource("n1", gpus=2), bus=bus, state_dir=tmp_path / "agent",
        interval_s=0.1, ports=rdma.PortReader(root),
    )  # fmt: skip
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))

    def changes() -> list[str]:
        return [e.change for e in harness.feed.events]

    try:
        await _until(lambda: "opened" in changes() and actuator.executed("cordon"))
        rdma.write_tree((FIXTURES / "cx7-ib-healthy.txt").read_text(), root)  # the link trained up
        await _until(lambda: "resolved" in changes() and actuator.executed("uncordon"))
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await bus.close()
    events = [e for e in harness.feed.events if e.change == "opened"]
    assert len(events) == 1, "one incident for the node and port, not one per frame or port reading"
    incident = events[0].data
    assert (incident.rule_id, incident.node, incident.gpu_index) == ("rdma-port-down", "n1", None)
    assert incidents.port_of(incident) == "mlx5_3/1"
    assert events[0].subject == "node/n1/port/mlx5_3/1"
    assert [r.node for r in actuator.executed("cordon")] == ["n1"]
