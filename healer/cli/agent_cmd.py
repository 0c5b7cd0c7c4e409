"""``healer agent``: run the node agent (NVML or a simulated node) until SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import signal
import socket
from typing import Any

import prometheus_client
import structlog

from healer import config, errors, logs
from healer.agent import metrics as metrics_mod
from healer.agent import runner
from healer.bus import base, provision, subjects
from healer.bus import nats as natsbus
from healer.cli import common
from healer.telemetry import sim, source

log = structlog.get_logger(__name__)


def register(sub: Any) -> None:
    p = sub.add_parser("agent", help="run the node agent", description=__doc__)
    common.add_nats_option(p)
    p.add_argument("--node", help="node name as the scheduler knows it (default: host name)")
    p.add_argument("--source", choices=["nvml", "sim"], help="reading source (default: nvml)")
    p.add_argument("--interval", type=float, help="seconds between frames (default: 1)")
    p.add_argument("--gpus-expected", type=int, help="GPUs this node must have (default: what NVML finds)")
    p.add_argument("--sim-gpus", type=int, help="GPUs of the simulated node (default: 8)")
    p.add_argument("--state-dir", help="spool and power-limit state (default: ~/.local/state/healer)")
    p.add_argument("--metrics-port", type=int, help="Prometheus port, 0 = off (default: 9741)")
    p.add_argument("--provision", action="store_true", help="create streams and buckets if missing")
    p.add_argument("--no-xid-watch", action="store_true", help="do not watch NVML events in a thread")
    common.add_config_option(p)
    p.set_defaults(func=run)


def settings_from(args: argparse.Namespace) -> config.Settings:
    s = config.load(args.config)
    overrides = {
        "node": args.node,
        "source": args.source,
        "interval_s": args.interval,
        "gpus_expected": args.gpus_expected,
        "sim_gpus": args.sim_gpus,
        "state_dir": args.state_dir,
        "metrics_port": args.metrics_port,
    }
    agent = s.agent.model_copy(update={k: v for k, v in overrides.items() if v is not None})
    if args.no_xid_watch:
        agent = agent.model_copy(update={"xid_watch": False})
    nats = s.nats.model_copy(update={"url": args.nats, "prefix": args.prefix})
    return config.Settings.model_validate(
        {**s.model_dump(), "agent": agent.model_dump(), "nats": nats.model_dump()}
    )


def build_source(
    s: config.AgentSettings, node: str
) -> tuple[source.TelemetrySource, source.EventWatcher | None]:
    if s.source == "sim":
        return sim.SimSource(node, gpus=s.sim_gpus), None
    from healer.telemetry import kernel_log, nvml, watchers, xid  # only a real node needs NVML

    src = nvml.NvmlSource(node, gpus_expected=s.gpus_expected)
    found: list[source.EventWatcher] = [xid.XidWatcher(node)] if s.xid_watch else []
    if s.kmsg_watch:
        found.append(
            kernel_log.KmsgWatcher(node, state_dir=s.state_dir, path=s.kmsg_path, resolve=src.gpu_at)
        )
    hold_s = s.xid_log_wait_s if s.kmsg_watch else 0.0
    return src, watchers.Combined(found, window_s=s.xid_dedupe_window_s, hold_s=hold_s) if found else None


def run(args: argparse.Namespace) -> int:
    try:
        s = settings_from(args)
    except errors.PermanentError as e:
        print(f"healer agent: {e}")
        return 2
    logs.configure(s.log.level, s.log.format)
    node = s.agent.node or socket.gethostname()
    metrics = metrics_mod.AgentMetrics(job_map_dir=s.agent.job_map_dir)
    if s.agent.metrics_port:
        prometheus_client.start_http_server(
            s.agent.metrics_port, s.agent.metrics_addr, registry=metrics.registry
        )
    src, watcher = build_source(s.agent, node)
    try:
        asyncio.run(_main(s, node, src, watcher, metrics, provision_streams=args.provision))
    except errors.PermanentError as e:
        log.error("agent.fatal", error=str(e))
        return 1
    return 0


async def _main(
    s: config.Settings,
    node: str,
    src: source.TelemetrySource,
    watcher: source.EventWatcher | None,
    metrics: metrics_mod.AgentMetrics,
    *,
    provision_streams: bool,
) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    subj = subjects.Subjects(s.nats.prefix)

    async def connect() -> base.Bus:
        bus = await natsbus.NatsBus.connect(
            s.nats.url, name=f"healer-agent-{node}", nats_settings=s.nats, retry=s.retry
        )
        if provision_streams:
            await provision.ensure(bus, subj, s.nats)
        return bus

    agent = runner.Agent(
        node=node,
        source=src,
        connect=connect,
        subjects=subj,
        state_dir=s.agent.state_dir,
        interval_s=s.agent.interval_s,
        gpus_expected=s.agent.gpus_expected,
        buffer_frames=s.agent.buffer_frames,
        watcher=watcher,
        metrics=metrics,
    )
    log.info("agent.starting", node=node, source=src.kind, nats=s.nats.url, interval_s=s.agent.interval_s)
    try:
        await agent.run(stop)
    finally:
        if agent.bus is not None:
            await agent.bus.close()
