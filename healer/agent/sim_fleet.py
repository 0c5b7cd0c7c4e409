"""LiveFleet: one process playing N node agents on a real bus, answering commands like real agents.

Every interval it steps the simulation with the wall-clock time that passed, publishes one NodeFrame
per reporting node on ``telemetry.<node>`` (core publish), publishes new NodeEvents on
``events.<node>`` with JetStream (``Nats-Msg-Id`` = event id; a publish that fails is retried on the
next tick, never dropped), with the scenario's ``steps`` each training rank's step time on
``steps.<job>`` (core publish, as a job's ``healer.steps`` reporter sends it), and hands new
ground-truth records to a sink. Commands on ``cmd.*`` go to a
per-node ``agent.execution.CommandExecutor`` (the real agent's) whose power control is that node's GPUs
in the simulation, so a power cap from the controller cools the simulated GPU: the closed loop. A
silent node (agent dead) neither publishes nor answers.

Like the agent, this is a top-layer runner: it imports ``healer.agent`` and ``healer.bus``; nothing else
in ``healer.sim`` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import orjson
import structlog

from healer import errors
from healer.agent import execution
from healer.bus import base, subjects
from healer.schemas import codec, events, telemetry
from healer.sim import frames, physics, simulation
from healer.telemetry import source

log = structlog.get_logger(__name__)

EVENT_BATCH = 256
"""Durable publishes in flight at once (agent_start of thousands of nodes at startup)."""
MAX_UNSENT_EVENTS = 100_000
"""Events kept for retry while JetStream refuses them; past it the oldest are dropped and counted."""


class NodePower:
    """One simulated node's GPUs as the executor's PowerControl."""

    def __init__(self, fl: physics.Fleet, node: int) -> None:
        self._fleet = fl
        self._node = node

    def power_limits(self, index: int) -> source.PowerLimits:
        return self._fleet.power_limits(self._node, index)

    def set_power_limit(self, index: int, watts: float) -> None:
        self._fleet.set_power_limit(self._node, index, watts)

    def gpu_indices(self) -> list[int]:
        return [int(g) for g in self._fleet.present[self._node].nonzero()[0]]

    # GPU recovery (reset_gpu): the fleet's reset model; the controller drained the node first
    def compute_processes(self, index: int) -> list[int]:
        self._fleet.power_limits(self._node, index)  # the same checks: no such GPU, a lost GPU
        return []

    def device_info(self, index: int) -> dict[str, str | None]:
        name = self._fleet.node_names[self._node]
        return {"uuid": None, "serial": f"SIM-{name}-{index:02d}", "board_part_number": "sim",
                "vbios_version": "sim", "driver_version": "sim"}  # fmt: skip

    def reset_gpu(self, index: int, timeout_s: float) -> str:
        self._fleet.reset_gpu_checked(self._node, index)
        return f"simulated GPU {index} reset"


@dataclasses.dataclass
class Stats:
    ticks: int = 0
    frames: int = 0
    frames_dropped: int = 0
    events: int = 0
    events_retried: int = 0
    events_dropped: int = 0
    commands: int = 0
    commands_ignored: int = 0
    step_reports: int = 0
    """Training jobs' step times published (the scenario's ``steps``)."""
    overruns: int = 0
    step_s: float = 0.0
    """Wall time spent stepping, encoding and publishing, summed over ticks."""


class LiveFleet:
    def __init__(
        self,
        sim: simulation.Simulation,
        bus: base.Bus,
        subj: subjects.Subjects,
        *,
        interval_s: float = 1.0,
        truth_sink: Callable[[list[dict[str, Any]]], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.sim = sim
        self.bus = bus
        self.subjects = subj
        self.interval_s = interval_s
        self.truth_sink = truth_sink
        self.clock = clock
        self.stats = Stats()
        names = sim.fleet.node_names
        self._index = {name: i for i, name in enumerate(names)}
        self._telemetry = [subj.telemetry(n) for n in names]
        self._events_subject = [subj.events(n) for n in names]
        self._executors: dict[int, execution.CommandExecutor] = {}
        self._latest: dict[int, bytes] = {}
        """Each node's newest frame (what validation reads, as the agent's own newest frame)."""
        self._recent: dict[int, list[tuple[float, dict[str, Any]]]] = {}
        """Each node's recent events, with the time they were published (validation's quiet soak)."""
        self._unsent: list[dict[str, Any]] = []
        self._sub: base.Subscription | None = None
        self._last: float | None = None

    async def start(self) -> None:
        """Answer commands from now on."""
        self._sub = await self.bus.subscribe(self.subjects.all_commands, self._on_command)

    async def close(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None

    def executor(self, node: int) -> execution.CommandExecutor:
        ex = self._executors.get(node)
        if ex is None:
            power = NodePower(self.sim.fleet, node)
            ex = execution.CommandExecutor(
                self.sim.fleet.node_names[node], power, None, clock=self.clock,
                gpu_indices=power.gpu_indices, gpu=power, health=lambda since: self._health(node, since),
            )  # fmt: skip
            self._executors[node] = ex
        return ex

    def _health(self, node: int, since: float | None) -> execution.Health:
        gpus: list[telemetry.GpuSample] = []
        expected: int | None = None
        if node in self._latest:
            frame = codec.decode_frame(self._latest[node])
            gpus, expected = list(frame.gpus), frame.gpus_expected
        recent = [
            events.NodeEvent.model_validate(e)
            for ts, e in self._recent.get(node, [])
            if since is not None and ts >= since and e.get("kind") not in ("agent_start", "agent_stop")
        ]
        return execution.Health(gpus, expected, recent)

    async def _on_command(self, msg: base.Msg) -> None:
        node = self._index.get(self.subjects.node_of(msg.subject))
        if node is None or self.sim.fleet.silent[node]:
            self.stats.commands_ignored += 1  # not ours, or the agent is dead: no answer, as in life
            return
        ex = self.executor(node)
        try:
            cmd = codec.decode_command(msg.data)
        except errors.DecodeError as e:
            result = ex.refuse_undecodable(f"{e.reason}: {e.detail}")
        else:
            result = ex.execute(cmd)
        self.stats.commands += 1
        if msg.reply:
            await msg.respond(codec.encode(result))

    async def tick(self, dt: float | None = None) -> None:
        """One interval: step by ``dt`` (default: wall time since the last tick), then publish."""
        t0 = time.perf_counter()
        now = self.clock()
        if dt is None:
            dt = (
                self.interval_s
                if self._last is None
                else min(max(0.0, now - self._last), 10 * self.interval_s)
            )
        self._last = now
        self.sim.step(dt)
        out = self.sim.frames()
        sent = 0
        try:
            for node, data in out:
                self._latest[node] = data
                await self.bus.publish(self._telemetry[node], data)
                sent += 1
        except errors.TemporaryError as e:
            # frames are telemetry, not events: a lost interval is counted, not buffered
            self.stats.frames_dropped += len(out) - sent
            log.warning("sim.frames_dropped", count=len(out) - sent, error=str(e))
        self.stats.frames += sent
        if self.sim.steps is not None:
            await self._publish_steps(self.sim.steps.reports(dt))
        await self._publish_events(self._unsent + self.sim.take_events())
        truth = self.sim.take_truth()
        if truth and self.truth_sink is not None:
            self.truth_sink(truth)
        self.stats.ticks += 1
        self.stats.step_s += time.perf_counter() - t0

    async def _publish_steps(self, reports: list[dict[str, Any]]) -> None:
        """Each rank's step report on ``steps.<job>`` (core publish, as ``healer.steps`` sends it): like
        frames, a report that cannot go out is lost, never retried."""
        try:
            for r in reports:
                await self.bus.publish(self.subjects.steps(r["job"]), orjson.dumps(r))
                self.stats.step_reports += 1
        except errors.TemporaryError as e:
            log.warning("sim.steps_dropped", error=str(e))

    async def _publish_events(self, evts: list[dict[str, Any]]) -> None:
        self._unsent = []
        now = self.clock()
        for e in evts:
            recent = self._recent.setdefault(self._index[e["node"]], [])
            recent.append((now, e))
            del recent[:-100]
        for i in range(0, len(evts), EVENT_BATCH):
            batch = evts[i : i + EVENT_BATCH]
            results = await asyncio.gather(
                *(
                    self.bus.publish_durable(
                        self._events_subject[self._index[e["node"]]], frames.encode_event(e), e["id"]
                    )
                    for e in batch
                ),
                return_exceptions=True,
            )
            for e, res in zip(batch, results, strict=True):
                if isinstance(res, BaseException):
                    if not isinstance(res, errors.HealerError):
                        raise res
                    self._unsent.append(e)
                else:
                    self.stats.events += 1
        if len(self._unsent) > MAX_UNSENT_EVENTS:
            self.stats.events_dropped += len(self._unsent) - MAX_UNSENT_EVENTS
            self._unsent = self._unsent[-MAX_UNSENT_EVENTS:]
        if self._unsent:
            self.stats.events_retried += len(self._unsent)
            log.warning("sim.events_deferred", count=len(self._unsent))

    async def run(self, duration_s: float | None = None, stop: asyncio.Event | None = None) -> Stats:
        """Tick every interval until ``duration_s`` has passed or ``stop`` is set; then every live
        agent says ``agent_stop``, as a real agent does on a clean shutdown."""
        stop = stop or asyncio.Event()
        loop = asyncio.get_running_loop()
        start = loop.time()
        deadline = start
        await self._publish_events(self.sim.take_events())
        while not stop.is_set():
            # the simulated second is stepped once it has passed on the wall clock, so no frame, event
            # or fault's truth record is stamped ahead of the time it is published (an event acted on at
            # arrival would otherwise show as acted on before its fault started)
            deadline += self.interval_s
            delay = deadline - loop.time()
            if delay < 0:
                self.stats.overruns += 1
                deadline = loop.time()
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=delay)
            if stop.is_set() or (duration_s is not None and loop.time() - start > duration_s):
                break
            await self.tick()
        fl = self.sim.fleet
        for node in self.sim.reporting().tolist():
            fl.emit_event(node, "agent_stop", message="simulated agent stopped")
        await self._publish_events(self._unsent + self.sim.take_events())
        await self.bus.flush()
        log.info("sim.stopped", **dataclasses.asdict(self.stats))
        return self.stats
