"""``healer incidents tail`` and ``healer forward``: reading the incident feed and sending it on.

Both stop cleanly on SIGTERM or SIGINT: tail unsubscribes; forward hands its in-flight event back to
JetStream (it is delivered again, with the same id) and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import pathlib
import signal
import sys
from collections.abc import Coroutine
from typing import Any

import prometheus_client
import structlog

from healer import config, errors, logs
from healer.bus import nats as natsbus
from healer.bus import subjects
from healer.cli import common
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
    common.add_config_option(f)
    f.set_defaults(func=_forward)


def _since(text: str) -> object:
    try:
        return tail.parse_since(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _run_until_signal(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coro``; SIGTERM/SIGINT cancel it (its ``finally`` blocks clean up)."""

    async def main() -> Any:
        task = asyncio.create_task(coro)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            return await task
        return None

    return asyncio.run(main())


def _tail(args: argparse.Namespace) -> int:
    logs.configure("error")
    query = tail.Query(
        since=args.since, follow=args.follow, node=args.node, change=args.change, min_severity=args.severity
    )

    def on_item(item: envelope.Item) -> None:
        print(tail.as_json_line(item) if args.json else tail.render(item), flush=True)

    def on_bad(subject: str, seq: int, err: errors.DecodeError) -> None:
        print(f"rejected seq={seq} on {subject}: {err}", file=sys.stderr, flush=True)

    async def run() -> None:
        bus = await natsbus.NatsBus.connect(args.nats, name="healer-incidents-tail")
        try:
            await tail.read(bus, subjects.Subjects(args.prefix), query, on_item, on_bad, stats)
        finally:
            await bus.close()

    stats = codec.DecodeStats()
    try:
        _run_until_signal(run())
    except errors.HealerError as e:
        print(f"healer incidents tail: {e}", file=sys.stderr)
        return 1
    if stats.total_rejected:
        detail = ", ".join(f"{k}/{r}={n}" for (k, r), n in sorted(stats.rejected.items()))
        print(f"rejected {stats.total_rejected} malformed messages ({detail})", file=sys.stderr)
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
    try:
        s = config.load(args.config)
        feed = s.feed.model_copy(
            update={
                k: v
                for k, v in {"durable": args.durable, "metrics_port": args.metrics_port}.items()
                if v is not None
            }
        )
        feed = config.FeedSettings.model_validate(feed.model_dump())
        headers = _headers(args.header)
        forward.check_url(args.url)
    except (errors.PermanentError, ValueError) as e:
        print(f"healer forward: {e}", file=sys.stderr)
        return 2
    logs.configure(s.log.level, s.log.format)
    metrics = forward.ForwardMetrics()
    if feed.metrics_port:
        prometheus_client.start_http_server(feed.metrics_port, feed.metrics_addr, registry=metrics.registry)
    nats_settings = s.nats.model_copy(update={"url": args.nats, "prefix": args.prefix})

    async def run() -> None:
        stop = asyncio.Event()
        bus = await natsbus.NatsBus.connect(
            args.nats, name=f"healer-forward-{feed.durable}", nats_settings=nats_settings, retry=s.retry
        )
        fwd = forward.Forwarder(
            bus,
            subjects.Subjects(args.prefix),
            args.url,
            feed,
            dead_letter=args.dead_letter,
            headers=headers,
            start=args.start,
            metrics=metrics,
            content_mode=args.content_mode,
        )
        log.info("forward.starting", durable=feed.durable, dead_letter=str(args.dead_letter or ""))
        try:
            await fwd.run(stop)
        finally:
            await bus.close()
            log.info("forward.stopped", durable=feed.durable)

    try:
        _run_until_signal(run())
    except errors.HealerError as e:
        log.error("forward.fatal", error=str(e))
        return 1
    return 0
