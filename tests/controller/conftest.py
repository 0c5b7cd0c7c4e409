"""Controller test harness: a real nats-server, a rules directory, frames published like agents do."""

from __future__ import annotations

import asyncio
import pathlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from healer import config, testing
from healer.actuators import base as actuators
from healer.bus import base, embedded, provision, subjects
from healer.bus import nats as natsbus
from healer.controller.core import service
from healer.controller.observability import metrics as controller_metrics
from healer.schemas import codec, incidents, telemetry
from healer.sim import node_source
from tests import conftest

DBE_RULES = """
rules:
  - id: ecc-dbe
    description: new double-bit ECC error
    scope: gpu
    when: increase(ecc_dbe_volatile[10m]) > 0
    severity: critical
    actions: [cordon, migrate]
    resolve: {when: "ecc_dbe_volatile == 0", for: 0s}
    on_resolve: [uncordon]
"""

LEASE_TTL_S = 2.0


class Fleet:
    """Publishes NodeFrames for a few nodes, with per-(node, gpu) overrides (the injected faults)."""

    def __init__(self, bus: base.Bus, nodes: list[str]) -> None:
        self.bus = bus
        self.subj = subjects.Subjects()
        self.nodes = nodes
        self.sources = {n: node_source.SimSource(n, gpus=2, seed=i) for i, n in enumerate(nodes)}
        self.overrides: dict[tuple[str, int], dict[str, Any]] = {}
        self.seq = 0

    def frame(self, node: str) -> telemetry.NodeFrame:
        src = self.sources[node]
        gpus = [g.model_copy(update=self.overrides.get((node, g.index), {})) for g in src.sample().gpus]
        return telemetry.NodeFrame(
            node=node, ts=time.time(), seq=self.seq, boot_id="b", agent_version="t", source="sim",
            gpus_expected=2, gpus=gpus,
        )  # fmt: skip

    async def publish(self) -> None:
        self.seq += 1
        for node in self.sources:
            await self.bus.publish(self.subj.telemetry(node), codec.encode(self.frame(node)))


class Feed:
    """Collects the incident feed from a core subscription (in order of publication), each event id once:
    a new leader puts the last change of every incident out again (``FeedPublisher.resend``), which the
    stream drops as a duplicate (``Nats-Msg-Id``) but a core subscription still sees."""

    def __init__(self) -> None:
        self.events: list[incidents.IncidentEvent] = []
        self.ids: set[str] = set()

    async def __call__(self, msg: base.Msg) -> None:
        if msg.subject.startswith(("healer.incidents.rules", "healer.incidents.shadow")):
            return  # not incidents: a rule reload's rejection, a shadow pool's would-be anomaly incident
        event = codec.decode_incident(msg.data)
        if event.id not in self.ids:
            self.ids.add(event.id)
            self.events.append(event)

    def changes(self, node: str | None = None) -> list[str]:
        return [e.change for e in self.events if node is None or e.data.node == node]


class Dead:
    """A crashed controller's actuator (``Harness.crash``): a request sent after the crash never arrives
    anywhere and is never answered."""

    name = "dead"

    async def apply(self, request: actuators.ActionRequest) -> actuators.ActionOutcome:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


