"""``healer archive`` against a real nats-server: replays, restarts and outages add nothing twice and
lose nothing."""

from __future__ import annotations

import asyncio
import pathlib
import sqlite3
from collections.abc import AsyncIterator

import pytest

from healer import config, errors
from healer.archive import consumer, store
from healer.bus import embedded
from healer.bus import nats as natsbus
from healer.schemas import incidents
from tests import conftest
from tests.feed import helpers

FAST = config.FeedSettings(
    retry_initial_delay_s=0.02, retry_max_delay_s=0.2, fetch_timeout_s=0.3, ack_wait_s=5.0
)


class Running:
    def __init__(self, archiver: consumer.Archiver) -> None:
        self.archiver = archiver
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(archiver.run(self.stop))

    async def finish(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, 10)


@pytest.fixture
async def running() -> AsyncIterator[list[Running]]:
    started: list[Running] = []
    try:
        yield started
    finally:
        for r in started:
            if not r.task.done():
                await r.finish()


def lifecycle(n: int) -> list[incidents.IncidentEvent]:
    """Incident ``inc-<n>``: opened, a cordon done, resolved; event ids ``ev-<n>-<k>``."""
    out = []
    cordon = incidents.ActionRecord(kind="cordon", status="done", at=1000.0 + n)
    changes: tuple[incidents.Change, ...] = (
        incidents.Change.OPENED,
        incidents.Change.ACTION,
        incidents.Change.RESOLVED,
    )
    for k, change in enumerate(changes):
        ev = helpers.event(n, change=change, actions=[cordon] if k else None)
        data = ev.data.model_copy(
            update={
                "state": incidents.IncidentState.RESOLVED
                if change is incidents.Change.RESOLVED
                else incidents.IncidentState.OPEN
            }
        )
        out.append(ev.model_copy(update={"id": f"ev-{n}-{k}", "data": data}))
    return out


def start(
    bus: natsbus.NatsBus, db: store.Archive, running: list[Running], durable: str = consumer.DURABLE
) -> Running:
    run = Running(consumer.Archiver(bus, helpers.SUBJ, db, FAST, durable=durable))
    running.append(run)
    return run


async def test_a_restart_and_a_full_replay_add_nothing_twice(
    nats_bus: natsbus.NatsBus, tmp_path: pathlib.Path, running: list[Running]
) -> None:
    for ev in lifecycle(0):
        await helpers.publish(nats_bus, ev)
    db = store.Archive(tmp_path / "archive.db")
    first = start(nats_bus, db, running)
    await conftest.until(lambda: first.archiver.counts.stored == 3)
    await first.finish()

    for ev in lifecycle(1):
        await helpers.publish(nats_bus, ev)
    again = start(nats_bus, db, running)  # the same durable: carries on where the first stopped
    await conftest.until(lambda: again.archiver.counts.stored == 3)
    await again.finish()
    assert again.archiver.counts.duplicates == 0

    replay = start(nats_bus, db, running, durable="archive-replay")  # a new consumer: the whole stream
    await conftest.until(lambda: replay.archiver.counts.duplicates == 6)
    await replay.finish()
    assert replay.archiver.counts.stored == 0
    assert (db.count("events"), db.count("incidents"), db.count("actions")) == (6, 2, 2)
    resolved = list(db.rows("SELECT incident_id, state, resolved_at, contained_at FROM incidents"))
    assert sorted((r["incident_id"], r["state"]) for r in resolved) == [
        ("inc-0", "resolved"),
        ("inc-1", "resolved"),
    ]
    assert sorted(r["contained_at"] for r in resolved) == [1000.0, 1001.0]
    db.close()


async def test_a_nats_outage_loses_nothing(
    nats_bus: natsbus.NatsBus,
    nats_server: embedded.EmbeddedServer,
    tmp_path: pathlib.Path,
    running: list[Running],
) -> None:
    db = store.Archive(tmp_path / "archive.db")
    run = start(nats_bus, db, running)
    for ev in lifecycle(0):
        await helpers.publish(nats_bus, ev)
    await conftest.until(lambda: run.archiver.counts.stored == 3)
    nats_server.stop()
    await conftest.until(lambda: not nats_bus.connected)
    nats_server.start()
    await conftest.until(lambda: nats_bus.connected, timeout=20)
    for ev in lifecycle(1):
        await helpers.publish(nats_bus, ev)
    await conftest.until(lambda: run.archiver.counts.stored == 6, timeout=30)
    await run.finish()
    ids = [r["id"] for r in db.rows("SELECT id FROM events ORDER BY stream_seq")]
    assert ids == [f"ev-{n}-{k}" for n in range(2) for k in range(3)]
    db.close()


async def test_junk_on_the_feed_is_skipped_and_other_cloudevents_are_kept(
    nats_bus: natsbus.NatsBus, tmp_path: pathlib.Path, running: list[Running]
) -> None:
    await helpers.publish_raw(nats_bus, "healer.incidents.opened.x", b"not json")
    other = (
        b'{"specversion":"1.0","id":"o-1","source":"s","type":"com.example.thing",'
        b'"time":"2026-01-01T00:00:00Z"}'
    )
    await helpers.publish_raw(nats_bus, "healer.incidents.other.x", other)
    await helpers.publish(nats_bus, lifecycle(0)[0])
    db = store.Archive(tmp_path / "archive.db")
    run = start(nats_bus, db, running)
    await conftest.until(lambda: run.archiver.counts.stored == 2)
    await run.finish()
    assert run.archiver.counts.malformed == 1
    assert sorted(r["type"] for r in db.rows("SELECT type FROM events")) == [
        "com.example.thing",
        "io.healer.incident.opened.v1",
    ]
    db.close()


async def test_a_batch_that_cannot_be_written_is_not_acknowledged_and_comes_again(
    nats_bus: natsbus.NatsBus, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await helpers.publish(nats_bus, lifecycle(0)[0])
    db = store.Archive(tmp_path / "archive.db")
    settings = FAST.model_copy(update={"ack_wait_s": 1.0})

    def disk_full(*_: object) -> bool:
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(db, "add_incident", disk_full)
    failing = consumer.Archiver(nats_bus, helpers.SUBJ, db, settings)
    with pytest.raises(errors.PermanentError, match="disk is full"):
        await asyncio.wait_for(failing.run(asyncio.Event()), 10)
    monkeypatch.undo()
    assert db.count("events") == 0  # rolled back
    again = Running(consumer.Archiver(nats_bus, helpers.SUBJ, db, settings))
    try:
        await conftest.until(lambda: again.archiver.counts.stored == 1)  # redelivered after the ack wait
    finally:
        await again.finish()
    assert db.count("incidents") == 1
    db.close()
