"""Ingest: frames and events in, cheap, never blocking on anything slow.

Frames (core subscription on ``healer.telemetry.*``, optionally on a second connection) wait in a
backlog fair by node (healer/bus/fair.py: a node sending faster than it is ingested loses its own
oldest frames, never another's; what is certainly not a frame is counted and dropped as it is read,
before it queues), then are decoded at the edge and queued in the rule engine (and the anomaly
model); a bad one is counted and logged at most once per 10 s, drops with the metric's total
(``drops.DropLog``). Events come from a durable JetStream consumer, pulled only while this process leads;
each is checked against admission (the subject's node, the body's node, the admitted fleet) and kept
unacknowledged until the tick that evaluated it has recorded its decisions in KV (``take_acks``,
``ack``); if that step fails first, the event goes back to the stream to be evaluated again (``retry``).
An event that matches an event rule sets ``arrived``: the ticker evaluates it and acts on it
at once, between ticks (healer/controller/core/tick.py). At step-down what was pulled and not acknowledged
goes back to the stream at once (``hand_back``).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import zlib
from typing import Any

from healer import errors
from healer.bus import base as bus_base
from healer.bus import subjects
from healer.controller.core import context, frame_order, learning
from healer.controller.inventory import admission
from healer.controller.observability import drops, throttle
from healer.controller.power import energy_meter
from healer.rules import engine
from healer.schemas import codec, events, telemetry

EVENTS_BATCH = 256
"""Events asked for per pull; a pull that brings fewer has drained the stream for now."""
EVENTS_PULL_S = 0.5
"""Longest one pull for events waits on the server (short: a pull never outlives a reconnect by much)."""
EVENTS_ACK_WAIT_S = 60.0
"""The events consumer's ack wait: an event delivered and not acknowledged is redelivered after it."""
EVENTS_RETRY_S = 1.0
"""An event whose step failed before its decisions were recorded is delivered again after this long."""
FETCH_LOG_S = 10.0
"""At most one ``controller.events_fetch_failed`` line per this many seconds (all are counted)."""
NODE_CACHE_MAX = 1 << 17
"""Most telemetry subjects whose node ``Ingest.node_of`` remembers (the cache is emptied past it)."""
ENERGY_TOPOLOGY_S = 30.0
"""How often the energy meter re-reads which domains each node counts into."""
FRESH = frame_order.FRESH
"""A fresh frame's verdict, bound once (a member read off its enum class costs ~0.35 us on Python 3.11)."""
FRAMES_BATCH = 64
"""Most frames taken from the fair backlog per call (``on_frames``); the event loop runs between."""


def shard_of(node: str, shards: int) -> int:
    return zlib.crc32(node.encode()) % shards if shards > 1 else 0


