"""A port fault walks the fabric ladder's link-reset rung end to end (#26): a real nats-server, the real
agent process reading a recorded ConnectX-7 sysfs tree with mlx5_3/1 down, the controller with the real
node recovery actuator (reset_port and validate go to the agent over NATS, fenced), and the agent's
bounce command replaced by a small script that rewrites the tree's port files as the kernel would.

- The link comes back: the port incident is drained, its link reset, the port read ACTIVE at its peers'
  400 Gb/s, validated by the agent, and the node returned, with no reboot.
- The link does not come back: the reset fails within its time, the ladder reboots the node (the
  scheduler's reboot lets the links train again), validates and returns it."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import subprocess
import sys

import yaml

from healer import config
from healer.actuators import gpu_reset
from healer.schemas import incidents
from healer.telemetry import rdma
from tests.agent import test_port_reset as agent_tests
from tests.controller import test_port_incidents as port_tests
from tests.controller.conftest import Harness

REPO = pathlib.Path(__file__).resolve().parents[2]


def fabric_rules() -> str:
    """rules/fabric.yaml's rdma-port-down and rules/ladders.yaml's fabric ladder as shipped, their holds
    and soak shortened to fit a test."""
    doc = yaml.safe_load((REPO / "rules" / "fabric.yaml").read_text())
    (rule,) = [r for r in doc["rules"] if r["id"] == "rdma-port-down"]
    rule["for"], rule["resolve"] = "0s", {"for": "0s"}
    ladders = yaml.safe_load((REPO / "rules" / "ladders.yaml").read_text())["ladders"]
    (fabric,) = [lad for lad in ladders if lad["id"] == "fabric"]
    assert fabric["steps"] == ["reset_port", "reboot_node"], "the pack's ladder, as shipped"
    fabric["rules"], fabric["soak"] = ["rdma-port-down"], "0s"
    return yaml.safe_dump({"rules": [rule], "ladders": [fabric]})


async def walk(
    harness: Harness, tmp_path: pathlib.Path, bounce: str
) -> tuple[incidents.IncidentData, list[list[str]], port_tests.Drains]:
    """Run the ladder for mlx5_3/1 with the bounce script told ``bounce``; the resolved incident, the
    bounce calls and the scheduler."""
    (harness.rules / "dbe.yaml").unlink()
    (harness.rules / "fabric.yaml").write_text(fabric_rules())
    root = rdma.write_tree(port_tests.tree("cx7-ib-link-down.txt"), tmp_path / "sys")
    script, log = tmp_path / "bounce.py", tmp_path / "calls"
    script.write_text(agent_tests.BOUNCE)

    def reboot() -> None:  # the node comes back with its port up
        rdma.write_tree(port_tests.tree("cx7-ib-healthy.txt"), root)

    sched = port_tests.Drains(on_reboot=reboot)
    settings = config.ActuatorSettings(port_reset_timeout_s=1.0, retry_attempts=1)
    await harness.controller(sched, gpu=gpu_reset.GpuRecoveryActuator(harness.bus, settings=settings))
    template = [[sys.executable, str(script), str(root), str(log), "{device}", "{port}", "-", bounce]]
    env = {
        **os.environ, "HEALER_AGENT_SYSFS_ROOT": str(root), "HEALER_LOG_FORMAT": "json",
        "HEALER_AGENT_PORT_RESET_INFINIBAND": json.dumps(template),
    }  # fmt: skip
    agent = subprocess.Popen(  # noqa: ASYNC220 - started once, then only awaited on
        [sys.executable, "-m", "healer", "agent", "--nats", harness.srv.url, "--node", "ib-node",
         "--source", "sim", "--sim-gpus", "2", "--interval", "0.1", "--state-dir", str(tmp_path / "state")],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        await port_tests.until(lambda: bool(port_tests.port_events(harness, "resolved")))
    except AssertionError as e:
        last = port_tests.port_events(harness)[-1:] or harness.feed.events[-1:]
        seen = [(a.kind, a.status, a.detail) for ev in last for a in ev.data.actions]
        raise AssertionError(f"not resolved; last: {seen} {[ev.data.evidence for ev in last]}") from e
    finally:
        agent.terminate()
        await asyncio.to_thread(agent.wait, 20)
    (resolved,) = port_tests.port_events(harness, "resolved")
    return resolved.data, agent_tests.calls(log), sched


def steps(data: incidents.IncidentData) -> list[tuple[str, str | None]]:
    return [(a.kind, a.status) for a in data.actions]


async def test_a_port_fault_is_drained_its_link_reset_and_the_node_returned_without_a_reboot(
    harness: Harness, tmp_path: pathlib.Path
) -> None:
    data, calls, sched = await walk(harness, tmp_path, "up:400")
    assert incidents.port_of(data) == "mlx5_3/1"
    assert data.evidence["outcome"] == "recovered"
    assert steps(data) == [
        ("cordon", "done"), ("migrate", "done"), ("reset_port", "done"), ("validate", "done"),
        ("return_to_service", "done"),
    ]  # fmt: skip
    assert calls == [["mlx5_3", "1", "-", "up:400"]], "the agent bounced that port once"
    reset = next(a for a in data.actions if a.kind == "reset_port")
    assert "mlx5_3/1 back: ACTIVE LinkUp 400 Gb/s" in reset.detail
    assert not sched.executed("reboot_node"), "no reboot"
    assert [(k, s, d) for k, s, d in sched.drains if k in ("cordon", "uncordon")] == [
        ("cordon", "done", True), ("uncordon", "done", False),
    ]  # fmt: skip


async def test_a_port_that_does_not_come_back_after_its_reset_has_the_node_rebooted(
    harness: Harness, tmp_path: pathlib.Path
) -> None:
    data, calls, sched = await walk(harness, tmp_path, "stuck")
    assert data.evidence["outcome"] == "recovered"
    assert steps(data) == [
        ("cordon", "done"), ("migrate", "done"), ("reset_port", "failed-permanent"), ("reboot_node", "done"),
        ("validate", "done"), ("return_to_service", "done"),
    ]  # fmt: skip
    assert calls == [["mlx5_3", "1", "-", "stuck"]]
    reset = next(a for a in data.actions if a.kind == "reset_port")
    assert "mlx5_3/1 did not come back in 1.0s: not up: DOWN Polling" in reset.detail
    assert [r.kind for r in sched.executed("reboot_node")] == ["reboot_node"], "the node rebooted once"
