"""``healer nats serve|provision|status|config``: an embedded nats-server for one host, stream
provisioning (byte limits sized from the fleet), how full the store is and who holds the leases
(``status``), and the secured server configuration (``config``, see ``natsconf_cmd``)."""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import signal
import threading
import time
from typing import TYPE_CHECKING, Any

from healer import config, errors, logs, sizing
from healer.bus import base, embedded, provision, subjects
from healer.cli import common, lazy, natsconf_cmd

if TYPE_CHECKING:
    from healer.controller.observability import storage
    from healer.controller.store import kv, lease
else:
    kv = lazy.module("healer.controller.store.kv")
    lease = lazy.module("healer.controller.store.lease")
    storage = lazy.module("healer.controller.observability.storage")


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
    prov.add_argument(
        "--fleet-nodes",
        type=int,
        help="nodes sending telemetry: sizes HEALER_TELEMETRY (nats.fleet_nodes)",
    )
    prov.add_argument(
        "--frame-interval", type=float, help="agents' interval in s, for the sizing (nats.frame_interval_s)"
    )
    prov.add_argument("--frame-bytes", type=int, help="bytes of one frame, for the sizing (nats.frame_bytes)")
    prov.add_argument(
        "--dry-run",
        action="store_true",
        help="print the limits and the max_file_store to set; connect to nothing",
    )
    prov.set_defaults(func=_provision)

    status = nsub.add_parser(
        "status", help="how full JetStream's store and healer's streams are, and who holds the leases"
    )
    common.add_nats_option(status)
    status.add_argument("--shards", type=int, help="controller shards to list (default: controller.shards)")
    status.set_defaults(func=_status)

    natsconf_cmd.add_config_parser(nsub)


async def _ensure(s: config.Settings) -> provision.Plan:
    bus = await common.connect(s, "healer-provision")
    try:
        return await provision.ensure(bus, subjects.Subjects(s.nats.prefix), s.nats)
    finally:
        await bus.close()


def _mib(n: int | None) -> str:
    """A byte limit (None or 0: none) or a size, in MiB."""
    return "no limit" if n is None else f"{n / 2**20:.1f} MiB"


def _provision(args: argparse.Namespace) -> int:
    s = common.settings(
        args,
        nats={
            "replicas": args.replicas, "fleet_nodes": args.fleet_nodes,
            "frame_interval_s": args.frame_interval, "frame_bytes": args.frame_bytes,
        },
    )  # fmt: skip
    logs.configure("error")
    if args.dry_run:
        plan = provision.plan(subjects.Subjects(s.nats.prefix), s.nats)
    else:
        plan = asyncio.run(_ensure(s))
    for stream in plan.streams:
        print(
            f"stream {stream.name}: {', '.join(stream.subjects or [])} (max_age {stream.max_age:g}s, "
            f"max_bytes {_mib(stream.max_bytes or None)})"
        )
    for bucket in plan.buckets:
        print(
            f"kv {bucket.bucket}: history {bucket.history}, ttl {bucket.ttl or 0:g}s, "
            f"max_bytes {_mib(bucket.max_bytes or None)}"
        )
    for kept in plan.kept:
        print(f"KEPT {kept.line()}")
    print(f"reserved: {_mib(s.nats.reserved_bytes())} per replica")
    print(_store_line(s.nats))
    return 0


def _store_line(ns: config.NatsSettings) -> str:
    return (
        f"max_file_store: {sizing.store_bytes(ns)}  # at least, on every server holding a replica "
        f"({sizing.gib_up(ns.reserved_bytes())}; docs/deployment.md, sizing)"
    )


def _status(args: argparse.Namespace) -> int:
    """One line for the store (``jetstream: ok`` or what would stop healing), one per stream, one per
    shard's lease. Exit 1 when storage has a problem or a shard has no leader."""
    s = common.settings(args, controller={"shards": args.shards})
    logs.configure("error")
    subj = subjects.Subjects(s.nats.prefix)

    async def main() -> tuple[base.StorageReport, list[tuple[int, dict[str, Any] | None]]]:
        bus = await common.connect(s, "healer-cli")
        try:
            report = await bus.storage(storage.streams_of(subj))
            store = kv.Store(await bus.key_value(subj.kv_leases))
            holders = []
            for shard in range(s.controller.shards):
                doc = await store.get(lease.key_of(shard))
                holders.append((shard, doc.value if doc else None))
            return report, holders
        finally:
            await bus.close()

    try:
        report, holders = asyncio.run(main())
    except errors.HealerError as e:
        print(f"healer nats status: {e}")
        return 1
    problem = report.problem()
    limit = report.limit_bytes if report.limit_bytes is not None else report.reserved_bytes
    what = "account limit" if report.limit_bytes is not None else "reserved by healer's streams"
    head = "ok" if problem is None else f"PROBLEM: {problem}"
    print(f"jetstream: {head} ({_mib(report.used_bytes)} in use; {_mib(limit)} {what})")
    for u in report.streams:
        share = f" ({u.full:.0%})" if u.full is not None else ""
        print(f"stream {u.name}: {_mib(u.bytes)} of {_mib(u.max_bytes)}{share}, {u.messages} messages")
    leaderless = False
    for shard, held in holders:
        if held is None:
            leaderless = True
            print(f"lease shard {shard}: NO HOLDER: no controller leads this shard")
        else:
            age = time.time() - float(held.get("at", 0.0))
            print(f"lease shard {shard}: held by {held.get('holder')} (renewed {age:.1f} s ago)")
    return 1 if problem is not None or leaderless else 0


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
