"""``healer incidents tail`` and ``healer forward``: reading the incident feed and sending it on.

Both stop cleanly on SIGTERM or SIGINT: tail unsubscribes; forward hands its in-flight event back to
JetStream (it is delivered again, with the same id) and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import sys
from collections.abc import Callable
from typing import Any, Protocol

import structlog

from healer import config, errors, health, logs
from healer.bus import nats as natsbus
from healer.bus import subjects
from healer.cli import common, verdict_cmd
from healer.feed import envelope, forward, tail, webhook
from healer.schemas import codec

log = structlog.get_logger(__name__)


def register(sub: Any) -> None:
    inc = sub.add_parser("incidents", help="the incident feed")
    isub = inc.add_subparsers(dest="incidents_command", metavar="ACTION")
    isub.required = True
    t = isub.add_parser("tail", help="print incident events", description=tail.__doc__)
    common.add_nats_option(t)
    t.add_argument("--follow", "-f", action="store_true", help="keep printing new events until Ctrl-C")
    t.add_argument("--json", action="store_true", help="print each CloudEvent as is, one per line")
    t.add_argument("--since", type=_since, help="RFC3339 time, unix seconds, a duration ago (1h), or now")
    t.add_argument("--node", help="only this node's incidents")
    t.add_argument("--change", choices=tail.CHANGES, help="only this kind of change")
    t.add_argument("--severity", choices=tail.SEVERITIES, help="only this severity or worse")
    t.set_defaults(func=_tail)
    c = isub.add_parser(
        "close",
        help="close an incident only a person can end (a hardware replacement); the leader resolves it",
    )
    common.add_nats_option(c)
    c.add_argument("incident", help="the incident id")
    c.add_argument("--by", help="who closes it (default: your user name)")
    c.add_argument("--reason", default="closed by an operator")
    c.set_defaults(func=_close)
    verdict_cmd.register(isub)

    f = sub.add_parser(
        "forward", help="deliver the incident feed to an HTTP receiver", description=forward.__doc__
    )
    common.add_nats_option(f)
    f.add_argument("--url", required=True, help="receiver URL; each event is POSTed to it")
    f.add_argument("--durable", help="durable consumer name, one per receiver (default: healer-forward)")
    f.add_argument("--dead-letter", type=pathlib.Path, help="append refused and malformed events here")
    f.add_argument("--metrics-port", type=int, help="Prometheus port, 0 = off (default: 0)")
    f.add_argument(
        "--header", action="append", default=[], metavar="'NAME: VALUE'", help="extra HTTP header (repeat)"
    )
    f.add_argument(
        "--start",
        choices=["all", "new"],
        default="all",
        help="where a new durable consumer starts: the whole stream or new events (default: all)",
    )
    f.add_argument(
        "--content-mode",
        choices=webhook.CONTENT_MODES,
        default="structured",
        help="CloudEvents HTTP content mode: the event as the body, or attributes as ce- headers "
        "(default: structured)",
    )
    f.set_defaults(func=_forward)


def _since(text: str) -> object:
    try:
        return tail.parse_since(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _tail(args: argparse.Namespace) -> int:
    s = common.settings(args)
    logs.configure("error")
    query = tail.Query(
        since=args.since, follow=args.follow, node=args.node, change=args.change, min_severity=args.severity
    )

    def on_item(item: envelope.Item) -> None:
        print(tail.as_json_line(item) if args.json else tail.render(item), flush=True)

    def on_bad(subject: str, seq: int, err: errors.DecodeError) -> None:
        print(f"rejected seq={seq} on {subject}: {err}", file=sys.stderr, flush=True)

    async def run() -> None:
        bus = await common.connect(s, "healer-incidents-tail")
        try:
            await tail.read(bus, subjects.Subjects(s.nats.prefix), query, on_item, on_bad, stats)
        finally:
            await bus.close()

    stats = codec.DecodeStats()
    common.run(lambda stop: common.until_stopped(run(), stop))
    if stats.total_rejected:
        detail = ", ".join(f"{k}/{r}={n}" for (k, r), n in sorted(stats.rejected.items()))
        print(f"rejected {stats.total_rejected} malformed messages ({detail})", file=sys.stderr)
    return 0


def _close(args: argparse.Namespace) -> int:
    """Ask the leader to close an incident: it resolves it on its next housekeeping (seconds)."""
    import getpass

    from healer.controller.incidents import closing
    from healer.controller.store import kv

    s = common.settings(args)
    logs.configure("error")

    async def main() -> dict[str, object]:
        bus = await common.connect(s, "healer-cli")
        try:
            store = kv.Store(await bus.key_value(subjects.Subjects(s.nats.prefix).kv_state))
            return await closing.request(store, args.incident, args.by or getpass.getuser(), args.reason)
        finally:
            await bus.close()

    try:
        asked = asyncio.run(main())
    except errors.HealerError as e:
        print(f"healer incidents close: {e}", file=sys.stderr)
        return 1
    print(f"close of {args.incident} requested by {asked['by']}: the leader resolves it within seconds")
    return 0


def _headers(values: list[str]) -> dict[str, str]:
    out = {}
    for value in values:
        name, sep, rest = value.partition(":")
        if not sep or not name.strip():
            raise errors.PermanentError(f"bad --header {value!r}: expected 'Name: value'")
        out[name.strip()] = rest.strip()
    return out


def _forward(args: argparse.Namespace) -> int:
    s = common.settings(args, feed={"durable": args.durable, "metrics_port": args.metrics_port})
    try:
        headers = _headers(args.header)
        forward.check_url(args.url)
    except (errors.PermanentError, ValueError) as e:
        raise common.SettingsError(str(e)) from e

    def build(bus: natsbus.NatsBus, metrics: forward.ForwardMetrics) -> forward.Forwarder:
        log.info("forward.starting", durable=s.feed.durable, dead_letter=str(args.dead_letter or ""))
        return forward.Forwarder(
            bus,
            subjects.Subjects(s.nats.prefix),
            args.url,
            s.feed,
            dead_letter=args.dead_letter,
            headers=headers,
            start=args.start,
            metrics=metrics,
            content_mode=args.content_mode,
        )

    return run_sink(s, s.feed, "forward", build)


class Sink(Protocol):
    async def run(self, stop: asyncio.Event) -> None: ...


def run_sink(
    s: config.Settings,
    feed: config.FeedSettings,
    name: str,
    build: Callable[[natsbus.NatsBus, forward.ForwardMetrics], Sink],
) -> int:
    """Run a feed consumer (``healer forward``, ``healer alertmanager``) as a service: metrics and health
    on ``feed.metrics_port``, an interruptible connect, then ``build(bus, metrics).run(stop)`` until a
    signal."""
    logs.configure(s.log.level, s.log.format)
    metrics = forward.ForwardMetrics()
    beat = health.Health(metrics.registry)
    if feed.metrics_port:
        try:
            beat.serve(feed.metrics_addr, feed.metrics_port, setting="feed.metrics_port (--metrics-port)")
        except errors.PermanentError as e:
            raise common.SettingsError(str(e)) from e

    async def run(stop: asyncio.Event) -> None:
        bus: natsbus.NatsBus | None = None

        def ready() -> health.Verdict:
            if bus is None:
                return health.Verdict.of(nats=health.Check(False, f"connecting to {s.nats.url}"))
            return health.Verdict.of(
                nats=health.Check(bus.connected, "connected" if bus.connected else "disconnected")
            )

        async with common.heartbeat(name, beat, ready, metrics.task_failures):
            bus = await common.until_stopped(
                common.connect(s, f"healer-{name}-{feed.durable}", service=True), stop
            )
            try:
                await build(bus, metrics).run(stop)
            finally:
                await bus.close()
                log.info(f"{name}.stopped", durable=feed.durable)

    try:
        common.run(run)
    except errors.HealerError as e:
        log.error(f"{name}.fatal", error=str(e))
        raise
    finally:
        beat.close()
    return 0
