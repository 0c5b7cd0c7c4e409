"""Archiving the incident feed: ``healer archive``, a durable consumer that writes every event to SQLite.

At-least-once and idempotent: a batch of events is fetched from a durable JetStream pull consumer,
written in one transaction, committed, and only then acknowledged. A crash between the commit and the
ack redelivers the batch, and the archive ignores ids it already holds (``store.Archive``), so a
restart, a redelivery or a replay of the whole stream adds nothing twice. While NATS is away the fetch
fails, the archiver waits (exponential back-off, ``feed.retry_*``) and sets the consumer up again; the
server kept what was not acknowledged, so nothing is lost.

Messages that are not CloudEvents are counted, logged and acknowledged (they never block the feed);
other CloudEvents on the feed (rule-file rejections, types a later controller adds) are kept in the
``events`` table as they are.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
from typing import Literal

import prometheus_client as prom
import structlog

from healer import config, errors
from healer.archive import store
from healer.bus import base, subjects
from healer.feed import envelope

log = structlog.get_logger(__name__)

DURABLE = "healer-archive"
"""The archive's durable consumer, unless ``--durable`` names another."""
BATCH = 64
"""Events written per transaction at most (and unacknowledged at once)."""
ACK_TIMEOUT_S = 5.0


@dataclasses.dataclass
class Counts:
    """What the archiver did, for logs and tests (``healer_archive_events_total{result}`` on /metrics)."""

    stored: int = 0
    duplicates: int = 0
    malformed: int = 0
    batches: int = 0


RESULTS = ("stored", "duplicate", "malformed")


class Archiver:
    def __init__(
        self,
        bus: base.Bus,
        subj: subjects.Subjects,
        archive: store.Archive,
        settings: config.FeedSettings,
        *,
        durable: str = DURABLE,
        start: Literal["all", "new"] = "all",
        batch: int = BATCH,
        registry: prom.CollectorRegistry | None = None,
    ) -> None:
        self.bus = bus
        self.subj = subj
        self.archive = archive
        self.settings = settings
        self.durable = durable
        self.start = start
        self.batch = batch
        self.counts = Counts()
        self.events = prom.Counter(
            "healer_archive_events_total",
            "feed messages archived (stored), already in the archive (duplicate), or not CloudEvents",
            ["result"],
            registry=registry if registry is not None else prom.CollectorRegistry(),
        )
        for result in RESULTS:
            self.events.labels(result)
        self.log = log.bind(durable=durable)
        self.consumer: base.PullConsumer | None = None

    async def run(self, stop: asyncio.Event) -> None:
        """Archive until ``stop`` is set."""
        loop = asyncio.create_task(self._loop(stop), name="healer-archive")
        waiter = asyncio.create_task(stop.wait(), name="healer-archive-stop")
        try:
            await asyncio.wait({loop, waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (loop, waiter):
                task.cancel()
            await asyncio.gather(loop, waiter, return_exceptions=True)
            await self._unbind()
        if not loop.cancelled() and (failed := loop.exception()) is not None:
            raise failed

    async def _loop(self, stop: asyncio.Event) -> None:
        """Fetch, write, acknowledge until ``stop``; it checks ``stop`` itself as well as being cancelled,
        because a cancellation that lands as a pull completes can be lost inside the client (Python 3.11's
        ``wait_for``), and the loop would then run on and hold up the stop."""
        failures = 0
        while not stop.is_set():
            try:
                if self.consumer is None:
                    consumer = self.bus.pull_consumer(
                        self.subj.stream_incidents, self.subj.all_incidents, durable=self.durable,
                        ack_wait_s=self.settings.ack_wait_s, max_ack_pending=self.batch, start=self.start,
                        description="healer archive: the incident feed into SQLite",
                    )  # fmt: skip
                    await consumer.ensure()
                    self.consumer = consumer
                msgs = await self.consumer.fetch(self.batch, timeout=self.settings.fetch_timeout_s)
            except errors.HealerError as e:
                failures += 1
                self.log.warning("archive.fetch_failed", error=repr(e), failures=failures)
                if isinstance(e, base.NotFound):
                    await self._unbind()
                s = self.settings
                await asyncio.sleep(
                    min(s.retry_initial_delay_s * 2 ** min(failures, 16), s.retry_max_delay_s)
                )
                continue
            failures = 0
            if msgs:
                await self._handle(msgs)

    async def _unbind(self) -> None:
        consumer, self.consumer = self.consumer, None
        if consumer is not None:
            await consumer.close()

    async def _handle(self, msgs: list[base.StreamMsg]) -> None:
        try:
            for msg in msgs:
                self._write(msg)
            self.archive.commit()
        except sqlite3.Error as e:
            self.archive.rollback()
            # Unacknowledged, the batch comes again after the ack wait; a disk that stays full stops us.
            raise errors.PermanentError(f"cannot write the archive {self.archive.path}: {e}") from e
        self.counts.batches += 1
        for msg in msgs:
            try:
                await msg.ack(timeout=ACK_TIMEOUT_S)
            except errors.HealerError as e:  # stored already: a redelivery is ignored by id
                self.log.warning("archive.ack_failed", seq=msg.seq, error=repr(e))

    def _write(self, msg: base.StreamMsg) -> None:
        try:
            item = envelope.classify(msg.data, msg.seq)
        except errors.DecodeError as e:
            self.counts.malformed += 1
            self.events.labels("malformed").inc()
            self.log.warning("archive.malformed", seq=msg.seq, subject=msg.subject, reason=e.reason)
            return
        if item.incident is not None:
            added = self.archive.add_incident(item.incident, msg.data, msg.seq)
        elif item.verdict is not None:
            added = self.archive.add_verdict(item.verdict, msg.data, msg.seq)
        else:
            env = item.envelope
            ts = env.time.timestamp() if env.time is not None else 0.0
            added = self.archive.add_other(env.id, env.type, ts, msg.data, msg.seq)
        if added:
            self.counts.stored += 1
        else:
            self.counts.duplicates += 1
        self.events.labels("stored" if added else "duplicate").inc()
