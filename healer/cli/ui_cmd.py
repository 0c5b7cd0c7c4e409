"""``healer ui``: the read-only status page (docs/ui.md)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from typing import Any

from healer import config, errors, logs
from healer.bus import nats as natsbus
from healer.cli import common

DESCRIPTION = """Serve the read-only status page: the fleet map, open incidents with their timelines, the
breaker and exclusions, the recent feed, live over server-sent events. Listens on 127.0.0.1:9744 unless
told otherwise; any other address needs a token. Never writes to NATS. docs/ui.md."""


def register(sub: Any) -> None:
    # healer.ui (aiohttp, a controller extra) is imported only when the command runs: the agent-only
    # install builds this parser too.
    p = sub.add_parser("ui", help="serve the read-only status page", description=DESCRIPTION)
    common.add_nats_option(p)
    p.add_argument("--host", help="listen address (default 127.0.0.1; anything else needs --token)")
    p.add_argument("--port", type=int, help="listen port (default 9744; 0: any free port)")
    p.add_argument("--token", help="bearer token every request must carry (default: $HEALER_UI_TOKEN)")
    p.add_argument("--labels", help="YAML/JSON node -> {label: value} for grouping the map")
    common.add_config_option(p)
    p.set_defaults(func=_ui)


def _settings(args: argparse.Namespace) -> config.Settings:
    s = config.load(args.config)
    raw = s.model_dump()
    raw["nats"].update(url=args.nats, prefix=args.prefix)
    flags = {"host": args.host, "port": args.port, "token": args.token, "labels_file": args.labels}
    raw["ui"].update({k: v for k, v in flags.items() if v is not None})
    return config.Settings.model_validate(raw)


def _ui(args: argparse.Namespace) -> int:
    from healer.ui import server

    try:
        s = _settings(args)
        server.check(s.ui)
    except (errors.PermanentError, ValueError) as e:
        print(f"healer ui: {e}", file=sys.stderr)
        return 2
    logs.configure(s.log.level, s.log.format)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        bus = await natsbus.NatsBus.connect(
            s.nats.url, name="healer-ui", nats_settings=s.nats, retry=config.RetrySettings(attempts=3)
        )
        try:
            running = await server.start(bus, s)
            print(f"healer ui: {running.url}", flush=True)
            try:
                await stop.wait()
            finally:
                await running.stop()
        finally:
            with contextlib.suppress(errors.HealerError):
                await bus.close()

    try:
        asyncio.run(main())
    except errors.HealerError as e:
        print(f"healer ui: {e}", file=sys.stderr)
        return 1
    return 0
