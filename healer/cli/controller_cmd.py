"""``healer controller``, ``healer breaker status|reset``, ``healer exclude add|remove|list``."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import signal
import sys
from typing import Any

import prometheus_client
import structlog

from healer import config, errors, logs
from healer.actuators import factory
from healer.bus import nats as natsbus
from healer.bus import provision, subjects
from healer.cli import common
from healer.controller import kv, policy, service
from healer.controller import metrics as metrics_mod
from healer.ui import hook

log = structlog.get_logger(__name__)


def register(sub: Any) -> None:
    p = sub.add_parser("controller", help="run the controller", description=service.__doc__)
    common.add_nats_option(p)
    p.add_argument("--rules", help="rules directory (default: rules)")
    p.add_argument("--mode", choices=["enforce", "dry-run", "observe"], help="default: dry-run")
    p.add_argument("--actuator", choices=["log", "slurm", "kubernetes"], help="default: log")
    p.add_argument("--model", help="anomaly model directory, e.g. models/default (default: none, score 0)")
    p.add_argument("--tick", type=float, help="seconds between evaluations (default 1)")
    p.add_argument("--metrics-port", type=int, help="Prometheus port, 0 = off (default 9742)")
    p.add_argument("--shards", type=int, help="number of controller shards (default 1)")
    p.add_argument("--shard", type=int, help="this process's shard (default 0)")
    p.add_argument("--cluster", help="cluster name in CloudEvent sources (default: default)")
    common.add_config_option(p)
    p.set_defaults(func=_controller)

    b = sub.add_parser("breaker", help="the circuit breaker")
    bsub = b.add_subparsers(dest="breaker_command", metavar="ACTION")
    bsub.required = True
    for name, helptext in (
        ("status", "show the breaker"),
        ("reset", "close the breaker and clear its window"),
    ):
        a = bsub.add_parser(name, help=helptext)
        common.add_nats_option(a)
        a.set_defaults(func=_breaker, action=name)

    e = sub.add_parser("exclude", help="nodes under maintenance: incidents yes, actions no")
    esub = e.add_subparsers(dest="exclude_command", metavar="ACTION")
    esub.required = True
    add = esub.add_parser("add", help="exclude a node")
    add.add_argument("node")
    add.add_argument("--reason", default="maintenance")
    rm = esub.add_parser("remove", help="stop excluding a node")
    rm.add_argument("node")
    ls = esub.add_parser("list", help="list excluded nodes")
    for a, name in ((add, "add"), (rm, "remove"), (ls, "list")):
        common.add_nats_option(a)
        a.set_defaults(func=_exclude, action=name)


def _settings(args: argparse.Namespace) -> config.Settings:
    s = config.load(args.config)
    updates = {
        "rules_dir": args.rules,
        "mode": args.mode,
        "actuator": args.actuator,
        "tick_s": args.tick,
        "metrics_port": args.metrics_port,
        "shards": args.shards,
        "shard": args.shard,
        "cluster": args.cluster,
        "model": args.model,
    }
    raw = s.model_dump()
    raw["controller"].update({k: v for k, v in updates.items() if v is not None})
    raw["nats"].update({"url": args.nats, "prefix": args.prefix})
    return config.Settings.model_validate(raw)


async def run_controller(
    s: config.Settings, stop: asyncio.Event, metrics: metrics_mod.ControllerMetrics
) -> None:
    from healer.actuators import power

    bus = await natsbus.NatsBus.connect(
        s.nats.url, name="healer-controller", nats_settings=s.nats, retry=s.retry
    )
    try:
        await provision.ensure(bus, subjects.Subjects(s.nats.prefix), s.nats)
        ctl = service.Controller(s, bus, scheduler=factory.scheduler(s), metrics=metrics)
        ctl.power = power.PowerActuator(bus, ctl, subjects.Subjects(s.nats.prefix), s.actuators)
        await ctl.start()
        page = await hook.maybe_start(bus, s)  # the status page, when ui.enabled (docs/ui.md)
        await stop.wait()
        if page is not None:
            await page.stop()
        await ctl.stop()
    finally:
        await bus.close()


def _controller(args: argparse.Namespace) -> int:
    try:
        s = _settings(args)
    except errors.PermanentError as e:
        print(f"healer controller: {e}", file=sys.stderr)
        return 2
    logs.configure(s.log.level, s.log.format)
    metrics = metrics_mod.ControllerMetrics()
    if s.controller.metrics_port:
        prometheus_client.start_http_server(s.controller.metrics_port, registry=metrics.registry)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run_controller(s, stop, metrics)

    try:
        asyncio.run(main())
    except errors.HealerError as e:
        log.error("controller.fatal", error=str(e))
        print(f"healer controller: {e}", file=sys.stderr)
        return 1
    return 0


async def _state_store(url: str, prefix: str) -> tuple[natsbus.NatsBus, kv.Store]:
    bus = await natsbus.NatsBus.connect(url, name="healer-cli", retry=config.RetrySettings(attempts=3))
    subj = subjects.Subjects(prefix)
    await provision.ensure(bus, subj, config.NatsSettings())
    return bus, kv.Store(await bus.js.key_value(subj.kv_state))


def _breaker(args: argparse.Namespace) -> int:
    logs.configure("warning")

    async def main() -> dict[str, Any]:
        bus, store = await _state_store(args.nats, args.prefix)
        try:
            b = policy.Breaker(store, config.ControllerSettings())
            if args.action == "reset":
                return await b.reset(by=getpass.getuser())
            return await b.status()
        finally:
            await bus.close()

    try:
        state = asyncio.run(main())
    except errors.HealerError as e:
        print(f"healer breaker: {e}", file=sys.stderr)
        return 1
    print(json.dumps(state, indent=2))
    return 0


def _exclude(args: argparse.Namespace) -> int:
    logs.configure("warning")

    async def main() -> dict[str, dict[str, Any]]:
        bus, store = await _state_store(args.nats, args.prefix)
        try:
            ex = policy.Exclusions(store)
            if args.action == "add":
                await ex.add(args.node, by=getpass.getuser(), reason=args.reason)
            elif args.action == "remove":
                await ex.remove(args.node)
            await ex.refresh()
            return ex.nodes
        finally:
            await bus.close()

    try:
        nodes = asyncio.run(main())
    except errors.HealerError as e:
        print(f"healer exclude: {e}", file=sys.stderr)
        return 1
    for node, info in sorted(nodes.items()):
        print(f"{node}\t{info.get('by')}\t{info.get('reason')}")
    return 0
