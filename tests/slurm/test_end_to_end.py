"""XID 79 on a real Slurm node, end to end: agent event → NATS → controller → Slurm drain + requeue →
incident resolves → node resumed. And an operator's drain is left alone throughout."""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from healer import config
from healer.actuators import slurm
from healer.bus import embedded, provision, subjects
from healer.bus import nats as natsbus
from healer.controller.core import service
from healer.schemas import codec, events
from tests.slurm.cluster import SlurmCluster
from tests.slurm.test_slurm_actuator import cluster, job_state, node_line, submit  # noqa: F401

RULES = """
rules:
  - id: xid-fatal
    description: GPU fell off the bus (XID 79)
    scope: gpu
    on_event: {kind: xid, xid: [79]}
    severity: critical
    actions: [cordon, migrate]
    resolve: {for: 4s}
    on_resolve: [uncordon]
"""


async def start_controller(
    cluster: SlurmCluster,  # noqa: F811
    nats_server: embedded.EmbeddedServer,
    tmp_path: pathlib.Path,
    rules_text: str,
    **build: Any,
) -> tuple[service.Controller, natsbus.NatsBus]:
    """A controller on the real Slurm with ``rules_text`` as its rules (``build``: e.g. ``gpu=``)."""
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "rules.yaml").write_text(rules_text)
    settings = config.Settings(
        nats=config.NatsSettings(url=nats_server.url),
        controller=config.ControllerSettings(
            rules_dir=str(rules), mode="enforce", tick_s=0.2, uncordon_hold_s=0
        ),
        actuators=config.ActuatorSettings(
            slurm_conf=str(cluster.conf), call_timeout_s=20, slurm_requeue_settle_s=5
        ),
    )
    bus = await natsbus.NatsBus.connect(nats_server.url, name="e2e")
    await provision.ensure(bus, subjects.Subjects(), settings.nats)
    ctl = await service.build(settings, bus, scheduler=slurm.SlurmActuator(settings.actuators), **build)
    await ctl.start()
    return ctl, bus


@pytest.fixture
async def controller(
    cluster: SlurmCluster,  # noqa: F811
    nats_server: embedded.EmbeddedServer,
    tmp_path: pathlib.Path,
) -> AsyncIterator[tuple[service.Controller, natsbus.NatsBus]]:
    ctl, bus = await start_controller(cluster, nats_server, tmp_path, RULES)
    try:
        yield ctl, bus
    finally:
        await ctl.stop()
        await bus.close()


async def xid(bus: natsbus.NatsBus, node: str) -> None:
    event = events.new(node, "xid", gpu_index=3, xid=79, message="GPU has fallen off the bus")
    await bus.publish_durable(subjects.Subjects().events(node), codec.encode(event), msg_id=event.id)


async def eventually(what: str, check: object, timeout_s: float = 30.0) -> None:
    assert callable(check)
    async with asyncio.timeout(timeout_s):
        while not await asyncio.to_thread(check):  # noqa: ASYNC110 - polling Slurm
            await asyncio.sleep(0.2)
    assert await asyncio.to_thread(check), what


async def test_xid79_drains_requeues_and_resumes_after_resolution(
    cluster: SlurmCluster,  # noqa: F811
    controller: tuple[service.Controller, natsbus.NatsBus],
) -> None:
    ctl, bus = controller
    job_id = await asyncio.to_thread(submit, cluster, "--requeue")
    node = job_state(cluster, job_id)[1]
    await eventually("controller leads", lambda: ctl.leader)
    await xid(bus, node)
    await eventually("node drained by healer", lambda: node_line(cluster, node)[1].startswith("healer: inc-"))
    assert node_line(cluster, node)[0] in ("drained", "draining")
    await eventually(
        "job pending again or running on another node",
        lambda: (
            job_state(cluster, job_id)[0] == "PENDING"
            or (job_state(cluster, job_id)[0] == "RUNNING" and job_state(cluster, job_id)[1] != node)
        ),
    )
    await eventually(
        "node resumed after the incident resolved",
        lambda: node_line(cluster, node)[1] in ("", "none"),
    )
    assert node_line(cluster, node)[0].rstrip("*") in ("idle", "allocated", "mixed")
    assert not ctl.book.open


async def test_an_operator_drained_node_is_left_alone(
    cluster: SlurmCluster,  # noqa: F811
    controller: tuple[service.Controller, natsbus.NatsBus],
) -> None:
    ctl, bus = controller
    cluster.run("scontrol", "update", "NodeName=gpu02", "State=DRAIN", "Reason=bad fan, ticket 4711")
    await eventually("controller leads", lambda: ctl.leader)
    await xid(bus, "gpu02")
    await eventually("incident opened and acted on", lambda: bool(ctl.book.open) and not ctl.tasks)
    await eventually(
        "incident resolved", lambda: not ctl.book.open and not ctl.book.resolving and not ctl.tasks
    )
    assert node_line(cluster, "gpu02") == ("drained", "bad fan, ticket 4711")
