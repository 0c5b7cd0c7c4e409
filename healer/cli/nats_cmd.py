"""``healer nats serve|provision|config``: an embedded nats-server for one host, stream provisioning,
and the secured server configuration (``config``, see ``natsconf_cmd``)."""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import signal
import threading
from typing import Any

from healer import config, errors, logs
from healer.bus import embedded, provision, subjects
from healer.cli import common, natsconf_cmd


def register(sub: Any) -> None:
    p = sub.add_parser("nats", help="embedded nats-server and JetStream provisioning")
    nsub = p.add_subparsers(dest="nats_command", metavar="ACTION")
    nsub.required = True

    serve = nsub.add_parser("serve", help="run the venv's nats-server with JetStream until Ctrl-C")
    serve.add_argument("--port", type=int, default=4222, help="client port, 0 = any free (default 4222)")
    serve.add_argument("--host", default="127.0.0.1", help="listen address (default loopback)")
    serve.add_argument("--store-dir", default=".state/nats", help="JetStream state (default %(default)s)")
    serve.add_argument("--provision", action="store_true", help="create healer's streams and buckets")
    serve.add_argument("--replicas", type=int, default=1)
    serve.set_defaults(func=_serve)

    prov = nsub.add_parser("provision", help="create or update healer's streams and KV buckets")
    common.add_nats_option(prov)
    prov.add_argument("--replicas", type=int, help="JetStream replicas, 3 on a cluster (default: 1)")
    prov.set_defaults(func=_provision)

    natsconf_cmd.add_config_parser(nsub)


async def _ensure(s: config.Settings) -> provision.Plan:
    bus = await common.connect(s, "healer-provision")
    try:
        return await provision.ensure(bus, subjects.Subjects(s.nats.prefix), s.nats)
    finally:
        await bus.close()


def _provision(args: argparse.Namespace) -> int:
    s = common.settings(args, nats={"replicas": args.replicas})
    logs.configure("error")
    plan = asyncio.run(_ensure(s))
    for stream in plan.streams:
        print(f"stream {stream.name}: {', '.join(stream.subjects or [])} (max_age {stream.max_age:g}s)")
    for bucket in plan.buckets:
        print(f"kv {bucket.bucket}: history {bucket.history}, ttl {bucket.ttl or 0:g}s")
    return 0


def _serve(args: argparse.Namespace) -> int:
    logs.configure("info")
    srv = embedded.EmbeddedServer(pathlib.Path(args.store_dir), port=args.port or 0, host=args.host)
    try:
        srv.start()
    except errors.HealerError as e:
        if "address already in use" in str(e):
            raise common.SettingsError(
                f"cannot listen on {args.host}:{args.port}: already in use; choose another --port (0: any)"
            ) from e
        raise
    print(
        f"nats-server {srv.url} (JetStream in {srv.store_dir}, monitor http://{srv.host}:{srv.monitor_port})"
    )
    try:
        if args.provision:
            s = config.load(env={}, flags={"nats": {"url": srv.url, "replicas": args.replicas}})
            asyncio.run(_ensure(s))
            print("provisioned healer streams and buckets")
        done = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: done.set())
        while srv.running and not done.wait(0.5):
            pass
    finally:
        srv.stop()
    return 0
