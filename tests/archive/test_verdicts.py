"""Operators' verdicts: ``healer incidents verdict`` publishes one on the feed, the archive keeps it, and
precision per rule is computed from the latest verdict of each incident."""

from __future__ import annotations

import asyncio
import pathlib
import sys
import time

from healer import config
from healer.archive import consumer, figures, store
from healer.bus import embedded
from healer.bus import nats as natsbus
from healer.feed import envelope, tail
from healer.schemas import codec, verdicts
from tests import conftest
from tests.feed import helpers

FAST = config.FeedSettings(retry_initial_delay_s=0.02, retry_max_delay_s=0.2, fetch_timeout_s=0.3)


async def verdict(url: str, *args: str) -> str:
    p = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "healer", "incidents", "verdict", "--nats", url, *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(p.communicate(), 30)
    assert p.returncode == 0, err.decode()
    return out.decode()


async def archive_all(bus: natsbus.NatsBus, db: store.Archive, events: int) -> None:
    archiver = consumer.Archiver(bus, helpers.SUBJ, db, FAST)
    stop = asyncio.Event()
    task = asyncio.create_task(archiver.run(stop))
    try:
        await conftest.until(lambda: archiver.counts.stored + archiver.counts.duplicates >= events)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


def precision(db: store.Archive) -> object:
    return figures.build(db, figures.Options(end=time.time() + 60, since_s=3600))["precision"]


async def test_a_verdict_is_published_archived_and_the_latest_one_counts(
    nats_bus: natsbus.NatsBus, nats_server: embedded.EmbeddedServer, tmp_path: pathlib.Path
) -> None:
    for n in range(3):
        await helpers.publish(nats_bus, helpers.event(n))  # rule ecc-uncorrectable, incidents inc-0..2
    out = await verdict(nats_server.url, "inc-0", "--false-alarm", "--note", "a loose fan", "--by", "ana")
    assert out.startswith("false-alarm on inc-0 published as verdict-")
    await verdict(nats_server.url, "inc-1", "--confirmed")
    db = store.Archive(tmp_path / "a.db")
    await archive_all(nats_bus, db, 5)
    rows = [tuple(r) for r in db.rows("SELECT incident_id, verdict, by, note FROM verdicts ORDER BY time")]
    assert rows[0] == ("inc-0", "false-alarm", "ana", "a loose fan")
    assert rows[1][:2] == ("inc-1", "confirmed")
    assert precision(db) == [
        {"rule_id": "ecc-uncorrectable", "confirmed": 1, "false_alarms": 1, "precision": 0.5}
    ]

    await verdict(nats_server.url, "inc-0", "--confirmed", "--note", "it was the GPU after all")
    await archive_all(nats_bus, db, 1)
    assert precision(db) == [
        {"rule_id": "ecc-uncorrectable", "confirmed": 2, "false_alarms": 0, "precision": 1.0}
    ]
    db.close()


def test_feed_consumers_take_a_verdict_as_a_verdict_not_as_a_malformed_incident() -> None:
    data = verdicts.VerdictData(incident_id="inc-7", verdict=verdicts.Verdict.CONFIRMED, by="ana")
    item = envelope.classify(codec.encode(verdicts.build(cluster="c", data=data, ts=1.0, event_id="v-1")))
    assert item.incident is None
    assert item.verdict is not None
    assert (item.verdict.id, item.verdict.data.verdict, item.verdict.subject) == (
        "v-1",
        verdicts.Verdict.CONFIRMED,
        "incident/inc-7",
    )


def test_tail_prints_a_verdict_as_one_line() -> None:
    data = verdicts.VerdictData(
        incident_id="inc-7", verdict=verdicts.Verdict.FALSE_ALARM, by="ana", note="a\nfan"
    )
    item = envelope.classify(codec.encode(verdicts.build(cluster="c", data=data, ts=0.0)))
    assert tail.render(item) == "1970-01-01T00:00:00Z verdict false-alarm inc-7 by ana: a fan"
