"""The recovery ladder driven by the controller on the real one-host Slurm: XID 79 → drain and requeue →
``scontrol reboot ASAP nextstate=DOWN`` → the reboot completes for real (RebootProgram restarts the
node's slurmd with -b) → validation (the GPU agent's part, a recording fake here: no GPU) → resume →
the incident resolves ``recovered``."""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import AsyncIterator

import pytest

from healer import testing
from healer.bus import base, embedded, subjects
from healer.bus import nats as natsbus
from healer.controller.core import service
from healer.schemas import codec, incidents
from tests.slurm.cluster import SlurmCluster
from tests.slurm.test_end_to_end import eventually, start_controller, xid
from tests.slurm.test_slurm_actuator import cluster, job_state, node_line, submit  # noqa: F401

pytestmark = pytest.mark.slurm

RULES = """
rules:
  - id: xid-fatal
    description: GPU fell off the bus (XID 79)
    scope: gpu
    on_event: {kind: xid, xid: [79]}
    severity: critical
    actions: [cordon, migrate]
    resolve: {for: 1h}
ladders:
  - id: reboot
    rules: [xid-fatal]
    steps: [reboot_node]
    soak: 0s
    dcgm_level: 0
    repeat_limit: {count: 3, within: 30d}
"""


@pytest.fixture
async def healing(
    cluster: SlurmCluster,  # noqa: F811
    nats_server: embedded.EmbeddedServer,
    tmp_path: pathlib.Path,
) -> AsyncIterator[tuple[service.Controller, natsbus.NatsBus, testing.RecordingGpuActuator]]:
    gpu = testing.RecordingGpuActuator()
    ctl, bus = await start_controller(cluster, nats_server, tmp_path, RULES, gpu=gpu)
    try:
        yield ctl, bus, gpu
    finally:
        await ctl.stop()
        await bus.close()


async def test_xid79_walks_the_reboot_ladder_on_slurm_and_the_node_returns(
    cluster: SlurmCluster,  # noqa: F811
    healing: tuple[service.Controller, natsbus.NatsBus, testing.RecordingGpuActuator],
) -> None:
    ctl, bus, gpu = healing
    node = "gpu04"
    job_id = await asyncio.to_thread(submit, cluster, "--requeue", "-w", node)
    reboots = cluster.state_dir / "log" / "reboots.log"
    before = reboots.read_text().count(node) if reboots.exists() else 0
    resolved: list[incidents.IncidentData] = []

    async def feed(msg: base.Msg) -> None:
        resolved.append(codec.decode_incident(msg.data).data)

    await bus.subscribe(subjects.Subjects().incident(incidents.Change.RESOLVED, node), feed)
    await eventually("controller leads", lambda: ctl.leader)
    await xid(bus, node)
    await eventually("the job requeued off the node", lambda: job_state(cluster, job_id)[1] != node, 60)
    await eventually(
        "the node rebooted for real",
        lambda: reboots.exists() and reboots.read_text().count(node) > before,
        90,
    )
    await eventually("the incident resolved", lambda: bool(resolved), 90)
    await eventually("the node back in service", lambda: node_line(cluster, node)[1] in ("", "none"), 30)
    assert node_line(cluster, node)[0].rstrip("*") in ("idle", "allocated", "mixed")
    assert [r.kind for r in gpu.executed()] == ["validate"], "validated after the reboot, no GPU reset rung"
    (done,) = resolved
    assert done.evidence["outcome"] == "recovered"
    kinds = [a.kind for a in done.actions]
    assert kinds == ["cordon", "migrate", "reboot_node", "validate", "return_to_service"], kinds
    assert all(a.status == "done" for a in done.actions), [(a.kind, a.status, a.detail) for a in done.actions]
