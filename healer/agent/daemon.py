"""Agent: the loop that turns a TelemetrySource into frames, events and command replies on the bus.

It never stops sampling because NATS is away. Frames go into a bounded buffer (the oldest are dropped
and counted: stale telemetry is worth little, memory on a GPU node is worth a lot); events go through
the on-disk EventSpool and are delivered exactly once when NATS is back. Sampling runs in a worker
thread so a slow NVML call cannot stall command handling, and ticks keep a fixed cadence: an overrun
skips intervals (counted) instead of drifting.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import pathlib
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence

import orjson
import structlog

import healer
from healer import errors, health, tasks
from healer.agent import execution, exposition, host, spool
from healer.bus import base, subjects
from healer.schemas import codec, events, fabric, telemetry
from healer.telemetry import fabricmanager, rdma, source

log = structlog.get_logger(__name__)
RECENT_EVENTS = 1024
"""XID / GPU-lost events kept (with their receive time) for validation's quiet soak."""
LEASE_SHARDS_MAX = 64
"""Lease keys read at most (``leader.shard-0`` .. ``-63``) when checking a new fencing token."""

Connector = Callable[[], Awaitable[base.Bus]]


class Agent:
    def __init__(
        self,
        *,
        node: str,
        source: source.TelemetrySource,
        state_dir: str | pathlib.Path,
        bus: base.Bus | None = None,
        connect: Connector | None = None,
        subjects: subjects.Subjects | None = None,
        interval_s: float = 1.0,
        gpus_expected: int | None = None,
        buffer_frames: int = 300,
        watcher: source.EventWatcher | None = None,
        metrics: exposition.AgentMetrics | None = None,
        reboot_command: Sequence[str] | None = None,
        ports: rdma.PortReader | None = None,
        port_control: execution.PortControl | None = None,
        fabric_manager: fabricmanager.FabricManagerProbe | None = None,
        fabric_manager_mode: str = "auto",
        clock: Callable[[], float] = time.time,
    ) -> None:
        if bus is None and connect is None:
            raise ValueError("Agent needs a bus or a way to connect to one")
        self.node = node
        self.source = source
        self.bus = bus
        self._connect = connect
        self.subjects = subjects or healer.bus.subjects.Subjects()  # the parameter shadows the module
        self.interval_s = interval_s
        self.gpus_expected = gpus_expected
        self.watcher = watcher
        self.ports = ports
        """Reads the node's RDMA ports each tick (telemetry.rdma.PortReader); None: frames carry none."""
        self.fabric_manager = fabric_manager if fabric_manager_mode != "off" else None
        self.fabric_manager_mode = fabric_manager_mode
        """``auto``: check once a GPU reports a fabric state; ``on``: always (config agent.fabric_manager)."""
        self.metrics = metrics or exposition.AgentMetrics()
        if watcher is not None:
            self.metrics.watchers.attach(watcher)
        self.clock = clock
        self.boot_id = uuid.uuid4().hex
        self.seq = 0
        self.state_dir = pathlib.Path(state_dir)
        self.spool = spool.EventSpool(self.state_dir)
        self.frames: collections.deque[bytes] = collections.deque(maxlen=buffer_frames)
        self.executor = execution.CommandExecutor(
            node,
            source,
            self.state_dir / "power.json",
            clock=clock,
            gpu_indices=self._gpu_indices,
            gpu=source if callable(getattr(source, "reset_gpu", None)) else None,  # type: ignore[arg-type]
            health=self._health,
            reboot=host.rebooter(reboot_command) if reboot_command else None,
            ports=port_control,
        )
        self._last_indices: list[int] = []
        self._last_gpus: list[telemetry.GpuSample] = []
        self._last_ports: list[fabric.PortSample] | None = None
        self._recent_events: collections.deque[tuple[float, events.NodeEvent]] = collections.deque(
            maxlen=RECENT_EVENTS
        )
        self._wake = asyncio.Event()
        self._stopping = False
        self._cmd_sub: base.Subscription | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.log = log.bind(node=node)

    # -- public ------------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set; then say goodbye (agent_stop) and deliver what is spooled."""
        self._loop = asyncio.get_running_loop()
        await asyncio.to_thread(self.source.open)
        if self.gpus_expected is None:
            self.gpus_expected = self.source.gpus_expected
        if self.watcher is not None:
            self.watcher.start(self._emit_threadsafe)
        self.emit(
            events.new(self.node, "agent_start", message=f"healer {healer.__version__} boot {self.boot_id}")
        )
        jobs = tasks.Scheduler("agent", self.metrics.task_failures, log=self.log)
        delivering = jobs.spawn("events", self._deliver_events())
        jobs.spawn("connect", self._ensure_connected())
        try:
            await self._tick_loop(stop)
        finally:
            self.emit(events.new(self.node, "agent_stop", message="stopping"))
            self._stopping = True
            self._wake.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.wait([delivering]), timeout=3.0)
            await jobs.close()  # a task's failure was logged and counted when it ended
            if self.watcher is not None:
                await asyncio.to_thread(self.watcher.stop)
            if self._cmd_sub is not None:
                with contextlib.suppress(errors.HealerError):
                    await self._cmd_sub.unsubscribe()
            await asyncio.to_thread(self.source.close)
            self.log.info("agent.stopped", frames=self.seq, events_pending=len(self.spool))

    def emit(self, event: events.NodeEvent) -> None:
        """Spool an event (fsynced) and wake the sender; safe from the loop thread only."""
        try:
            self.spool.append(event)
        except errors.PermanentError as e:
            self.log.error("agent.event_lost", kind=event.kind, error=str(e))
            return
        if event.kind in ("xid", "gpu_lost"):
            self._recent_events.append((self.clock(), event))
        self.metrics.events.labels(event.kind).inc()
        self.metrics.gpu.observe_event(event)
        self.metrics.events_pending.set(len(self.spool))
        self.log.info("agent.event", kind=event.kind, gpu=event.gpu_index, xid=event.xid, event_id=event.id)
        self._wake.set()

    # -- connection --------------------------------------------------------------------------------
    async def _ensure_connected(self) -> None:
        if self.bus is None:
            assert self._connect is not None
            try:
                self.bus = await self._connect()
            except errors.HealerError as e:
                # Sampling and spooling go on; only a restart (or a fixed URL) brings NATS back.
                self.log.error("agent.connect_failed", error=str(e))
                return
        self._cmd_sub = await self.bus.subscribe(self.subjects.command(self.node), self._on_command)
        self.log.info("agent.ready", subject=self.subjects.command(self.node))
        self._wake.set()

    def _online(self) -> base.Bus | None:
        bus = self.bus
        up = bus is not None and bus.connected and self._cmd_sub is not None
        self.metrics.nats_connected.set(1 if up else 0)
        return bus if up else None

    # -- telemetry ---------------------------------------------------------------------------------
    async def _tick_loop(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        next_t = loop.time()
        while not stop.is_set():
            await self.tick()
            next_t += self.interval_s
            now = loop.time()
            if next_t < now:
                missed = int((now - next_t) // self.interval_s) + 1
                self.metrics.ticks_skipped.inc(missed)
                next_t += missed * self.interval_s
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=next_t - now)

    async def tick(self) -> None:
        """Sample once and publish (or buffer) the frame."""
        ts = self.clock()
        started = time.perf_counter()
        try:
            sample, ports = await asyncio.to_thread(self._sample)
        except errors.HealerError as e:
            self.metrics.sample_errors.inc()
            self.log.error("agent.sample_failed", error=str(e))
            return
        finally:
            self.metrics.sample_seconds.observe(time.perf_counter() - started)
        for ev in sample.events:
            self.emit(ev)
        self._last_indices = [g.index for g in sample.gpus]
        self._last_gpus = list(sample.gpus)
        self._last_ports = ports
        fm_up = self._fabric_manager_up(sample.gpus)
        frame = telemetry.NodeFrame(
            node=self.node,
            ts=ts,
            seq=self.seq,
            boot_id=self.boot_id,
            agent_version=healer.__version__,
            source=self.source.kind,
            gpus_expected=self.gpus_expected,
            gpus=sample.gpus,
            ports=ports,
            fabric_manager_up=fm_up,
            schema=telemetry.SCHEMA if ports is None and fm_up is None else telemetry.SCHEMA_V2,
        )
        self.seq += 1
        self.metrics.gpus.set(len(sample.gpus))
        self.metrics.gpu.observe(frame)
        self.metrics.ports.observe(frame)
        await self._send_frame(codec.encode(frame))

    def _fabric_manager_up(self, gpus: Sequence[telemetry.GpuSample]) -> bool | None:
        probe = self.fabric_manager
        if probe is None:
            return None
        if self.fabric_manager_mode == "auto" and all(g.fabric_state is None for g in gpus):
            return None  # no NVSwitch fabric on this node: nothing to manage
        up = probe.running()
        self.metrics.fabric_manager_up.labels(fabricmanager.COMM).set(1 if up else 0)
        return up

    def _with_jobs(self, sample: source.Sample) -> source.Sample:
        """Each GPU's job ids from the job-mapping directory (``agent.job_map_dir``), so the controller
        can compare a GPU with the other GPUs of its job (docs/fail-slow.md); ``[]`` for a GPU without
        a job file."""
        jobs = self.metrics.gpu.jobs()
        cap = telemetry.JOBS_MAX
        gpus = [g.model_copy(update={"jobs": jobs.get(g.index, [])[:cap]}) for g in sample.gpus]
        return dataclasses.replace(sample, gpus=gpus)

    def _sample(self) -> tuple[source.Sample, list[fabric.PortSample] | None]:
        """One worker-thread hop for the GPUs and the RDMA ports. A port reader that fails as a whole
        costs this frame its ports (counted, logged), never the GPUs' readings."""
        sample = self.source.sample()
        if self.metrics.gpu.job_map_dir is not None:
            sample = self._with_jobs(sample)
        if self.ports is None:
            return sample, None
        errors_before = self.ports.read_errors
        try:
            return sample, self.ports.read()
        except Exception as e:  # a bug in the reader must not stop the GPU telemetry
            self.metrics.port_read_failures.inc()
            self.log.error("agent.ports_failed", error=str(e) or repr(e))
            return sample, None
        finally:
            self.metrics.port_read_errors.inc(self.ports.read_errors - errors_before)

    async def _send_frame(self, data: bytes) -> None:
        bus = self._online()
        if bus is not None:
            try:
                while self.frames:
                    await bus.publish(self.subjects.telemetry(self.node), self.frames[0])
                    self.frames.popleft()
                    self.metrics.frames_published.inc()
                await bus.publish(self.subjects.telemetry(self.node), data)
                self.metrics.frames_published.inc()
                self.metrics.frames_buffered.set(len(self.frames))
                return
            except errors.TemporaryError as e:
                self.log.warning("agent.publish_failed", error=str(e))
        if len(self.frames) == self.frames.maxlen:
            self.metrics.frames_dropped.inc()
        self.frames.append(data)
        self.metrics.frames_buffered.set(len(self.frames))

    # -- events ------------------------------------------------------------------------------------
    def _emit_threadsafe(self, event: events.NodeEvent) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self.emit, event)

    async def _deliver_events(self) -> None:
        delay = 0.1
        while True:
            item = self.spool.peek()
            bus = self._online()
            if item is None or bus is None:
                if item is None and self._stopping:
                    return
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=0.5)
                continue
            try:
                await bus.publish_durable(self.subjects.events(item.node), item.data, msg_id=item.event_id)
            except errors.TemporaryError as e:
                self.log.warning(
                    "agent.event_delivery_retry", event_id=item.event_id, error=str(e), delay=delay
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            except errors.PermanentError as e:
                self.spool.drop(item, str(e))
                self.metrics.events_rejected.inc()
            else:
                self.spool.ack(item)
                self.metrics.events_delivered.inc()
            delay = 0.1
            self.metrics.events_pending.set(len(self.spool))

    # -- commands ----------------------------------------------------------------------------------
    def _gpu_indices(self) -> list[int]:
        if self._last_indices:
            return list(self._last_indices)
        return list(range(self.gpus_expected or 0))

    def _health(self, since: float | None) -> execution.Health:
        """For ``validate``: the newest frame's GPUs and the XID / GPU-lost events received since then."""
        recent = [ev for ts, ev in list(self._recent_events) if since is not None and ts >= since]
        return execution.Health(list(self._last_gpus), self.gpus_expected, recent, self._last_ports)

    async def _live_tokens(self) -> execution.LiveTokens | None:
        """The fencing tokens of the leases held now: ``leader.shard-0``, ``-1``, ... up to the first
        shard without one. A lease document carries its token once renewed (before that its revision is
        the token); a document claiming a token above its own revision is forged and counts for nothing,
        so no token beyond the lease's real revision is ever accepted. None on a bus without JetStream
        (nothing to check against)."""
        reader = getattr(self.bus, "last_message", None)
        if reader is None:
            return None
        tokens: set[int] = set()
        try:
            for shard in range(LEASE_SHARDS_MAX):
                found = await reader(
                    self.subjects.stream_leases, self.subjects.lease_subject(f"leader.shard-{shard}")
                )
                if found is None:
                    break
                revision, data = found
                claimed = int(orjson.loads(data).get("token") or revision)
                if claimed <= revision:  # a token is the revision at acquisition: never above the current
                    tokens.add(claimed)
        except (errors.HealerError, ValueError, TypeError, AttributeError) as e:
            return execution.LiveTokens(frozenset(), error=str(e) or repr(e))
        return execution.LiveTokens(frozenset(tokens))

    async def _on_command(self, msg: base.Msg) -> None:
        try:
            cmd = codec.decode_command(msg.data)
        except errors.DecodeError as e:
            self.metrics.decode_errors.labels(e.reason).inc()
            result = self.executor.refuse_undecodable(str(e))
            action = "unknown"
        else:
            live = await self._live_tokens() if self.executor.needs_lease(cmd) else None
            refused_before = self.executor.fencing_refused
            result = await asyncio.to_thread(self.executor.execute, cmd, live)
            self.metrics.fencing_refused.inc(self.executor.fencing_refused - refused_before)
            action = cmd.action
        self.metrics.commands.labels(action, result.status).inc()
        if msg.reply:
            await msg.respond(codec.encode(result))

    # -- readiness (served by /readyz; read-only, computed on the event loop) ------------------------
    def ready(self) -> health.Verdict:
        """Connected with the command subscription in place, and sampling (a frame made)."""
        bus = self.bus
        if bus is None:
            nats = health.Check(False, "connecting")
        elif not bus.connected:
            nats = health.Check(False, "disconnected (frames buffered, events spooled)")
        else:
            nats = health.Check(self._cmd_sub is not None, "connected")
        return health.Verdict.of(
            nats=nats,
            sampling=health.Check(self.seq > 0, f"{self.seq} frames" if self.seq else "no frame yet"),
            spool=health.Check(True, f"{len(self.spool)} events pending"),
        )
