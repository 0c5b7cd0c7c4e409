"""A controller always starts again (#38): provisioning looks a stream up before it creates it, so a
restart, a standby and a second ``healer nats provision`` never need more room than the streams already
hold. Real nats-servers whose ``max_file_store`` equals healer's reservation exactly, a single server and
a 3-node cluster; each controller is the real one (``run_controller``: connect, provision, lead)."""

from __future__ import annotations

import asyncio
import dataclasses
import pathlib
from collections.abc import AsyncIterator

import pytest
import structlog.testing

from healer import config
from healer.bus import embedded, provision, subjects
from healer.bus import nats as natsbus
from healer.cli import controller_cmd
from healer.controller.observability import metrics
from healer.schemas import codec, events
from tests.conftest import sample
from tests.controller import test_storage
from tests.controller.conftest import LEASE_TTL_S, Feed, Fleet, run_until
from tests.controller.test_storage import MIB, XID_CORDON

pytestmark = pytest.mark.nats

SMALL = {**test_storage.SMALL, "telemetry_max_bytes": 16 * MIB}
"""test_storage's small limits, with telemetry at 16 MiB: 29 MiB reserved, the whole store."""


def nats_settings(url: str, replicas: int = 1, **limits: int) -> config.NatsSettings:
    return config.NatsSettings(url=url, lease_ttl_s=LEASE_TTL_S, replicas=replicas, **{**SMALL, **limits})


def reservation() -> int:
    """What healer's streams reserve with these limits: the exact store the servers get."""
    return nats_settings("nats://127.0.0.1:4222").reserved_bytes()


@dataclasses.dataclass
class Running:
    """One real controller process's main coroutine, stopped as SIGTERM stops it."""

    task: asyncio.Task[None]
    stop: asyncio.Event
    metrics: metrics.ControllerMetrics

    @property
    def started(self) -> bool:
        if self.task.done():
            self.task.result()  # exited: fail with its error
        return sample(self.metrics.registry, "healer_controller_rules_loaded") > 0

    @property
    def leads(self) -> bool:
        return sample(self.metrics.registry, "healer_controller_leader") == 1

    async def end(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, 20)


class Site:
    """A store sized to the reservation, its rules, a fleet publishing frames and the incident feed."""

    def __init__(self, url: str, tmp: pathlib.Path, replicas: int) -> None:
        self.url = url
        self.replicas = replicas
        self.rules = tmp / "rules"
        self.rules.mkdir()
        (self.rules / "xid.yaml").write_text(XID_CORDON)
        self.feed = Feed()
        self.running: list[Running] = []

    def settings(self, **limits: int) -> config.Settings:
        return config.Settings(
            nats=nats_settings(self.url, self.replicas, **limits),
            controller=config.ControllerSettings.model_validate(
                {"rules_dir": str(self.rules), "tick_s": 0.2, "reload_check_s": 0.3, "mode": "enforce",
                 "admission": "first-seen", "metrics_port": 0}
            ),
        )  # fmt: skip

    async def open(self) -> None:
        self.bus = await natsbus.NatsBus.connect(self.url, name="site")
        await provision.ensure(self.bus, subjects.Subjects(), nats_settings(self.url, self.replicas))
        await self.bus.subscribe("healer.incidents.>", self.feed)
        self.fleet = Fleet(self.bus, ["n1", "n2", "n3", "n4", "n5"])

    async def start(self, **limits: int) -> Running:
        stop = asyncio.Event()
        m = metrics.ControllerMetrics()
        task = asyncio.create_task(controller_cmd.run_controller(self.settings(**limits), stop, m))
        running = Running(task, stop, m)
        self.running.append(running)
        return running

    async def xid_acted_on(self, node: str) -> None:
        """A fatal XID on ``node`` gets its cordon action on the feed (whoever leads)."""
        xid = events.new(node, "xid", gpu_index=0, xid=79)
        await self.bus.publish_durable(subjects.Subjects().events(node), codec.encode(xid), msg_id=xid.id)

        def acted() -> bool:
            for r in self.running:
                if r.task.done():
                    r.task.result()  # a controller that exited fails the test with its error
            return any(
                e.change == "action"
                and e.data.node == node
                and any(a.kind == "cordon" for a in e.data.actions)
                for e in self.feed.events
            )

        await run_until(self.fleet, acted, timeout=45.0)

    async def close(self) -> None:
        for r in self.running:
            if not r.task.done():
                await r.end()
        await self.bus.close()


