"""``healer archive``: keep the incident feed in an SQLite file (docs/archive.md).

A service: it runs until SIGTERM or SIGINT, retrying NATS as ``retry`` says; the events it wrote are
acknowledged only after they are committed, so a stop at any moment loses nothing. With
``--export-parquet DIR`` it writes the archive's tables as Parquet files instead, and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import sqlite3
from typing import TYPE_CHECKING, Any

import prometheus_client as prom
import structlog

from healer import errors, health, logs, tasks
from healer.bus import nats as natsbus
from healer.bus import subjects
from healer.cli import common, lazy

if TYPE_CHECKING:  # the real modules, for mypy; at run time they load on first use (cli/lazy.py)
    from healer.archive import consumer, parquet, store
else:
    consumer = lazy.module("healer.archive.consumer")
    parquet = lazy.module("healer.archive.parquet")
    store = lazy.module("healer.archive.store")

log = structlog.get_logger(__name__)


def register(sub: Any) -> None:
    a = sub.add_parser("archive", help="keep the incident feed in an SQLite archive", description=__doc__)
    common.add_nats_option(a)
    a.add_argument("--db", type=pathlib.Path, required=True, help="the archive file (made if absent)")
    a.add_argument(
        "--durable", default="healer-archive", help="durable consumer name (default: healer-archive)"
    )
    a.add_argument(
        "--start",
        choices=["all", "new"],
        default="all",
        help="where a new durable consumer starts: the whole stream or new events (default: all)",
    )
    a.add_argument(
        "--metrics-port", type=int, default=0, help="/metrics, /healthz, /readyz port, 0 = off (0)"
    )
    a.add_argument(
        "--export-parquet",
        type=pathlib.Path,
        metavar="DIR",
        help="write each table of the archive to DIR/<table>.parquet and exit (needs healer[archive])",
    )
    a.set_defaults(func=_archive)


def _export(args: argparse.Namespace) -> int:
    """``--export-parquet``: read the archive (read-only, beside a running archiver) into Parquet files."""
    if not args.db.is_file():
        raise common.SettingsError(f"no archive at {args.db} (healer archive --db writes it)")
    try:
        with store.Archive(args.db, readonly=True) as db:
            written = parquet.export(db, args.export_parquet)
    except sqlite3.Error as e:
        raise errors.PermanentError(f"cannot read the archive {args.db}: {e}") from e
    except errors.PermanentError as e:
        raise common.SettingsError(str(e)) from e
    for w in written:
        print(f"{w.path}: {w.rows} rows")
    return 0


def _archive(args: argparse.Namespace) -> int:
    """Archive until a signal: /metrics and health on ``--metrics-port``, systemd's READY and watchdog
    from the heartbeat, an interruptible connect."""
    if args.export_parquet is not None:
        return _export(args)
    s = common.settings(args)
    logs.configure(s.log.level, s.log.format)
    registry = prom.CollectorRegistry()
    failures = tasks.failures_counter("healer_archive", registry)
    beat = health.Health(registry)
    try:
        db = store.Archive(args.db)
        if args.metrics_port:
            beat.serve(s.feed.metrics_addr, args.metrics_port, setting="--metrics-port")
    except errors.PermanentError as e:  # an unwritable path, another schema, a busy port: fix, run again
        raise common.SettingsError(str(e)) from e

    async def run(stop: asyncio.Event) -> None:
        bus: natsbus.NatsBus | None = None

        def ready() -> health.Verdict:
            up = bus is not None and bus.connected
            return health.Verdict.of(
                nats=health.Check(up, "connected" if up else f"not connected to {s.nats.url}")
            )

        async with common.heartbeat("archive", beat, ready, failures):
            bus = await common.until_stopped(
                common.connect(s, f"healer-archive-{args.durable}", service=True), stop
            )
            try:
                archiver = consumer.Archiver(
                    bus, subjects.Subjects(s.nats.prefix), db, s.feed, durable=args.durable, start=args.start,
                    registry=registry,
                )  # fmt: skip
                log.info("archive.starting", db=str(args.db), durable=args.durable)
                await archiver.run(stop)
                log.info("archive.stopped", **vars(archiver.counts))
            finally:
                await bus.close()

    try:
        common.run(run)
    finally:
        beat.close()
        db.close()
    return 0