class Ingest:
    """The shard's fleet as it reports: frames into the engine, events pulled and held for the tick."""

    def __init__(
        self,
        ctx: context.Context,
        bus: bus_base.Bus,
        subjects: subjects.Subjects,
        *,
        engine: engine.Engine,
        learning: learning.Learning,
        admission: admission.Admission,
    ) -> None:
        self.cs = ctx.cs
        self.bus = bus
        self.subjects = subjects
        self.engine = engine
        self.learning = learning
        self.admission = admission
        self.role = ctx.role
        self.metrics = ctx.metrics
        self.clock = ctx.clock
        self.stop = ctx.stop
        self.log = ctx.log
        self.nodes: set[str] = set()
        self._node_of: dict[str, str] = {}
        """Subject → node, for the subjects seen (unescaping a subject costs more than the lookup); with
        several shards, "" for another shard's node (a CRC32 per frame costs more than the lookup too)."""
        self.newest: dict[str, telemetry.FrameView] = {}
        """Per node: its newest frame, kept only with ``power_budgets`` set (``power_shell`` reads it)."""
        self.energy = (
            energy_meter.EnergyMeter(ctx.metrics, ctx.cs.energy_keys) if ctx.cs.energy_accounting else None
        )
        """Energy per domain and job (``controller.energy_accounting``), from every frame ingested."""
        self._topology_at = -math.inf
        self.unacked: list[Any] = []
        self.arrived = asyncio.Event()
        """Set when a pulled event matched an event rule: the ticker evaluates it at once, between ticks
        (``tick.Ticker.arrivals``), instead of at the next tick."""
        self._received_at = -math.inf
        self._bad_frames = throttle.Throttled(ctx.log, "controller.bad_frame")
        """Bad frames are counted each (``_decode_errors_total``) and logged at most once per 10 s."""
        self._bad_events = throttle.Throttled(ctx.log, "controller.bad_event")
        self.order = frame_order.FrameOrder()
        for verdict in frame_order.STALE:  # every reason at 0 from the start
            ctx.metrics.frames_stale.labels(verdict.value)
        """Each node's (boot_id, seq): a repeated or late frame is dropped before it reaches a counter."""
        self._stale = throttle.Throttled(ctx.log, "controller.frame_stale")
        self._vetted_out = [0, 0]
        """Refused at the door since the last tick: [naming another node, not a frame at all]."""
        self._vetted_subject = ""
        self.telemetry_bus: bus_base.Bus = bus
        self.frames_sub: bus_base.Subscription
        self.steps_sub: bus_base.Subscription | None = None
        self._subscribed = False
        self._frames_dropped = 0
        self._drops = drops.DropLog(ctx.log)
        self._disconnects = {"main": 0, "telemetry": 0}
        self.events = bus.pull_consumer(
            subjects.stream_events, subjects.all_events,
            durable=f"healer-controller-s{ctx.cs.shard}",
            ack_wait_s=EVENTS_ACK_WAIT_S, max_ack_pending=20000,
        )  # fmt: skip

    async def subscribe(self) -> None:
        """Subscribe to the fleet's frames (on a connection of their own when ``telemetry_connection``)."""
        self.telemetry_bus = await self.bus.sibling("telemetry") if self.cs.telemetry_connection else self.bus
        self.frames_sub = await self.telemetry_bus.subscribe_batches(
            self.subjects.all_telemetry,
            self.on_frames,
            fair=bus_base.Fairness(
                self.screen_frame,
                self.cs.frames_per_node,
                int(self.cs.frames_buffer_mib * 2**20),
                vet=self.vet_frame,
            ),
            max_batch=FRAMES_BATCH,
        )
        if self.learning.failslow is not None:
            self.steps_sub = await self.bus.subscribe(self.subjects.all_steps, self.on_step)
        # A round trip on each connection: the server has the subscriptions before ``start`` returns (a
        # frame published by another connection at once was otherwise lost while the SUB sat in nats-py's
        # write buffer). A server away now is not a reason to fail the start: nats-py resubscribes.
        for bus in {id(b): b for b in (self.telemetry_bus, self.bus)}.values():
            with contextlib.suppress(errors.TemporaryError):
                await bus.flush()
        self._subscribed = True

    async def on_step(self, msg: bus_base.Msg) -> None:
        """A training job's step time (``healer.steps``); a bad one is counted and logged, like a frame."""
        if self.learning.failslow is None:
            return
        try:
            report = codec.decode_step(msg.data)
        except errors.DecodeError as e:
            self.count_bad(e)
            self._bad_frames.note(e.reason, subject=msg.subject, detail=e.detail)
            return
        self.learning.failslow.steps.observe(report)

    async def close(self) -> None:
        if self._subscribed:  # stopped after a start that got this far
            self._subscribed = False
            with contextlib.suppress(errors.HealerError):  # the connection may be gone already
                await self.frames_sub.unsubscribe()
                if self.steps_sub is not None:
                    await self.steps_sub.unsubscribe()
        await self.events.close()
        if self.telemetry_bus is not self.bus:
            await self.telemetry_bus.close()

    def mine(self, node: str) -> bool:
        return shard_of(node, self.cs.shards) == self.cs.shard

    # -- frames --------------------------------------------------------------------------------------
    def node_of(self, subject: str) -> str:
        """The node of a telemetry subject (the identity the server's permissions vouch for), from a
        cache of the subjects seen, emptied when it reaches ``NODE_CACHE_MAX`` (a flood of new names);
        "" for another shard's node."""
        node = self._node_of.get(subject)
        if node is None:
            if len(self._node_of) >= NODE_CACHE_MAX:
                self._node_of.clear()
            node = self.subjects.node_of(subject)
            node = self._node_of[subject] = node if self.mine(node) else ""
        return node

    def screen_frame(self, subject: str, data: bytes) -> str | None:
        """As a message is read off the connection: its node (the fair backlog's source), or None to
        drop it before it queues (another shard's node; certainly not a frame: counted and logged)."""
        node = self.node_of(subject)
        if not node:
            return None
        bad = codec.precheck_frame(data)
        if bad is not None:
            self.count_bad(bad)
            self._bad_frames.note(bad.reason, subject=subject, detail=bad.detail)
            return None
        return node

    def vet_frame(self, subject: str, data: bytes) -> bool:
        """Asked by the fair backlog only when the node already has ``frames_per_node`` waiting (a flood
        on its own subject): the message may push the oldest out only if the strict decoder reads it
        as a frame naming the subject's node. What is refused is only tallied here, as cheaply as a
        shed (a flood sends hundreds of thousands a second), and counted and logged at the next tick
        (``account``)."""
        named = codec.strict_node(data)
        if named is not None and named == self.node_of(subject):
            return True
        self._vetted_out[named is None] += 1
        self._vetted_subject = subject
        return False

    async def on_frames(self, msgs: list[bus_base.Msg]) -> None:
        """Frames from the fair backlog, which ``screen_frame`` let in, in the order it gives them."""
        ingested = 0
        for msg in msgs:
            try:
                ingested += self.on_frame(msg)
            except Exception:  # a bug costs one frame, never the rest of the batch
                self.log.exception("controller.frame_failed", subject=msg.subject)
        if ingested:
            self.metrics.frames.inc(ingested)

    def on_frame(self, msg: bus_base.Msg) -> bool:
        """One frame: decoded straight into the engine's staging plane, admitted, ingested; False when
        it was not (bad: counted and logged; not admitted: counted by admission; another shard's)."""
        node = self.node_of(msg.subject)
        if not node:  # (screened out before it queues wherever the bus screens)
            return False
        try:
            frame = self.engine.decode(msg.data)
        except errors.DecodeError as e:
            self.count_bad(e)
            self._bad_frames.note(e.reason, subject=msg.subject, detail=e.detail)
            return False
        # Receive time, strictly increasing: frames are ordered by it, never by the node's own ts.
        now = self._received_at = max(self.clock(), math.nextafter(self._received_at, math.inf))
        if not self.admission.frame_ok(node, frame):
            return False
        verdict = self.order.verdict(node, frame.boot_id, frame.seq)
        if verdict is not FRESH:
            self.metrics.frames_stale.labels(verdict.value).inc()
            self._stale.note(verdict.value, node=node, boot_id=frame.boot_id, seq=frame.seq)
            return False
        self.engine.ingest(frame, at=now)
        if self.learning.scorer is not None:
            self.learning.scorer.observe(frame, at=now)
        if self.learning.failslow is not None:
            self.learning.failslow.observe(frame)
        self.nodes.add(node)
        if self.cs.power_budgets:
            self.newest[node] = frame
        if self.energy is not None:
            fs = self.learning.failslow
            self.energy.observe(frame, fs.jobs.job_of if fs is not None else None, now)
        if frame.lax:
            self.metrics.frames_lax.inc()
        if self.admission.check_skew("frame", frame.ts, now):
            self.metrics.lag.observe(max(0.0, now - frame.ts))
        return True

    def _account_vetted(self) -> None:
        """What ``vet_frame`` refused since the last tick, into the metrics and the throttled log."""
        other, bad = self._vetted_out
        if not other and not bad:
            return
        self._vetted_out = [0, 0]
        subject = self._vetted_subject
        if bad:
            self.metrics.decode_errors.labels("frame", "validation").inc(bad)
            self._bad_frames.note(
                "validation", count=bad, subject=subject, detail="not a frame (strict decoder, node flooded)"
            )
        if other:
            self.admission.reject("frame", "identity_mismatch", self.node_of(subject), count=other)

    def count_bad(self, e: errors.DecodeError) -> None:
        self.metrics.decode_errors.labels(e.kind, e.reason).inc()
        for field in e.fields:
            self.metrics.invalid_fields.labels(e.kind, field).inc()

    def latest_power_limit(self, node: str, gpu_index: int) -> tuple[float, float] | None:
        """(frame ts, power limit in W) of the GPU in the node's newest frame; None while unknown."""
        return self.engine.latest_power_limit(node, gpu_index)

    def forget_silent(self, now: float) -> list[engine.Firing]:
        """Reclaim the state of nodes silent longer than ``node_retention_s``; their firings resolve."""
        forgotten = self.engine.forget_silent(now, self.cs.node_retention_s)
        for node in forgotten.nodes:
            self.nodes.discard(node)
            self.newest.pop(node, None)
            self.order.forget(node)
            if self.energy is not None:
                self.energy.forget_node(node)
            if self.learning.failslow is not None:
                self.learning.failslow.forget_node(node)
            self.metrics.nodes_forgotten.inc()
            self.log.info("controller.node_forgotten", node=node, retention_s=self.cs.node_retention_s)
        return forgotten.resolved

    def account(self) -> None:
        """Once per tick: the frames buffer, frames dropped, refused at the door and reconnects since the
        last tick."""
        self.metrics.frames_pending.set(self.frames_sub.pending)
        if self.energy is not None:
            now = self.clock()
            if now - self._topology_at >= ENERGY_TOPOLOGY_S:  # a new node's domains, an inventory change
                self._topology_at = now
                self.energy.set_topology(self.admission.topology().domains)
            self.energy.fold(now)
        self.metrics.frames_dropped.inc(self.frames_sub.dropped - self._frames_dropped)
        self._frames_dropped = self.frames_sub.dropped
        self._account_vetted()
        self._drops.report(dropped=self._frames_dropped, bad=self._bad_frames.total)
        self._bad_frames.flush()
        self._stale.flush()
        for name, bus in (("main", self.bus), ("telemetry", self.telemetry_bus)):
            if bus is self.bus and name == "telemetry":
                continue
            self.metrics.nats_disconnects.labels(name).inc(bus.disconnects - self._disconnects[name])
            self._disconnects[name] = bus.disconnects

    # -- events --------------------------------------------------------------------------------------
    async def _admit_event(self, m: Any, event: events.NodeEvent) -> bool:
        """An event is used only if its subject's node is this shard's, is the node its body names, and
        is admitted. Others are acknowledged and dropped, except those of a name the scheduler has not
        been asked about yet: JetStream delivers them again once it has been (never lose an XID)."""
        node = self.subjects.node_of(m.subject)
        ok = self.mine(node) and self.admission.event_ok(node, event, self.clock())
        if ok:
            return True
        with contextlib.suppress(errors.HealerError):
            if self.admission.waiting(node) and event.node == node:
                await m.nak(delay=self.cs.admission_refresh_s + self.cs.reload_check_s)
            else:
                await m.ack()
        return False

    async def pull_events(self) -> None:
        """Pull events while leader, through the bus's ``PullConsumer`` (its subscription outlives
        reconnects, so a pull answered across one lands where the next fetch finds it; it is made again
        after a failed pull). Nothing is pulled while not leader or disconnected; failures are counted
        and logged at most every ``FETCH_LOG_S``."""
        logged_at = -math.inf
        while not self.stop.is_set():
            if not self.role.took_over or not self.bus.connected:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), timeout=0.1)
                continue
            try:
                msgs = await self.events.fetch(EVENTS_BATCH, timeout=EVENTS_PULL_S)
            except errors.TemporaryError as e:
                self.metrics.events_fetch_failures.inc()
                if time.monotonic() - logged_at >= FETCH_LOG_S:
                    logged_at = time.monotonic()
                    self.log.warning("controller.events_fetch_failed", error=str(e))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), timeout=EVENTS_PULL_S)
                continue
            for m in msgs:
                try:
                    event = codec.decode_event(m.data)
                except errors.DecodeError as e:
                    self.count_bad(e)
                    self._bad_events.note(e.reason, subject=m.subject, detail=e.detail)
                    with contextlib.suppress(errors.HealerError):
                        await m.ack()
                    continue
                if not await self._admit_event(m, event):
                    continue
                self.engine.ingest_event(event)
                self.metrics.events.inc()
                self.unacked.append(m)
            if len(msgs) < EVENTS_BATCH:  # the backlog is read: event rules may judge quiet periods
                self.engine.events_read = True
            if self.engine.events_waiting:
                self.arrived.set()
            self.metrics.events_pending.set(len(self.unacked))

    def take_acks(self) -> list[Any]:
        """The events pulled so far, for the tick that evaluates them (``ack`` or ``keep`` them after)."""
        acks, self.unacked = self.unacked, []
        return acks

    def keep(self, acks: list[Any]) -> None:
        """Not recorded (a standby's tick, a failed tick): acknowledged by a later tick, or handed back
        to the next leader at step-down, never left unacknowledged until the ack wait runs out."""
        self.unacked = acks + self.unacked

    async def ack(self, acks: list[Any]) -> None:
        """The tick that evaluated these recorded its decisions in KV."""
        for m in acks:
            with contextlib.suppress(errors.HealerError):
                await m.ack()
        self.metrics.events_pending.set(len(self.unacked))

    async def retry(self, acks: list[Any]) -> None:
        """Evaluated, but the step failed before it recorded their decisions (KV timed out opening an
        incident): back to the stream, delivered again after ``EVENTS_RETRY_S`` and evaluated afresh.
        Kept instead, a later step would acknowledge them, and an XID rule fires once per delivery."""
        for m in acks:
            with contextlib.suppress(errors.HealerError):
                await m.nak(delay=EVENTS_RETRY_S)
        self.metrics.events_retried.inc(len(acks))
        self.metrics.events_pending.set(len(self.unacked))

    async def hand_back(self) -> None:
        """Not the leader: what this process pulled and did not acknowledge goes back to the stream at
        once (nak) for the next leader, instead of after the ack wait."""
        for m in self.take_acks():
            with contextlib.suppress(errors.HealerError):
                await m.nak()
        self.metrics.events_pending.set(0)
