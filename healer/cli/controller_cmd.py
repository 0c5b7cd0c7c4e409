"""``healer controller``, ``healer breaker status|reset``, ``healer exclude add|remove|list``,
``healer ladder status|stop``."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import pathlib
import sys
import time
import typing
from typing import TYPE_CHECKING, Any

import structlog

from healer import config, errors, health, logs
from healer.bus import nats as natsbus
from healer.bus import provision, subjects
from healer.cli import common, lazy
from healer.schemas import incidents

if TYPE_CHECKING:  # the real modules, for mypy; at run time they load on first use (cli/lazy.py)
    from healer.actuators import factory
    from healer.controller.core import service
    from healer.controller.inventory import admission
    from healer.controller.observability import metrics
    from healer.controller.remediation import healing, policy
    from healer.controller.store import kv
    from healer.rules import loader
    from healer.ui import hook
else:
    factory = lazy.module("healer.actuators.factory")
    admission = lazy.module("healer.controller.inventory.admission")
    kv = lazy.module("healer.controller.store.kv")
    policy = lazy.module("healer.controller.remediation.policy")
    healing = lazy.module("healer.controller.remediation.healing")
    service = lazy.module("healer.controller.core.service")
    metrics = lazy.module("healer.controller.observability.metrics")
    loader = lazy.module("healer.rules.loader")
    hook = lazy.module("healer.ui.hook")

log = structlog.get_logger(__name__)


def register(sub: Any) -> None:
    p = sub.add_parser(
        "controller",
        help="run the controller",
        description="Ingest telemetry and events, evaluate the rules once per tick, open incidents, act "
        "through the safety policy and publish every change on the incident feed (docs/controller.md).",
    )
    common.add_nats_option(p)
    p.add_argument("--rules", help="rules directory (default: rules)")
    p.add_argument("--mode", choices=[m.value for m in incidents.Mode], help="default: dry-run")
    p.add_argument("--actuator", choices=typing.get_args(config.ActuatorName), help="default: log")
    p.add_argument("--model", help="anomaly model directory, e.g. models/default (default: none, score 0)")
    p.add_argument("--tick", type=float, help="seconds between evaluations (default 1)")
    p.add_argument("--metrics-port", type=int, help="Prometheus port, 0 = off (default 9742)")
    p.add_argument("--shards", type=int, help="number of controller shards (default 1)")
    p.add_argument("--shard", type=int, help="this process's shard (default 0)")
    p.add_argument("--cluster", help="cluster name in CloudEvent sources (default: default)")
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
        a.add_argument("--json", action="store_true", help="print the breaker's KV document as JSON")
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

    lad = sub.add_parser("ladder", help="recovery ladders in flight (reset, reboot, validate, return)")
    lsub = lad.add_subparsers(dest="ladder_command", metavar="ACTION")
    lsub.required = True
    status = lsub.add_parser("status", help="list the ladders in flight")
    stop = lsub.add_parser(
        "stop", help="stop a ladder: the node stays as it is, the feed says who stopped it"
    )
    stop.add_argument("incident", help="the incident id (healer ladder status lists them)")
    stop.add_argument("--by", default=None, help="who stops it (default: your user name)")
    stop.add_argument("--reason", default="stopped by an operator")
    for a, name in ((status, "status"), (stop, "stop")):
        common.add_nats_option(a)
        a.set_defaults(func=_ladder, action=name)


def _settings(args: argparse.Namespace) -> config.Settings:
    return common.settings(
        args,
        controller={
            "rules_dir": args.rules,
            "mode": args.mode,
            "actuator": args.actuator,
            "tick_s": args.tick,
            "metrics_port": args.metrics_port,
            "shards": args.shards,
            "shard": args.shard,
            "cluster": args.cluster,
            "model": args.model,
        },
    )


def _connecting(url: str) -> health.Verdict:
    return health.Verdict.of(nats=health.Check(False, f"connecting to {url}"))


async def run_controller(
    s: config.Settings,
    stop: asyncio.Event,
    metrics: metrics.ControllerMetrics,
    beat: health.Health | None = None,
) -> None:
    """Connect (retrying until ``stop``), provision, run the controller until ``stop``, stop it."""
    from healer.actuators import base as actuators
    from healer.actuators import gpu_reset, power

    beat = beat or health.Health(metrics.registry)
    ctl: service.Controller | None = None
    async with common.heartbeat(
        "controller",
        beat,
        lambda: ctl.ready() if ctl is not None else _connecting(s.nats.url),
        metrics.task_failures,
        served=lambda verdict: ctl.served(verdict) if ctl is not None else None,
    ):
        bus = await common.until_stopped(common.connect(s, "healer-controller", service=True), stop)
        try:
            await provision.ensure(bus, subjects.Subjects(s.nats.prefix), s.nats)
            subj = subjects.Subjects(s.nats.prefix)
            gpu = gpu_reset.GpuRecoveryActuator(bus, subj, s.actuators)  # recovery ladders' reset, validate
            scheduler = factory.scheduler(s)
            if isinstance(scheduler, actuators.AgentRouted):  # Kubernetes reboots a node through its agent
                scheduler.agent = gpu
            ctl = await service.build(
                s, bus, scheduler=scheduler, gpu=gpu, metrics=metrics,
                power=lambda c: power.PowerActuator(bus, c, subj, s.actuators),
            )  # fmt: skip
            ctl.served(beat.snapshot()[1])  # what /readyz serves until the next heartbeat: not ready
            await ctl.start()
            # the status page, when ui.enabled (docs/ui.md), with the anomaly model's components
            page = await hook.maybe_start(
                bus, s, anomaly=ctl if s.controller.model else None, admitted=_admitted(ctl),
                labels=_domains(ctl),
            )  # fmt: skip
            await stop.wait()
            if page is not None:
                await page.stop()
            await ctl.stop()
        finally:
            await bus.close()


def _admitted(ctl: Any) -> Any:
    """The controller's admitted nodes, for its status page (``controller.admission``)."""
    gate = getattr(ctl, "admission", None)
    return (lambda: set(gate.admitted)) if gate is not None and hasattr(gate, "admitted") else None


