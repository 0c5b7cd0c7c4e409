"""Shared fixtures: real nats-servers (single and a 3-node cluster) on free loopback ports.

Each fixture starts its own server from the venv's nats-server binary, in a temporary state directory,
and stops it (by its own PID) afterwards, whatever the test did.
"""

from __future__ import annotations

import pathlib
from collections.abc import AsyncIterator, Iterator

import pytest

from healer import config
from healer.bus import memory, provision, server, subjects
from healer.bus import nats as natsbus


@pytest.fixture
def nats_server(tmp_path: pathlib.Path) -> Iterator[server.EmbeddedServer]:
    srv = server.EmbeddedServer(tmp_path / "nats")
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def nats_cluster(tmp_path: pathlib.Path) -> Iterator[server.EmbeddedCluster]:
    cluster = server.EmbeddedCluster(tmp_path / "cluster", size=3)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def subj() -> subjects.Subjects:
    return subjects.Subjects()


@pytest.fixture
async def nats_bus(
    nats_server: server.EmbeddedServer, subj: subjects.Subjects
) -> AsyncIterator[natsbus.NatsBus]:
    """A connected, provisioned NatsBus on a fresh server."""
    bus = await natsbus.NatsBus.connect(nats_server.url, name="test")
    await provision.ensure(bus, subj, config.NatsSettings())
    try:
        yield bus
    finally:
        await bus.close()


def make_memory_bus(subj: subjects.Subjects) -> memory.MemoryBus:
    """A MemoryBus with the same streams as a provisioned server."""
    bus = memory.MemoryBus()
    bus.add_stream(subj.stream_telemetry, [subj.all_telemetry])
    bus.add_stream(subj.stream_events, [subj.all_events])
    bus.add_stream(subj.stream_incidents, [subj.all_incidents])
    return bus


@pytest.fixture
async def memory_bus(subj: subjects.Subjects) -> AsyncIterator[memory.MemoryBus]:
    bus = make_memory_bus(subj)
    try:
        yield bus
    finally:
        await bus.close()