class Harness:
    def __init__(self, srv: embedded.EmbeddedServer, tmp: pathlib.Path) -> None:
        self.srv = srv
        self.tmp = tmp
        self.rules = tmp / "rules"
        self.rules.mkdir()
        (self.rules / "dbe.yaml").write_text(DBE_RULES)
        self.controllers: list[tuple[service.Controller, natsbus.NatsBus]] = []
        self.feed = Feed()

    def settings(self, **controller: Any) -> config.Settings:
        return config.Settings(
            nats=config.NatsSettings(url=self.srv.url, lease_ttl_s=LEASE_TTL_S),
            controller=config.ControllerSettings.model_validate(
                {"rules_dir": str(self.rules), "tick_s": 0.2, "reload_check_s": 0.3, "mode": "enforce",
                 "uncordon_hold_s": 0, "admission": "first-seen", **controller}
            ),
        )  # fmt: skip

    async def setup(self) -> natsbus.NatsBus:
        self.bus = await natsbus.NatsBus.connect(self.srv.url, name="harness")
        await provision.ensure(self.bus, subjects.Subjects(), config.NatsSettings(lease_ttl_s=LEASE_TTL_S))
        await self.bus.subscribe("healer.incidents.>", self.feed)
        return self.bus

    async def controller(
        self, actuator: testing.RecordingActuator, gpu: Any = None, **controller: Any
    ) -> service.Controller:
        """A controller on its own connection; ``gpu``: its GPU recovery actuator (recovery ladders)."""
        bus = await natsbus.NatsBus.connect(self.srv.url, name=f"controller-{len(self.controllers)}")
        ctl = await service.build(self.settings(**controller), bus, scheduler=actuator, gpu=gpu)
        await ctl.start()
        self.controllers.append((ctl, bus))
        return ctl

    async def crash(self, ctl: service.Controller) -> None:
        """Stop a controller the way SIGKILL would: no lease release, no goodbye. Cancellation is
        repeated until every task is done (Python 3.11's wait_for can swallow one that races with its
        own timeout); a task that still ignores it fails the test by name instead of hanging it. A task
        that swallowed one runs on meanwhile (a tick whose KV reply came as it was cancelled goes on to
        its retries and spawns again the action whose task was just cancelled), so first, before any
        await, the controller's actuators become a dead process's (``Dead``): an action started from now
        on reaches none of the test's actuators. (One that chose its actuator before the crash and then
        swallowed its cancellation in the rate window's write could still reach it.)"""
        runner = ctl.actions
        runner.scheduler, runner.gpu, runner.power = Dead(), Dead(), Dead()
        tasks: set[asyncio.Task[Any]] = set()
        pending: list[asyncio.Task[Any]] = []
        for _ in range(50):
            # every action task (an incident's earlier one, chained before, included), taken again each
            # round: a tick cancelled at its next await may have spawned one before it got there
            tasks |= {*ctl.supervisor.tasks, *ctl.actions.jobs.tasks}
            pending = [t for t in tasks if not t.done()]
            if not pending:
                break
            for t in pending:
                t.cancel()
            await asyncio.wait(pending, timeout=0.2)
        tasks |= {*ctl.supervisor.tasks, *ctl.actions.jobs.tasks}
        assert not [t for t in tasks if not t.done()], f"tasks ignore cancellation: {pending}"
        for c, bus in self.controllers:
            if c is ctl:
                await asyncio.wait_for(bus.nc.close(), 10)
                telemetry_bus = c.ingest.telemetry_bus
                if telemetry_bus is not bus:
                    assert isinstance(telemetry_bus, natsbus.NatsBus), "the harness's controllers run on NATS"
                    await asyncio.wait_for(telemetry_bus.nc.close(), 10)

    async def close(self) -> None:
        for ctl, bus in self.controllers:
            if not bus.nc.is_closed:
                await ctl.stop()
                await bus.close()
        await self.bus.close()


async def run_until(fleet: Fleet, predicate: Callable[[], bool], timeout: float = 15.0) -> None:
    """Keep publishing frames (as agents do, every 0.2 s) until ``predicate`` holds."""
    async with asyncio.timeout(timeout):
        while not predicate():
            await fleet.publish()
            await asyncio.sleep(0.2)


async def warm(fleet: Fleet, frames: int = 3) -> None:
    """A few healthy frames first, so counters have a baseline to increase from."""
    for _ in range(frames):
        await fleet.publish()
        await asyncio.sleep(0.2)


@pytest.fixture
async def harness(nats_server: embedded.EmbeddedServer, tmp_path: pathlib.Path) -> AsyncIterator[Harness]:
    h = Harness(nats_server, tmp_path)
    await h.setup()
    try:
        yield h
    finally:
        await h.close()


__all__ = ["Feed", "Fleet", "Harness", "conftest", "run_until", "warm"]


def metric(metrics: controller_metrics.ControllerMetrics, name: str, **labels: str) -> float:
    """``healer_controller_<name>`` as a scrape reads it (``tests.conftest.sample``)."""
    return conftest.sample(metrics.registry, f"healer_controller_{name}", **labels)
