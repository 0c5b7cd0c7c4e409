"""``healer agent``: run the node agent (NVML or a simulated node) until SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import socket
import tempfile
from typing import TYPE_CHECKING, Any

import structlog

from healer import config, errors, health, logs
from healer.agent import daemon, exposition, link_reset
from healer.bus import base, provision, subjects
from healer.cli import common, lazy
from healer.telemetry import fabricmanager, rdma, source

if TYPE_CHECKING:  # the real modules, for mypy; at run time they load on first use (cli/lazy.py)
    from healer.sim import node_source
else:
    node_source = lazy.module("healer.sim.node_source")

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
    p.add_argument("--sysfs-root", help="where sysfs is, for the RDMA ports (default: /sys)")
    p.set_defaults(func=run)


def settings_from(args: argparse.Namespace) -> config.Settings:
    return common.settings(
        args,
        agent={
            "node": args.node,
            "source": args.source,
            "interval_s": args.interval,
            "gpus_expected": args.gpus_expected,
            "sim_gpus": args.sim_gpus,
            "state_dir": args.state_dir,
            "metrics_port": args.metrics_port,
            "xid_watch": False if args.no_xid_watch else None,
            "sysfs_root": args.sysfs_root,
        },
    )


def build_source(
    s: config.AgentSettings, node: str
) -> tuple[source.TelemetrySource, source.EventWatcher | None]:
    if s.source == "sim":
        try:
            return node_source.SimSource(node, gpus=s.sim_gpus), None
        except ModuleNotFoundError as e:  # an agent-only install: the simulator is the `sim` extra
            raise common.SettingsError(
                f"agent.source sim needs {e.name}: pip install 'healer[sim]' (GPU nodes use source nvml)"
            ) from e
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
    s = settings_from(args)
    logs.configure(s.log.level, s.log.format)
    node = s.agent.node or socket.gethostname()
    metrics = exposition.AgentMetrics(job_map_dir=s.agent.job_map_dir)
    beat = health.Health(metrics.registry)
    if s.agent.metrics_port:
        try:
            beat.serve(
                s.agent.metrics_addr, s.agent.metrics_port, setting="agent.metrics_port (--metrics-port)"
            )
        except errors.PermanentError as e:
            raise common.SettingsError(str(e)) from e
    try:
        _check_state_dir(s.agent.state_dir)
        src, watcher = build_source(s.agent, node)
        common.run(
            lambda stop: _main(s, node, src, watcher, metrics, beat, stop, provision_streams=args.provision)
        )
    except errors.PermanentError as e:
        log.error("agent.fatal", error=str(e))
        raise
    finally:
        beat.close()
    return 0


def _check_state_dir(path: str) -> None:
    """An unwritable state directory is a setting to fix, said at start (the spool lives there)."""
    try:
        pathlib.Path(path).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise common.SettingsError(
            f"cannot write the state directory {path}: {e.strerror or e}; set agent.state_dir (--state-dir)"
        ) from e


async def _main(
    s: config.Settings,
    node: str,
    src: source.TelemetrySource,
    watcher: source.EventWatcher | None,
    metrics: exposition.AgentMetrics,
    beat: health.Health,
    stop: asyncio.Event,
    *,
    provision_streams: bool,
) -> None:
    subj = subjects.Subjects(s.nats.prefix)

    refused: list[errors.HealerError] = []

    async def connect() -> base.Bus:
        try:
            bus = await common.connect(s, f"healer-agent-{node}", service=True)
        except errors.HealerError as e:
            refused.append(e)  # the agent samples and spools on; /readyz says why NATS is missing
            raise
        if provision_streams:
            await provision.ensure(bus, subj, s.nats)
        return bus

    def ready() -> health.Verdict:
        verdict = agent.ready()
        if agent.bus is None and refused:
            why = health.Check(False, f"gave up (restart after fixing the settings): {refused[-1]}")
            return health.Verdict({**verdict.checks, "nats": why})
        return verdict

    agent = daemon.Agent(
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
        reboot_command=s.agent.reboot_command,
        ports=rdma.PortReader(s.agent.sysfs_root) if s.agent.rdma_ports else None,
        port_control=link_reset.LinkResetter(
            s.agent.sysfs_root, ethernet=s.agent.port_reset_ethernet, infiniband=s.agent.port_reset_infiniband
        )
        if s.agent.rdma_ports
        else None,
        fabric_manager=fabricmanager.FabricManagerProbe(
            s.agent.proc_root, pid_file=s.agent.fabric_manager_pid_file
        ),
        fabric_manager_mode=s.agent.fabric_manager,
    )
    log.info("agent.starting", node=node, source=src.kind, nats=s.nats.url, interval_s=s.agent.interval_s)
    try:
        async with common.heartbeat("agent", beat, ready, agent.metrics.task_failures):
            await agent.run(stop)
    finally:
        if agent.bus is not None:
            await agent.bus.close()
