"""``healer ui``: the status page (docs/ui.md)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from typing import Any

from healer import errors, logs
from healer.cli import common

DESCRIPTION = """Serve the status page: the fleet map, open incidents with their timelines, the breaker
and exclusions, the recent feed, live over server-sent events, and a reliability tab (the last 7 days).
Listens on 127.0.0.1:9744 unless told otherwise; any other address needs a token. Writes to NATS only
the operators' verdicts posted with the token. docs/ui.md."""


def register(sub: Any) -> None:
    # healer.ui (aiohttp, a controller extra) is imported only when the command runs: the agent-only
    # install builds this parser too.
    p = sub.add_parser("ui", help="serve the status page", description=DESCRIPTION)
    common.add_nats_option(p)
    p.add_argument("--host", help="listen address (default 127.0.0.1; anything else needs --token)")
    p.add_argument("--port", type=int, help="listen port (default 9744; 0: any free port)")
    p.add_argument("--token", help="bearer token every request must carry (default: $HEALER_UI_TOKEN)")
    p.add_argument("--labels", help="YAML/JSON node -> {label: value} for grouping the map")
    p.set_defaults(func=_ui)


def _ui(args: argparse.Namespace) -> int:
    from healer.ui import server

    flags = {"host": args.host, "port": args.port, "token": args.token, "labels_file": args.labels}
    s = common.settings(args, ui=flags)
    try:
        server.check(s.ui)
        server.probe_port(s.ui)
        server.load_labels(s.ui.labels_file)
    except (errors.PermanentError, ValueError) as e:
        raise common.SettingsError(str(e)) from e
    logs.configure(s.log.level, s.log.format)

    async def main(stop: asyncio.Event) -> None:
        bus = await common.until_stopped(common.connect(s, "healer-ui"), stop)
        try:
            try:
                running = await server.start(bus, s)
            except errors.PermanentError as e:  # the port was taken since the probe: still a setting
                raise common.SettingsError(str(e)) from e
            print(f"healer ui: {running.url}", flush=True)
            try:
                await stop.wait()
            finally:
                await running.stop()
        finally:
            with contextlib.suppress(errors.HealerError):
                await bus.close()

    common.run(main)
    return 0
