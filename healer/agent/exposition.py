"""The agent's Prometheus metrics, on a registry of its own (several agents can share a process)."""

from __future__ import annotations

import pathlib
import typing

import prometheus_client as prom

from healer import actions, buildinfo, metricdecl, tasks
from healer.agent import gpu_metrics, port_metrics, watcher_metrics
from healer.schemas import codec, commands, events


class AgentMetrics(metricdecl.MetricSet):
    """Every metric of the agent, declared once (``healer.metricdecl``), and the collectors that read the
    GPUs, ports and watchers at scrape time."""

    build_info = metricdecl.Declared(lambda r: buildinfo.register(r, "agent"))
    port_read_failures = metricdecl.counter(
        "healer_agent_port_read_failures_total",
        "frames sent without ports because reading them failed as a whole (a bug: see the log)",
    )
    fabric_manager_up = metricdecl.gauge(
        "healer_agent_fabric_manager_up",
        "1 while NVIDIA Fabric Manager runs, 0 when not; no series where it is not checked",
        ["process"],
    )
    port_read_errors = metricdecl.counter(
        "healer_agent_port_read_errors_total",
        "sysfs files of RDMA ports that could not be read or parsed (null in the frame)",
    )
    frames_published = metricdecl.counter("healer_agent_frames_published_total", "NodeFrames published")
    frames_dropped = metricdecl.counter(
        "healer_agent_frames_dropped_total", "frames dropped because the outage buffer was full"
    )
    frames_buffered = metricdecl.gauge("healer_agent_frames_buffered", "frames waiting for NATS to come back")
    ticks_skipped = metricdecl.counter(
        "healer_agent_ticks_skipped_total", "intervals skipped because sampling overran"
    )
    task_failures = metricdecl.Declared(lambda r: tasks.failures_counter("healer_agent", r))
    """The agent's own tasks (``events``, ``connect``) that raised (``tasks.Scheduler``)."""
    sample_seconds = metricdecl.histogram(
        "healer_agent_sample_seconds",
        "time to read every GPU once",
        (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
    )
    sample_errors = metricdecl.counter("healer_agent_sample_errors_total", "samples that failed as a whole")
    gpus = metricdecl.gauge("healer_agent_gpus", "GPUs in the last frame")
    events = metricdecl.counter("healer_agent_events_total", "node events emitted", ["kind"])
    events_pending = metricdecl.gauge(
        "healer_agent_events_pending", "events spooled and not yet stored by JetStream"
    )
    events_delivered = metricdecl.counter("healer_agent_events_delivered_total", "events stored by JetStream")
    events_rejected = metricdecl.counter(
        "healer_agent_events_rejected_total", "events JetStream refused for good"
    )
    commands = metricdecl.counter("healer_agent_commands_total", "commands handled", ["action", "status"])
    fencing_refused = metricdecl.counter(
        "healer_agent_fencing_refused_total",
        "commands refused: their new fencing token is no live lease's (or the lease was unreadable)",
    )
    decode_errors = metricdecl.counter(
        "healer_agent_decode_errors_total", "undecodable messages received", ["reason"]
    )
    nats_connected = metricdecl.gauge("healer_agent_nats_connected", "1 while connected to NATS")

    def __init__(
        self,
        registry: prom.CollectorRegistry | None = None,
        *,
        job_map_dir: str | pathlib.Path | None = None,
    ) -> None:
        super().__init__(registry)
        self.gpu = gpu_metrics.GpuCollector(job_map_dir)
        """The GPUs' readings under dcgm-exporter's names (docs/agent.md)."""
        self.registry.register(self.gpu)
        self.ports = port_metrics.PortCollector()
        """The RDMA ports' readings under node_exporter's ``node_infiniband_*`` names (docs/agent.md)."""
        self.registry.register(self.ports)
        self.watchers = watcher_metrics.WatcherCollector()
        """The event watchers' counts (docs/agent.md); the Agent attaches its watcher."""
        self.registry.register(self.watchers)
        for action in actions.AGENT_COMMANDS:  # zeros, not "No data", on a healthy node
            for status in commands.ResultStatus:
                self.commands.labels(action, status)
        for reason in codec.DECODE_REASONS:
            self.decode_errors.labels(reason)
        for kind in typing.get_args(events.EventKind):
            self.events.labels(kind)
