"""The status page's reliability tab (#42, item 4): the last 7 days as ``healer report`` computes them
(``healer.archive.figures``, the same code and definitions: docs/archive.md), at ``GET /api/reliability``.

Where the figures come from (``source`` in the answer):

- ``archive``: with ``ui.archive_db`` set, the archive file ``healer archive`` writes, opened read-only
  (SQLite's write-ahead log lets the page read beside the archiver; the file must be on this host). It
  holds everything since the archive started, so incidents opened before the window are counted from
  their real open time.
- ``feed``: otherwise the page reads the incident feed's last ``REPEAT_WINDOW_S`` (30 days: the repeat
  offenders' window) itself, into an in-memory archive, and computes the same figures. The stream keeps
  90 days by default (docs/events.md), so this needs nothing else running; an incident opened before
  what is read starts at its first event read. The controller's own memory is not used: it holds open
  incidents only, not the week's resolved ones.

Figures are computed at most every ``ui.reliability_cache_s`` (300 s) and kept; a request meanwhile gets
the kept ones (``computed_at`` says when). The fleet's size is the page's map (its nodes x GPUs per node),
or the nodes with incidents x 8 where those are more (``assumptions.fleet_gpus_source`` says which).
"""

from __future__ import annotations

import asyncio
import pathlib
import sqlite3
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Final

import orjson
import structlog
from aiohttp import web

from healer import config, errors
from healer.archive import figures, store
from healer.bus import base, subjects
from healer.feed import envelope, tail

log = structlog.get_logger(__name__)

WINDOW_S: Final = 7 * 86400.0
REPEAT_WINDOW_S: Final = 30 * 86400.0


class Reliability:
    def __init__(
        self,
        bus: base.Bus | None,
        subj: subjects.Subjects,
        ui: config.UiSettings,
        fleet_gpus: Callable[[], int | None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.bus, self.subj, self.ui = bus, subj, ui
        self.fleet_gpus = fleet_gpus
        self.clock = clock
        self.kept: dict[str, Any] | None = None
        self.lock = asyncio.Lock()
        self.refused = 0
        """Feed messages that were not CloudEvents, in the reads so far."""

    def options(self, db: store.Archive, now: float) -> figures.Options:
        """The report's window and fleet: the page's map (nodes x GPUs per node), or the nodes the
        archive has seen x 8 where those are more (a page that has not heard from every node yet)."""
        on_map = self.fleet_gpus() or 0
        seen = figures.nodes_seen(db) * figures.Options.node_gpus
        fleet, source = (
            (on_map, "the page's map") if on_map >= seen else (seen, "nodes seen in the incidents x 8")
        )
        return figures.Options(
            end=now, since_s=WINDOW_S, fleet_gpus=fleet, fleet_source=source, repeat_window_s=REPEAT_WINDOW_S
        )

    async def report(self) -> dict[str, Any]:
        """The kept figures while fresh, else new ones; ``PermanentError`` when there is no source."""
        async with self.lock:
            now = self.clock()
            if self.kept is not None and now - self.kept["computed_at"] < self.ui.reliability_cache_s:
                return self.kept
            if self.ui.archive_db:
                report = await asyncio.to_thread(self._from_archive, self.ui.archive_db, now)
                source: dict[str, Any] = {"source": "archive", "archive_db": self.ui.archive_db}
            else:
                report = await self._from_feed(now)
                source = {"source": "feed", "read_since": now - REPEAT_WINDOW_S}
            self.kept = {**report, **source, "computed_at": now}
            return self.kept

    def _from_archive(self, path: str, now: float) -> dict[str, Any]:
        if not pathlib.Path(path).is_file():
            raise errors.PermanentError(
                f"no archive at {path} (ui.archive_db; healer archive --db writes it)"
            )
        try:
            with store.Archive(path, readonly=True) as db:
                return figures.build(db, self.options(db, now))
        except sqlite3.Error as e:
            raise errors.PermanentError(f"cannot read the archive {path}: {e}") from e

    async def _from_feed(self, now: float) -> dict[str, Any]:
        if self.bus is None:
            raise errors.PermanentError("this page has no bus to read the incident feed from")
        db = store.Archive(":memory:")
        try:

            def on_item(item: envelope.Item) -> None:
                if item.incident is not None:
                    db.add_incident(item.incident, item.raw, item.stream_seq)
                elif item.verdict is not None:
                    db.add_verdict(item.verdict, item.raw, item.stream_seq)

            def on_bad(subject: str, seq: int, err: errors.DecodeError) -> None:
                self.refused += 1
                log.warning("ui.reliability_malformed", subject=subject, seq=seq, reason=err.reason)

            since = datetime.fromtimestamp(now - REPEAT_WINDOW_S, tz=UTC)
            await tail.read(self.bus, self.subj, tail.Query(since=since), on_item, on_bad)
            db.commit()
            return figures.build(db, self.options(db, now))
        finally:
            db.close()


def add_routes(app: web.Application, rel: Reliability) -> None:
    """``GET /api/reliability``: the figures as JSON, or 503 with the reason there are none."""

    async def get(request: web.Request) -> web.Response:
        try:
            report = await rel.report()
        except errors.HealerError as e:
            log.warning("ui.reliability_unavailable", error=str(e))
            return web.Response(status=503, text=f"healer ui: no reliability figures: {e}\n")
        resp = web.Response(body=orjson.dumps(report), content_type="application/json")
        resp.enable_compression()
        return resp

    app.router.add_get("/api/reliability", get)
