"""The agent's Prometheus metrics, on a registry of its own (several agents can share a process)."""

from __future__ import annotations

import pathlib
import typing

import prometheus_client as prom

from healer import actions, buildinfo, tasks
from healer.agent import gpu_metrics, port_metrics, watcher_metrics
from healer.schemas import codec, commands, events


class AgentMetrics:
    def __init__(
        self,
        registry: prom.CollectorRegistry | None = None,
        *,
        job_map_dir: str | pathlib.Path | None = None,
    ) -> None:
        self.registry = registry or prom.CollectorRegistry()
        r = self.registry
        self.build_info = buildinfo.register(r, "agent")
        self.gpu = gpu_metrics.GpuCollector(job_map_dir)
        """The GPUs' readings under dcgm-exporter's names (docs/agent.md)."""
        r.register(self.gpu)
        self.ports = port_metrics.PortCollector()
        """The RDMA ports' readings under node_exporter's ``node_infiniband_*`` names (docs/agent.md)."""
        r.register(self.ports)
        self.port_read_failures = prom.Counter(
            "healer_agent_port_read_failures_total",
            "frames sent without ports because reading them failed as a whole (a bug: see the log)",
            registry=r,
        )
        self.fabric_manager_up = prom.Gauge(
            "healer_agent_fabric_manager_up",
            "1 while NVIDIA Fabric Manager runs, 0 when not; no series where it is not checked",
            ["process"],
            registry=r,
        )
        self.port_read_errors = prom.Counter(
            "healer_agent_port_read_errors_total",
            "sysfs files of RDMA ports that could not be read or parsed (null in the frame)",
            registry=r,
        )
        self.watchers = watcher_metrics.WatcherCollector()
        """The event watchers' counts (docs/agent.md); the Agent attaches its watcher."""
        r.register(self.watchers)
        self.frames_published = prom.Counter(
            "healer_agent_frames_published_total", "NodeFrames published", registry=r
        )
        self.frames_dropped = prom.Counter(
            "healer_agent_frames_dropped_total",
            "frames dropped because the outage buffer was full",
            registry=r,
        )
        self.frames_buffered = prom.Gauge(
            "healer_agent_frames_buffered", "frames waiting for NATS to come back", registry=r
        )
        self.ticks_skipped = prom.Counter(
            "healer_agent_ticks_skipped_total", "intervals skipped because sampling overran", registry=r
        )
        self.task_failures = tasks.failures_counter("healer_agent", r)
        """The agent's own tasks (``events``, ``connect``) that raised (``tasks.Scheduler``)."""
        self.sample_seconds = prom.Histogram(
            "healer_agent_sample_seconds",
            "time to read every GPU once",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
            registry=r,
        )
        self.sample_errors = prom.Counter(
            "healer_agent_sample_errors_total", "samples that failed as a whole", registry=r
        )
        self.gpus = prom.Gauge("healer_agent_gpus", "GPUs in the last frame", registry=r)
        self.events = prom.Counter("healer_agent_events_total", "node events emitted", ["kind"], registry=r)
        self.events_pending = prom.Gauge(
            "healer_agent_events_pending", "events spooled and not yet stored by JetStream", registry=r
        )
        self.events_delivered = prom.Counter(
            "healer_agent_events_delivered_total", "events stored by JetStream", registry=r
        )
        self.events_rejected = prom.Counter(
            "healer_agent_events_rejected_total", "events JetStream refused for good", registry=r
        )
        self.commands = prom.Counter(
            "healer_agent_commands_total", "commands handled", ["action", "status"], registry=r
        )
        self.fencing_refused = prom.Counter(
            "healer_agent_fencing_refused_total",
            "commands refused: their new fencing token is no live lease's (or the lease was unreadable)",
            registry=r,
        )
        self.decode_errors = prom.Counter(
            "healer_agent_decode_errors_total", "undecodable messages received", ["reason"], registry=r
        )
        self.nats_connected = prom.Gauge(
            "healer_agent_nats_connected", "1 while connected to NATS", registry=r
        )
        for action in actions.AGENT_COMMANDS:  # zeros, not "No data", on a healthy node
            for status in commands.ResultStatus:
                self.commands.labels(action, status)
        for reason in codec.DECODE_REASONS:
            self.decode_errors.labels(reason)
        for kind in typing.get_args(events.EventKind):
            self.events.labels(kind)