def _domains(ctl: Any) -> Any:
    """The controller's failure domains by node (``Admission.topology()``), for its status page's map:
    the same source as the admitted fleet (#27)."""
    gate = getattr(ctl, "admission", None)
    return (lambda: gate.topology().domains) if gate is not None and hasattr(gate, "topology") else None


def _controller(args: argparse.Namespace) -> int:
    s = _settings(args)
    logs.configure(s.log.level, s.log.format)
    _check_rules(s.controller.rules_dir)
    meters = metrics.ControllerMetrics()
    _check_admission(s, meters)
    beat = health.Health(meters.registry)
    if s.controller.metrics_port:
        port = s.controller.metrics_port
        try:
            beat.serve("0.0.0.0", port, setting="controller.metrics_port (--metrics-port)")
        except errors.PermanentError as e:
            raise common.SettingsError(str(e)) from e
    try:
        common.run(lambda stop: run_controller(s, stop, meters, beat))
    except errors.HealerError as e:
        log.error("controller.fatal", error=str(e))
        raise
    finally:
        beat.close()
    return 0


def _check_rules(rules_dir: str) -> None:
    """Rules that do not load are found before NATS is tried (the controller would refuse them later)."""
    result = loader.load_paths([pathlib.Path(rules_dir)])
    if result.ruleset is None:
        raise common.SettingsError(
            f"the rules in {rules_dir} do not load (set controller.rules_dir / --rules, or fix them; "
            "`healer rules check` lists every error):\n" + "\n".join(str(d) for d in result.errors if d)
        )


def _check_admission(s: config.Settings, metrics: metrics.ControllerMetrics) -> None:
    """An admission the actuator cannot serve (``scheduler`` with the log actuator, ``file`` without a
    readable inventory) is found before NATS is tried, with the controller's own check."""
    try:
        admission.Admission(s.controller, metrics, scheduler=factory.scheduler(s), log=log)
    except errors.PermanentError as e:
        raise common.SettingsError(str(e)) from e


async def _state_store(s: config.Settings) -> tuple[natsbus.NatsBus, kv.Store]:
    """The controller's state bucket, as it is: an admin command never creates or changes it."""
    bus = await common.connect(s, "healer-cli")
    try:
        bucket = await bus.key_value(subjects.Subjects(s.nats.prefix).kv_state)
    except BaseException:
        await bus.close()
        raise
    return bus, kv.Store(bucket)


def _breaker(args: argparse.Namespace) -> int:
    s = common.settings(args)
    logs.configure("error")

    async def main() -> dict[str, Any]:
        bus, store = await _state_store(s)
        try:
            b = policy.Breaker(store, s.controller)
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
    if args.json:
        print(json.dumps(state, indent=2))
    elif args.action == "reset":
        by, at = state.get("reset_by"), when(state.get("reset_at"))
        print(f"breaker reset by {by} at {at}: closed, window cleared")
    else:
        print("\n".join(breaker_lines(state, s.controller.breaker_window_s)))
    return 0


