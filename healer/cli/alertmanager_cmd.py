"""``healer alertmanager``: the incident feed into Alertmanager (healer/feed/alertmanager.py).

Kept apart from ``healer forward`` so that the webhook forwarder's options stay as they are; settings come
from the ``feed`` group (``--config``) like the forwarder's, with the durable consumer named
``healer-alertmanager`` unless ``--durable`` says otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import sys
from typing import Any

import prometheus_client
import structlog

from healer import config, errors, logs
from healer.bus import nats as natsbus
from healer.bus import subjects
from healer.cli import common, feed_cmd
from healer.feed import alertmanager, forward

log = structlog.get_logger(__name__)


def register(sub: Any) -> None:
    p = sub.add_parser(
        "alertmanager",
        help="send incidents to Alertmanager as alerts (API v2)",
        description=alertmanager.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common.add_nats_option(p)
    p.add_argument("--url", required=True, help="Alertmanager base URL, such as http://alertmanager:9093")
    p.add_argument("--durable", help=f"durable consumer name (default: {alertmanager.DEFAULT_DURABLE})")
    p.add_argument("--link", help="link template for each alert (feed.alertmanager_link)")
    p.add_argument("--dead-letter", type=pathlib.Path, help="append events Alertmanager refused here")
    p.add_argument("--metrics-port", type=int, help="Prometheus port, 0 = off (default: 0)")
    p.add_argument(
        "--header", action="append", default=[], metavar="'NAME: VALUE'", help="extra HTTP header (repeat)"
    )
    common.add_config_option(p)
    p.set_defaults(func=_alertmanager)


def _alertmanager(args: argparse.Namespace) -> int:
    try:
        s = config.load(args.config)
        update = {"durable": args.durable, "metrics_port": args.metrics_port, "alertmanager_link": args.link}
        if args.durable is None and s.feed.durable == config.FeedSettings().durable:
            update["durable"] = alertmanager.DEFAULT_DURABLE
        feed = config.FeedSettings.model_validate(
            {**s.feed.model_dump(), **{k: v for k, v in update.items() if v is not None}}
        )
        headers = feed_cmd._headers(args.header)
        alertmanager.alerts_url(args.url)
        alertmanager.check_link_template(feed.alertmanager_link)
    except (errors.PermanentError, ValueError) as e:
        print(f"healer alertmanager: {e}", file=sys.stderr)
        return 2
    logs.configure(s.log.level, s.log.format)
    metrics = forward.ForwardMetrics()
    if feed.metrics_port:
        prometheus_client.start_http_server(feed.metrics_port, feed.metrics_addr, registry=metrics.registry)
    nats_settings = s.nats.model_copy(update={"url": args.nats, "prefix": args.prefix})

    async def run() -> None:
        bus = await natsbus.NatsBus.connect(
            args.nats, name=f"healer-alertmanager-{feed.durable}", nats_settings=nats_settings, retry=s.retry
        )
        sink = alertmanager.AlertmanagerSink(
            bus,
            subjects.Subjects(args.prefix),
            args.url,
            feed,
            dead_letter=args.dead_letter,
            headers=headers,
            metrics=metrics,
        )
        log.info("alertmanager.starting", url=sink.url, durable=feed.durable)
        try:
            await sink.run(asyncio.Event())
        finally:
            await bus.close()
            log.info("alertmanager.stopped", durable=feed.durable)

    try:
        feed_cmd._run_until_signal(run())
    except errors.HealerError as e:
        log.error("alertmanager.fatal", error=str(e))
        return 1
    return 0
