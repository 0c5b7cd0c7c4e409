"""``healer alertmanager``: the incident feed into Alertmanager (healer/feed/alertmanager.py).

Kept apart from ``healer forward`` so that the webhook forwarder's options stay as they are; settings come
from the ``feed`` group (``--config``) like the forwarder's, with the durable consumer named
``healer-alertmanager`` unless ``--durable`` says otherwise.
"""

from __future__ import annotations

import argparse
import pathlib
from typing import Any

import structlog

from healer import config, errors
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
    p.set_defaults(func=_alertmanager)


def _alertmanager(args: argparse.Namespace) -> int:
    group = {"durable": args.durable, "metrics_port": args.metrics_port, "alertmanager_link": args.link}
    s = common.settings(args, feed=group)
    feed = s.feed
    if args.durable is None and feed.durable == config.FeedSettings().durable:
        feed = feed.model_copy(update={"durable": alertmanager.DEFAULT_DURABLE})
    try:
        headers = feed_cmd._headers(args.header)
        alertmanager.alerts_url(args.url)
        alertmanager.check_link_template(feed.alertmanager_link)
    except (errors.PermanentError, ValueError) as e:
        raise common.SettingsError(str(e)) from e

    def build(bus: natsbus.NatsBus, metrics: forward.ForwardMetrics) -> alertmanager.AlertmanagerSink:
        sink = alertmanager.AlertmanagerSink(
            bus,
            subjects.Subjects(s.nats.prefix),
            args.url,
            feed,
            dead_letter=args.dead_letter,
            headers=headers,
            metrics=metrics,
        )
        log.info("alertmanager.starting", url=sink.url, durable=feed.durable)
        return sink

    return feed_cmd.run_sink(s, feed, "alertmanager", build)