def when(ts: object, now: float | None = None) -> str:
    """A unix time as people read it: ``2026-12-02 04:40:12 UTC (3 min ago)``; ``never`` for none."""
    if not isinstance(ts, int | float) or isinstance(ts, bool):
        return "never"
    now = time.time() if now is None else now
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))
    ago = now - ts
    if ago < 0:
        return f"{stamp} (in the future: check this host's clock)"
    if ago < 90:
        return f"{stamp} ({ago:.0f} s ago)"
    if ago < 5400:
        return f"{stamp} ({ago / 60:.0f} min ago)"
    if ago < 2 * 86400:
        return f"{stamp} ({ago / 3600:.1f} h ago)"
    return f"{stamp} ({ago / 86400:.0f} days ago)"


def breaker_lines(state: dict[str, Any], window_s: float, now: float | None = None) -> list[str]:
    """``healer breaker status`` for people (``--json`` prints the KV document as it is)."""
    entries = [e for e in state.get("entries") or [] if isinstance(e, list | tuple) and len(e) >= 2]
    if state.get("open"):
        head = f"breaker OPEN since {when(state.get('opened_at'), now)}: {state.get('reason') or ''}"
        lines = [head.rstrip(), "nothing more is taken out of service until `healer breaker reset`"]
    else:
        lines = ["breaker closed"]
    lines.append(f"{len(entries)} node(s) taken out of service in its window ({window_s:g} s):")
    for e in entries:
        incident = f"  incident {e[2]}" if len(e) > 2 and e[2] else ""
        lines.append(f"  {e[0]}  {when(e[1], now)}{incident}")
    if state.get("reset_by") or state.get("reset_at"):
        lines.append(f"last reset by {state.get('reset_by')} at {when(state.get('reset_at'), now)}")
    return lines


def _exclude(args: argparse.Namespace) -> int:
    s = common.settings(args)
    logs.configure("error")

    async def main() -> dict[str, dict[str, Any]]:
        bus, store = await _state_store(s)
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
    if args.action == "add":
        print(f"excluded {args.node}: {args.reason} (incidents yes, actions no)")
    elif args.action == "remove":
        print(f"{args.node} is no longer excluded")
    if args.action != "list":
        return 0
    if not nodes:
        print("no nodes excluded")
    for node, info in sorted(nodes.items()):
        print(f"{node}\t{info.get('by')}\t{info.get('reason')}\t{when(info.get('at'))}")
    return 0


def _ladder(args: argparse.Namespace) -> int:
    """``status``: the ladders in flight; ``stop``: ask the leader to stop one (it does so on its next
    tick and publishes who stopped it, and when)."""
    s = common.settings(args)
    logs.configure("error")

    async def main() -> list[dict[str, Any]]:
        bus, store = await _state_store(s)
        try:
            if args.action == "stop":
                if await store.get(healing.PREFIX + args.incident) is None:
                    raise errors.PermanentError(f"no recovery ladder in flight for {args.incident}")
                who = {"by": args.by or getpass.getuser(), "reason": args.reason, "at": time.time()}
                await store.put(healing.STOP_PREFIX + args.incident, who)
                return [{"incident": args.incident, "stop_requested": who}]
            out = []
            for key in sorted(await store.keys(healing.PREFIX)):
                doc = await store.get(key)
                if doc is None:
                    continue
                state, pending = doc.value.get("state", {}), doc.value.get("pending", {})
                out.append(
                    {
                        "incident": state.get("incident_id"), "ladder": state.get("ladder_id"),
                        "node": state.get("node"), "gpu": state.get("gpu_index"),
                        "phase": str(state.get("phase", "")).lower(), "next": pending.get("kind"),
                        "reason": pending.get("reason"), "started_at": state.get("started_at"),
                    }
                )  # fmt: skip
            return out
        finally:
            await bus.close()

    try:
        rows = asyncio.run(main())
    except errors.HealerError as e:
        print(f"healer ladder: {e}", file=sys.stderr)
        return 1
    if args.action == "stop":
        print(json.dumps(rows[0], indent=2))
        return 0
    if not rows:
        print("no recovery ladders in flight")
    for row in rows:
        cells = (row["incident"], row["node"], f"gpu {row['gpu']}", row["ladder"], row["phase"], row["next"])
        print("\t".join(str(c) for c in [*cells, f"started {when(row['started_at'])}"]))
    return 0