async def provision_twice(url: str, replicas: int) -> None:
    for _ in range(2):
        bus = await natsbus.NatsBus.connect(url, name="provision")
        try:
            plan = await provision.ensure(bus, subjects.Subjects(), nats_settings(url, replicas))
            assert plan.kept == ()
        finally:
            await bus.close()


async def restart_and_standby(site: Site) -> None:
    """Start, act, stop; start again, act; a standby beside it; the leader stops: the standby acts."""
    first = await site.start()
    await site.xid_acted_on("n1")
    await run_until(site.fleet, lambda: first.leads)  # the gauge follows /readyz's verdict, each second
    await first.end()

    again = await site.start()
    await site.xid_acted_on("n2")
    await run_until(site.fleet, lambda: again.leads)

    standby = await site.start()
    await run_until(site.fleet, lambda: standby.started, timeout=30.0)  # provisioned, rules loaded
    await site.xid_acted_on("n3")  # the standby started beside a leader, and healing goes on
    assert not standby.task.done()
    assert again.leads, "one leader"
    assert not standby.leads, "one leader"
    await again.end()
    await run_until(site.fleet, lambda: standby.leads, timeout=45.0)
    await site.xid_acted_on("n4")


@pytest.fixture
async def exact_server(tmp_path: pathlib.Path) -> AsyncIterator[embedded.EmbeddedServer]:
    srv = embedded.EmbeddedServer(tmp_path / "nats", max_file_store=str(reservation()))
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


async def test_a_store_sized_exactly_to_the_reservation_restarts_and_runs_a_standby(
    exact_server: embedded.EmbeddedServer, tmp_path: pathlib.Path
) -> None:
    await provision_twice(exact_server.url, replicas=1)
    site = Site(exact_server.url, tmp_path, replicas=1)
    await site.open()
    try:
        await restart_and_standby(site)
    finally:
        await site.close()


async def test_a_cluster_sized_exactly_to_the_reservation_restarts_and_runs_a_standby(
    tmp_path: pathlib.Path,
) -> None:
    cluster = embedded.EmbeddedCluster(tmp_path / "cluster", max_file_store=str(reservation()))
    cluster.start()
    try:
        await provision_twice(cluster.url, replicas=3)
        site = Site(cluster.url, tmp_path, replicas=3)
        await site.open()
        try:
            await restart_and_standby(site)
        finally:
            await site.close()
    finally:
        cluster.stop()


async def test_a_larger_limit_the_store_cannot_hold_is_one_line_and_the_controller_runs(
    exact_server: embedded.EmbeddedServer, tmp_path: pathlib.Path
) -> None:
    site = Site(exact_server.url, tmp_path, replicas=1)
    await site.open()
    try:
        grown = 64 * MIB  # the fleet grew: telemetry asks for four times its limit, which cannot fit
        bus = await natsbus.NatsBus.connect(exact_server.url, name="provision")
        try:
            with structlog.testing.capture_logs() as logs:
                plan = await provision.ensure(
                    bus, subjects.Subjects(), nats_settings(exact_server.url, telemetry_max_bytes=grown)
                )
            info = await bus.js.stream_info("HEALER_TELEMETRY")
        finally:
            await bus.close()
        assert plan.kept == (provision.KeptLimit("HEALER_TELEMETRY", grown, 16 * MIB),)
        assert info.config.max_bytes == 16 * MIB, "the old limit is kept"
        kept = [e for e in logs if e["event"] == "provision.limit_kept"]
        assert len(kept) == 1
        line = kept[0]["line"]
        assert "\n" not in line
        assert f"{grown}" in line, "both sizes named"
        assert f"{16 * MIB}" in line, "both sizes named"

        running = await site.start(telemetry_max_bytes=grown)  # the controller with the grown setting
        await site.xid_acted_on("n5")
        await run_until(site.fleet, lambda: running.leads)
    finally:
        await site.close()
