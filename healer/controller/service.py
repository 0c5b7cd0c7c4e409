"""Controller: ingest → rule engine → incidents → safety policy → actuators, once per tick.

Ingest is cheap and never blocks on anything slow: frames (core subscription on
``healer.telemetry.*``) are decoded at the edge and queued in the engine; events come from a durable
JetStream consumer and are acknowledged only after the tick that evaluated them has recorded its
decisions in KV. Every tick evaluates all rules over the shard's fleet at once; transitions become
incident changes, published on the feed; actions run in per-incident tasks so a slow drain never
delays detection elsewhere.

Only the lease holder acts and publishes. A standby ingests the same telemetry (warm state) and, when it
wins the lease, reloads the incidents from KV and picks up where the old leader stopped: actions
recorded as done are never repeated, and every action carries the new lease's fencing token.

Every long-lived task (lease keeper, leadership, event puller, tick, housekeeping) runs under a
``Supervisor``: a failure is logged, counted and the task restarted with back-off, so losing one NATS
server of three (503s, leader elections, reconnects) is weathered, never a silently dead controller.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import math
import os
import pathlib
import socket
import time
import uuid
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import structlog

from healer import config, errors, health
from healer.actuators import base as actuators
from healer.bus import base as bus_base
from healer.bus import subjects as subjects_mod
from healer.controller import admission as admission_mod
from healer.controller import book, decide, healing, kv, lease, policy, runner, supervisor, throttle
from healer.controller import feed as feed_mod
from healer.controller import metrics as metrics_mod
from healer.rules import engine as engine_mod
from healer.rules import loader
from healer.schemas import codec, events, incidents, telemetry

if TYPE_CHECKING:  # scikit-learn takes seconds to import: only a controller with --model pays for it
    from healer.anomaly import scoring

log = structlog.get_logger(__name__)

TAKEOVER_ATTEMPTS = 3
"""A takeover that fails this many times in a row releases the lease (for one TTL) to a standby."""
EVENTS_PULL_S = 0.5
"""Longest one pull for events waits on the server (short: a pull never outlives a reconnect by much)."""
EVENTS_ACK_WAIT_S = 60.0
"""The events consumer's ack wait: an event delivered and not acknowledged is redelivered after it."""
RULE_MISSING = "no loaded rule has this id: the incident stays open until a person resolves it"
REPEAT_COUNT_S = 1.0
"""Longest the repeat-fault count may hold up opening an incident (a KV read and write take ms; during a
stream leader election a read waits out the client's timeout instead)."""
FETCH_LOG_S = 10.0
"""At most one ``controller.events_fetch_failed`` line per this many seconds (all are counted)."""


def shard_of(node: str, shards: int) -> int:
    return zlib.crc32(node.encode()) % shards if shards > 1 else 0


STANDING_TASKS = frozenset(
    {"controller-lease", "controller-ticks", "controller-housekeeping", "controller-feed"}
)
"""Background tasks that run for the controller's whole life (readiness checks they still do)."""
TICK_STALE_MIN_S = 10.0
"""/readyz: a controller whose tick has not finished for this long (or 5 ticks, if longer) is stuck."""


async def build(
    settings: config.Settings,
    bus: bus_base.Bus,
    *,
    scheduler: actuators.Actuator,
    power: actuators.Actuator | Callable[[Controller], actuators.Actuator] | None = None,
    gpu: actuators.Actuator | None = None,
    metrics: metrics_mod.ControllerMetrics | None = None,
    holder: str | None = None,
    clock: Callable[[], float] = time.time,
) -> Controller:
    """A fully wired controller on ``bus`` (its KV buckets bound, rules loaded, the model loaded when
    set); ``await ctl.start()`` runs it. PermanentError when the rules do not load, NotFound when the
    buckets were never provisioned."""
    subj = subjects_mod.Subjects(settings.nats.prefix)
    state = kv.Store(await bus.key_value(subj.kv_state))
    leases = kv.Store(await bus.key_value(subj.kv_leases))
    return Controller(
        settings, bus, state=state, leases=leases, scheduler=scheduler, power=power, gpu=gpu,
        metrics=metrics, holder=holder, clock=clock,
    )  # fmt: skip


class Controller:
    def __init__(
        self,
        settings: config.Settings,
        bus: bus_base.Bus,
        *,
        state: kv.Store,
        leases: kv.Store,
        scheduler: actuators.Actuator,
        power: actuators.Actuator | Callable[[Controller], actuators.Actuator] | None = None,
        gpu: actuators.Actuator | None = None,
        metrics: metrics_mod.ControllerMetrics | None = None,
        holder: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Everything wired, nothing optional afterwards; ``build`` binds the KV buckets and calls this.
        ``power`` may be a function of the controller (the power actuator reads its power limits)."""
        self.settings = settings
        self.cs = settings.controller
        self.bus = bus
        self.subjects = subjects_mod.Subjects(settings.nats.prefix)
        self.scheduler = scheduler
        if power is not None and not hasattr(power, "apply"):  # a function of this controller
            power = power(self)
        self.power = cast(actuators.Actuator | None, power)
        self.gpu = gpu
        """GPU reset and validation through the node agent (recovery ladders); None: resets fail."""
        self.metrics = metrics or metrics_mod.ControllerMetrics()
        self.holder = holder or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.clock = clock
        self.log = log.bind(shard=self.cs.shard, holder=self.holder)
        self.admission = admission_mod.Admission(
            self.cs, self.metrics, scheduler=scheduler, log=self.log, clock=clock
        )
        self._received_at = -math.inf
        self.rules_path = pathlib.Path(self.cs.rules_dir)
        self._rules_sig = self._signature()
        result = loader.load_paths([self.rules_path])
        if result.ruleset is None:
            raise errors.PermanentError(
                "rules do not load; fix them first:\n" + "\n".join(str(d) for d in result.errors)
            )
        self.engine = engine_mod.Engine(
            result.ruleset, gpus_per_node=self.cs.gpus_per_node, stale_after_s=self.cs.stale_after_s
        )
        """Built with the rules at construction: a controller whose rules do not load is never made."""
        self.nodes: set[str] = set()
        self.power_limits: dict[str, tuple[float, dict[int, float | None]]] = {}
        """Per node: (frame ts, GPU index → power limit W) from its newest frame (power actuator reads)."""
        self.unacked: list[Any] = []
        self._stop = asyncio.Event()
        self.supervisor = supervisor.Supervisor(
            self._stop, self.metrics.task_failures, self.log,
            initial_delay_s=settings.retry.initial_delay_s, max_delay_s=settings.retry.max_delay_s,
        )  # fmt: skip
        self._leader = False
        self._lease_changed = asyncio.Event()
        self._bad_frames = throttle.Throttled(self.log, "controller.bad_frame")
        """Bad frames are counted each (``_decode_errors_total``) and logged at most once per 10 s."""
        self._bad_events = throttle.Throttled(self.log, "controller.bad_event")
        self._turn = asyncio.Lock()
        """Held by a tick, a takeover and a rules reload: a takeover never reloads the incidents under a
        tick that started before a lost lease was won again (that tick's objects would act twice)."""
        self._takeover_failures = 0
        self._frames_sub: bus_base.Subscription
        self.telemetry_bus: bus_base.Bus = bus
        self._frames_dropped = 0
        self._labels_at = -math.inf
        self._scored_at = 0.0
        self._anomaly_saved_at = time.monotonic()
        self.scorer: scoring.Scorer | scoring.NullScorer | None = None
        if self.cs.model:
            from healer.anomaly import scoring

            self.scorer = scoring.load_or_null(self.cs.model, gpus_per_node=self.cs.gpus_per_node)
            loaded = isinstance(self.scorer, scoring.Scorer)
            self.metrics.anomaly_model_loaded.set(1 if loaded else 0)
            if not loaded:
                self.log.error("controller.anomaly_disabled", model=self.cs.model, anomaly_score=0)
        self.state = state
        self.book = book.Book(state)
        self.feed = feed_mod.FeedPublisher(self.bus, self.subjects, self.cs.cluster)
        self.breaker = policy.Breaker(state, self.cs)
        self.dry_breaker = policy.Breaker(kv.Prefixed(state, "dry-run."), self.cs)
        self.exclusions = policy.Exclusions(state)
        self.limits = policy.Limits(
            self.cs, state if self.cs.mode == "enforce" else kv.Prefixed(state, f"{self.cs.mode}.")
        )
        self.lease = lease.Lease(
            leases, f"leader.shard-{self.cs.shard}", self.holder, settings.nats.lease_ttl_s
        )
        self.actions = runner.ActionRunner(
            self.cs, scheduler=self.scheduler, power=self.power, lease=self.lease, breaker=self.breaker,
            dry_breaker=self.dry_breaker, exclusions=self.exclusions, limits=self.limits, book=self.book,
            metrics=self.metrics, publish=self._save_publish, leader=lambda: self.leader,
            fleet_size=self._fleet_size, clock=self.clock, stop=self._stop, log=self.log,
            gpu=self.gpu, reboots=lambda node: self.recovery.reboots(node),
        )  # fmt: skip
        self.recovery = healing.Recovery(
            self.cs, state, self.book, scheduler=self.scheduler,
            ladder_for=lambda rule_id: self.engine.rules.ladder_for(rule_id),
            release=self.engine.release, summary=self.engine.summary, publish=self._save_publish,
            spawn=self.actions.spawn,
            clock=self.clock, log=self.log,
        )  # fmt: skip
        self._events = self.bus.pull_consumer(
            self.subjects.stream_events, self.subjects.all_events,
            durable=f"healer-controller-s{self.cs.shard}",
            ack_wait_s=EVENTS_ACK_WAIT_S, max_ack_pending=20000,
        )  # fmt: skip
        self._disconnects = {"main": 0, "telemetry": 0}

    # -- lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        """Subscribe and run: the lease, leadership, events, ticks, housekeeping and the feed."""
        rules = self.engine.rules.rules
        self.metrics.rules_loaded.set(len(rules))
        await self._restore_anomaly_state()
        self.telemetry_bus = await self.bus.sibling("telemetry") if self.cs.telemetry_connection else self.bus
        self._frames_sub = await self.telemetry_bus.subscribe(
            self.subjects.all_telemetry,
            self._on_frame,
            pending_bytes=int(self.cs.frames_buffer_mib * 2**20),
        )
        self.supervisor.start("lease", lambda: self.lease.keep(self._stop, self._on_leadership))
        self.supervisor.start("leadership", self._leadership)
        self.supervisor.start("events", self._pull_events)
        self.supervisor.start("ticks", self._tick_loop)
        self.supervisor.start("housekeeping", self._housekeeping)
        self.supervisor.start("feed", lambda: self.feed.run(self._stop))
        self.log.info("controller.started", rules=len(rules), mode=self.cs.mode)

    async def stop(self) -> None:
        was_leader = self.leader
        self._stop.set()
        running = list(self.tasks.values())
        if running:  # actions in flight get 5 s together to finish their current call, not 5 s each
            await asyncio.wait(running, timeout=5.0)
        await self.supervisor.wait()
        for t in self.tasks.values():
            t.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        if was_leader and self.scorer is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._save_anomaly_state(), timeout=10.0)
        if self.feed.outbox:  # the last changes, once (a failed publish is retried by the next leader's)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.feed.flush(), timeout=6.0)
        await self._events.close()
        if self.telemetry_bus is not self.bus:
            await self.telemetry_bus.close()
        self.metrics.leader.set(0)
        self.log.info("controller.stopped")

    @property
    def _bg(self) -> list[asyncio.Task[None]]:
        """The supervised long-lived tasks."""
        return self.supervisor.tasks

    @property
    def tasks(self) -> dict[str, asyncio.Task[None]]:
        """The running per-incident action tasks."""
        return self.actions.tasks

    @property
    def leader(self) -> bool:
        """Acting as leader: took over, and holds a lease renewed within half its TTL."""
        return self._leader and self.lease.valid()

    def _show_leader(self) -> None:
        """``healer_controller_leader`` follows ``leader`` (set on every flip and every tick)."""
        self.metrics.leader.set(1 if self.leader else 0)

    def _on_leadership(self, held: bool) -> None:
        self.log.warning("controller.leadership", leader=held, token=self.lease.token)
        if not held:
            self._leader = False
        self._show_leader()
        self._lease_changed.set()

    async def _leadership(self) -> None:
        """Take over when the lease is won, step down when it is lost. A takeover that fails raises: the
        supervisor logs it and runs this again after a back-off (a retry); after
        ``TAKEOVER_ATTEMPTS`` failures in a row the lease is released for a TTL so a standby can try."""
        while not self._stop.is_set():
            self._lease_changed.clear()
            if self.lease.held and not self._leader:
                async with self._turn:
                    await self._become_leader()
            elif not self.lease.held and self._leader:
                self._leader = False
            if not self.lease.held:
                await self._step_down()
            self._show_leader()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._lease_changed.wait(), timeout=0.5)

    async def _step_down(self) -> None:
        """Not the leader: what this process pulled and did not acknowledge goes back to the stream at
        once (nak) for the next leader, instead of after the ack wait."""
        acks, self.unacked = self.unacked, []
        for m in acks:
            with contextlib.suppress(errors.HealerError):
                await m.nak()
        self.metrics.events_pending.set(0)

    async def _become_leader(self) -> None:
        token = self.lease.token
        try:
            await self.book.load()
            await self.recovery.load()
            self._restore_firings()
            await self.exclusions.refresh()
        except Exception as e:
            self._takeover_failures += 1
            self.metrics.takeover_failures.inc()
            if self._takeover_failures >= TAKEOVER_ATTEMPTS:
                self._takeover_failures = 0
                self.log.error(
                    "controller.takeover_abandoned", token=token, error=repr(e),
                    detail="lease released for one TTL so a standby can take over",
                )  # fmt: skip
                await self.lease.release(hold_off_s=self.lease.ttl_s)
                self._lease_changed.set()
            raise
        if self.lease.token != token:  # lost (or lost and won again) meanwhile: start over
            return
        self._takeover_failures = 0
        self._leader = True
        self._show_leader()
        self.log.info("controller.took_over", token=token, incidents=len(self.book.open))
        for inc in self.book.all():
            if any(a.status is None for a in inc.actions):
                self.actions.spawn(inc)

    def _restore_firings(self) -> None:
        """Hand the engine what the incidents from KV say was firing, so each resolves by its rule's
        own terms (an event rule after its quiet period, a condition rule when its resolve condition
        holds on fresh data) instead of staying open for ever after a restart or a failover."""
        for inc in self.book.open.values():
            if inc.node == "fleet" or inc.rule_id == healing.REPLACEMENT_RULE:
                continue  # the breaker's incident, a replacement: a person closes them
            # A signal resolved already (or that never resolves) leaves the engine nothing to follow.
            for signal in (s for s in inc.signals if s.open):
                restored = self.engine.restore(
                    signal.rule_id, inc.node, signal.gpu_index, since=signal.since,
                    last=max(signal.last_seen_firing, inc.updated_at),
                    evidence=signal.evidence, gpu_uuid=signal.gpu_uuid,
                )  # fmt: skip
                if not restored:
                    self.log.warning(
                        "controller.incident_rule_missing", incident_id=inc.id, rule_id=signal.rule_id,
                        detail=RULE_MISSING,
                    )  # fmt: skip

    # -- ingest ------------------------------------------------------------------------------------
    def _mine(self, node: str) -> bool:
        return shard_of(node, self.cs.shards) == self.cs.shard

    async def _on_frame(self, msg: bus_base.Msg) -> None:
        node = self.subjects.node_of(msg.subject)  # the identity the server's permissions vouch for
        if self.cs.shards > 1 and not self._mine(node):
            return
        try:
            frame = codec.decode_frame_view(msg.data)
        except errors.DecodeError as e:
            self._count_bad(e)
            self._bad_frames.note(e.reason, subject=msg.subject, detail=e.detail)
            return
        # Receive time, strictly increasing: frames are ordered by it, never by the node's own ts.
        now = self._received_at = max(self.clock(), math.nextafter(self._received_at, math.inf))
        if not self.admission.frame_ok(node, frame):
            return
        self.engine.ingest(frame, at=now)
        if self.scorer is not None:
            self.scorer.observe(frame, at=now)
        self.nodes.add(node)
        self.power_limits[node] = (frame.ts, {g.index: g.power_limit_w for g in frame.gpus})
        if isinstance(frame, telemetry.NodeFrame):
            self.metrics.frames_lax.inc()
        self.metrics.frames.inc()
        if self.admission.check_skew("frame", frame.ts, now):
            self.metrics.lag.observe(max(0.0, now - frame.ts))

    def _count_bad(self, e: errors.DecodeError) -> None:
        self.metrics.decode_errors.labels(e.kind, e.reason).inc()
        for field in e.fields:
            self.metrics.invalid_fields.labels(e.kind, field).inc()

    async def _admit_event(self, m: Any, event: events.NodeEvent) -> bool:
        """An event is used only if its subject's node is this shard's, is the node its body names, and
        is admitted. Others are acknowledged and dropped, except those of a name the scheduler has not
        been asked about yet: JetStream delivers them again once it has been (never lose an XID)."""
        node = self.subjects.node_of(m.subject)
        ok = self._mine(node) and self.admission.event_ok(node, event, self.clock())
        if ok:
            return True
        with contextlib.suppress(errors.HealerError):
            if self.admission.waiting(node) and event.node == node:
                await m.nak(delay=self.cs.admission_refresh_s + self.cs.reload_check_s)
            else:
                await m.ack()
        return False

    def latest_power_limit(self, node: str, gpu_index: int) -> tuple[float, float] | None:
        """(frame ts, power limit in W) of the GPU in the node's newest frame; None while unknown."""
        ts, limits = self.power_limits.get(node, (0.0, {}))
        limit = limits.get(gpu_index)
        return None if limit is None else (ts, limit)

    async def _pull_events(self) -> None:
        """Pull events while leader, through the bus's ``PullConsumer`` (its subscription outlives
        reconnects, so a pull answered across one lands where the next fetch finds it; it is made again
        after a failed pull). Nothing is pulled while not leader or disconnected; failures are counted
        and logged at most every ``FETCH_LOG_S``."""
        logged_at = -math.inf
        while not self._stop.is_set():
            if not self._leader or not self.bus.connected:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), timeout=0.1)
                continue
            try:
                msgs = await self._events.fetch(256, timeout=EVENTS_PULL_S)
            except errors.TemporaryError as e:
                self.metrics.events_fetch_failures.inc()
                if time.monotonic() - logged_at >= FETCH_LOG_S:
                    logged_at = time.monotonic()
                    self.log.warning("controller.events_fetch_failed", error=str(e))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), timeout=EVENTS_PULL_S)
                continue
            for m in msgs:
                try:
                    event = codec.decode_event(m.data)
                except errors.DecodeError as e:
                    self._count_bad(e)
                    self._bad_events.note(e.reason, subject=m.subject, detail=e.detail)
                    with contextlib.suppress(errors.HealerError):
                        await m.ack()
                    continue
                if not await self._admit_event(m, event):
                    continue
                self.engine.ingest_event(event)
                self.metrics.events.inc()
                self.unacked.append(m)
            self.metrics.events_pending.set(len(self.unacked))

    # -- the tick ----------------------------------------------------------------------------------
    async def _tick_loop(self) -> None:
        loop = asyncio.get_running_loop()
        next_t = loop.time()
        while not self._stop.is_set():
            started = time.perf_counter()
            try:
                async with self._turn:
                    await self.tick()
            except errors.HealerError as e:
                self.log.error("controller.tick_failed", error=str(e))
            except Exception:  # a bug in one incident's handling must not stop the controller
                self.log.exception("controller.tick_crashed")
            self.metrics.tick.observe(time.perf_counter() - started)
            self._show_leader()
            next_t += self.cs.tick_s
            now = loop.time()
            if next_t < now:
                next_t = now
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), timeout=next_t - now)

    async def tick(self) -> None:
        now = self.clock()
        acks, self.unacked = self.unacked, []
        if self.scorer is not None and now - self._scored_at >= self.cs.anomaly_interval_s:
            self._scored_at = now
            for node, per_gpu in self.scorer.score(now).items():
                self.engine.set_anomaly_scores(node, per_gpu)
            self.metrics.anomaly_seconds.observe(self.scorer.last_cost_s)
        firings = self.engine.evaluate(now) + self._forget_silent(now)
        self.metrics.lag.fold()
        self.metrics.frames_pending.set(self._frames_sub.pending)
        self.metrics.frames_dropped.inc(self._frames_sub.dropped - self._frames_dropped)
        self._frames_dropped = self._frames_sub.dropped
        for name, bus in (("main", self.bus), ("telemetry", self.telemetry_bus)):
            if bus is self.bus and name == "telemetry":
                continue
            self.metrics.nats_disconnects.labels(name).inc(bus.disconnects - self._disconnects[name])
            self._disconnects[name] = bus.disconnects
        self.metrics.evaluations.inc(len(self.engine.rules.rules))
        self.metrics.fleet_nodes.set(len(self.nodes))
        if not self.leader:
            self.unacked = acks + self.unacked  # not ours to acknowledge yet
            return
        try:
            for f in firings:
                await self._handle(f, now)
            await self._retry_and_escalate(now)
            await self.recovery.advance(now)
            self.feed.kick()
        except BaseException:
            # Not recorded: these events are acknowledged by a later tick, or handed back (nak) to the
            # next leader at step-down, never left unacknowledged until the ack wait runs out.
            self.unacked = acks + self.unacked
            raise
        for m in acks:
            with contextlib.suppress(errors.HealerError):
                await m.ack()
        self.metrics.events_pending.set(len(self.unacked))
        for sev, n in self.book.by_severity().items():
            self.metrics.incidents_open.labels(sev).set(n)

    async def _handle(self, f: engine_mod.Firing, now: float) -> None:
        """Carry out what ``decide.on_firing`` says a firing does to its incident."""
        inc = self.book.get(f.key)
        change = decide.on_firing(f, inc, self.engine.rules.by_id)
        if change.change is decide.Change.NONE:
            return
        if change.change is decide.Change.OPEN:
            await self._open(f, now)
            return
        assert inc is not None
        signal = inc.signal(f.key)
        assert signal is not None
        if change.change in (decide.Change.RESOLVE, decide.Change.PART):
            signal.resolved_at = now
        if change.change is decide.Change.PART:
            await self.book.save(inc)  # the join survives a restart; the incident changes in nothing else
            return
        if change.change is decide.Change.RESOLVE:
            if self.recovery.holds(inc.id):
                await self.recovery.rule_resolved(inc)  # its recovery ladder closes it
                return
            inc.state = "resolved"
            inc.resolved_at = self.clock()
            inc.evidence = {**inc.evidence, **change.evidence}
            inc.actions += change.on_resolve
            await self._save_publish(inc, "resolved")
            if any(a.on_resolve and a.status is None for a in inc.actions):
                self.actions.spawn(inc)
            return
        inc.last_seen_firing = signal.last_seen_firing = now
        if change.change is decide.Change.REFRESH:
            signal.evidence, signal.resolved_at = change.evidence, None
            inc.evidence = decide.evidence_of(inc)
            await self._save_publish(inc, "updated")

    async def _open(self, f: engine_mod.Firing, now: float) -> None:
        into = decide.correlate(f, self.book.open.values(), now, self.cs.correlate_window_s)
        if into is not None:
            await self._join(into, f, now)
            return
        repeats = await self._count_repeat(f.node, f.gpu, now)
        inc = decide.new_incident(f, book.new_id(), now, self.cs.mode, repeats, self.cs)
        if f.gpu is not None and self.scorer is not None and "anomaly_score" in (f.rule.when_text or ""):
            scorer = self._learning_scorer()
            why = scorer.explain(f.node, f.gpu) if scorer is not None else {}
            inc.evidence.update({f"anomaly.{k}": v for k, v in why.items()})  # which component, against what
        await self.recovery.opened(inc, now)
        await self._save_publish(inc, "opened")
        if inc.escalated:
            await self._save_publish(inc, "escalated")
        self.actions.spawn(inc)

    async def _join(self, inc: book.Incident, f: engine_mod.Firing, now: float) -> None:
        """Another signal of the fault ``inc`` is about: one ``updated`` change, and the actions the
        joining rule adds run after the incident's own."""
        joined = decide.join(inc, f, now)
        joined.apply(inc)
        escalated = False
        if joined.gpu is not None:  # a node-scope incident became this GPU's fault: its episode counts
            repeats = await self._count_repeat(inc.node, inc.gpu_index, now)
            escalated = decide.escalate_repeat(inc, repeats, self.cs)
        await self._save_publish(inc, "updated")
        if escalated:
            await self._save_publish(inc, "escalated")
        if any(a.status is None for a in inc.actions):
            self.actions.spawn(inc)

    async def _count_repeat(self, node: str, gpu: int | None, now: float) -> int:
        """Fault episodes on this GPU within ``repeat_window_s`` (``decide.episodes``), kept in KV."""
        if gpu is None:
            return 0
        key = f"history.{node}.{gpu}"
        try:
            async with asyncio.timeout(REPEAT_COUNT_S):  # not the KV client's own, longer, timeout
                doc = await self.state.get(key)
                seen = decide.episodes(
                    doc.value.get("opened", []) if doc else [], now, self.cs.repeat_window_s
                )
                await self.state.put(key, {"opened": list(seen.times)})
        except (errors.TemporaryError, TimeoutError) as e:
            # The count only escalates a repeat offender: it never holds up the quarantine of a fault.
            self.metrics.task_failures.labels("repeat-count").inc()
            self.log.warning("controller.repeat_count_failed", node=node, gpu=gpu, error=str(e) or repr(e))
            return 1
        return seen.count

    async def _save_publish(self, inc: book.Incident, change: incidents.Change) -> None:
        inc.seq += 1
        inc.updated_at = self.clock()
        self.feed.enqueue(self.feed.build(inc, change))  # built before any await: ids never collide
        await self.book.save(inc)
        self.feed.kick()  # published by the feed task: a slow incidents stream never delays an action
        self.metrics.incident_changes.labels(change).inc()
        self.log.info(
            "incident." + change, incident_id=inc.id, rule_id=inc.rule_id, node=inc.node, gpu=inc.gpu_index,
            severity=inc.severity,
        )  # fmt: skip

    async def _retry_and_escalate(self, now: float) -> None:
        for inc in self.book.all():
            if inc.id in self.tasks:
                continue
            if any(a.status is None for a in inc.actions):
                self.actions.spawn(inc)
            step = decide.ladder_step(inc, now, self.cs)
            if step is not None:
                inc.escalated = True
                inc.summary += decide.LADDER_NOTE
                inc.actions.append(step)
                await self._save_publish(inc, "escalated")
                self.actions.spawn(inc)

    def _forget_silent(self, now: float) -> list[engine_mod.Firing]:
        """Reclaim the state of nodes silent longer than ``node_retention_s``; their firings resolve."""
        forgotten = self.engine.forget_silent(now, self.cs.node_retention_s)
        for node in forgotten.nodes:
            self.nodes.discard(node)
            self.power_limits.pop(node, None)
            self.metrics.nodes_forgotten.inc()
            self.log.info("controller.node_forgotten", node=node, retention_s=self.cs.node_retention_s)
        return forgotten.resolved

    def reply_rejected(self, reason: str) -> None:
        """The power actuator did not believe an agent's reply (see ``actuators.power``): count it."""
        self.metrics.messages_rejected.labels("command_result", reason).inc()

    def _fleet_size(self) -> int:
        """The breaker's denominator: admitted nodes only (an inventory file lists every shard's)."""
        admitted = max(len(self.admission.admitted), 1)
        return admitted if self.cs.admission == "file" else admitted * max(1, self.cs.shards)

    # -- housekeeping ------------------------------------------------------------------------------
    async def _housekeeping(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), timeout=self.cs.reload_check_s)
            if self._stop.is_set():
                return
            await self._maybe_refresh_labels()
            await self.admission.refresh()
            try:
                async with self._turn:
                    await self._maybe_reload()
                if self.leader:
                    await self.exclusions.refresh()
                    status = await self.breaker.status()
                    self.metrics.breaker_open.set(1 if status.get("open") else 0)
                    if time.monotonic() - self._anomaly_saved_at >= self.cs.anomaly_save_s:
                        await self._save_anomaly_state()
            except errors.HealerError as e:
                self.log.warning("controller.housekeeping_failed", error=str(e))

    # -- what the anomaly model learned, kept in KV --------------------------------------------------
    def _learning_scorer(self) -> scoring.Scorer | None:
        from healer.anomaly import scoring  # imported by start() already when a model is set

        return self.scorer if isinstance(self.scorer, scoring.Scorer) else None

    async def _restore_anomaly_state(self) -> None:
        """Start from what this fleet's model learned before (per-GPU and per-node baselines), so a
        restart or a new controller does not warm up again. A state of another format or GPU count is
        ignored (logged): the model learns again."""
        scorer = self._learning_scorer() if self.scorer is not None else None
        if scorer is None:
            return
        from healer.anomaly import state as anomaly_state

        try:
            saved = await anomaly_state.load(self.state)
            nodes = scorer.import_state(saved) if saved is not None else 0
        except (errors.HealerError, ValueError) as e:
            self.log.warning("controller.anomaly_state_not_restored", error=str(e), detail="learning again")
            return
        self.log.info("controller.anomaly_state_restored", nodes=nodes)

    async def _save_anomaly_state(self) -> None:
        scorer = self._learning_scorer() if self.scorer is not None else None
        self._anomaly_saved_at = time.monotonic()
        if scorer is None:
            return
        from healer.anomaly import state as anomaly_state

        try:
            shards = await anomaly_state.save(self.state, scorer.export_state())
        except errors.HealerError as e:
            self.log.warning("controller.anomaly_state_not_saved", error=str(e))
            return
        self.log.debug("controller.anomaly_state_saved", shards=shards)

    def components(self, node: str, gpu: int) -> dict[str, float] | None:
        """The anomaly model's components for one GPU at its last scoring (so the controller is the status
        page's ``AnomalySource``); None without a loaded model or before the GPU was scored."""
        scorer = self._learning_scorer() if self.scorer is not None else None
        found = scorer.explain(node, gpu) if scorer is not None else {}
        comps = {k.removeprefix("component_"): v for k, v in found.items() if k.startswith("component_")}
        if not comps:
            return None
        return {"anomaly_score": float(found["anomaly_score"]), **{k: float(v) for k, v in comps.items()}}

    async def _maybe_refresh_labels(self) -> None:
        """Node labels for rules' ``match.labels``, from the scheduler (Kubernetes labels, Slurm
        partitions and features) every ``labels_refresh_s``. On failure the previous labels stay."""
        now = time.monotonic()
        if not hasattr(self.scheduler, "node_labels") or not self.cs.labels_refresh_s:
            return
        if now - self._labels_at < self.cs.labels_refresh_s:
            return
        self._labels_at = now
        source = cast(actuators.LabelSource, self.scheduler)
        try:
            labels = await asyncio.wait_for(source.node_labels(sorted(self.nodes)), self.cs.labels_timeout_s)
        except (errors.HealerError, TimeoutError) as e:
            self.metrics.label_refresh_failures.inc()
            self.log.warning("controller.labels_failed", error=str(e) or repr(e), kept="previous labels")
            return
        for node, node_labels in labels.items():
            self.engine.set_labels(node, node_labels)
        self.log.debug("controller.labels_refreshed", nodes=len(labels))

    def _signature(self) -> tuple[tuple[str, float, int], ...]:
        files = loader.expand([self.rules_path])
        out = []
        for p in files:
            with contextlib.suppress(OSError):
                st = p.stat()
                out.append((str(p), st.st_mtime, st.st_size))
        return tuple(out)

    async def _maybe_reload(self) -> None:
        sig = self._signature()
        if sig == self._rules_sig:
            return
        self._rules_sig = sig
        result = loader.load_paths([self.rules_path])
        if result.ruleset is None:
            self.metrics.rules_rejected.inc()
            problems = result.errors
            self.log.error(
                "rules.rejected", errors=[str(d) for d in problems], kept=len(self.engine.rules.rules)
            )
            if self.leader:
                await self._publish_rejection(problems)
            return
        gone = self.engine.set_rules(result.ruleset, now=self.clock())
        self.metrics.rules_loaded.set(len(result.ruleset.rules))
        self.log.info("rules.reloaded", rules=len(result.ruleset.rules), resolved=len(gone))
        if self.leader:
            for f in gone:
                await self._handle(f, self.clock())

    async def _publish_rejection(self, problems: list[Any]) -> None:
        event = incidents.RulesRejectedEvent(
            id=f"rules-{uuid.uuid4().hex}",
            source=f"healer://{self.cs.cluster}/controller",
            time=datetime.datetime.fromtimestamp(self.clock(), tz=datetime.UTC),
            data=incidents.RulesRejectedData(
                rules_dir=str(self.rules_path),
                errors=[
                    incidents.RuleProblem(path=d.path, line=d.line, col=d.col, message=d.message)
                    for d in problems
                ],
                kept_rules=len(self.engine.rules.rules),
            ),
        )
        try:
            await self.bus.publish_durable(self.subjects.rules_rejected, codec.encode(event), msg_id=event.id)
        except errors.HealerError as e:
            self.log.warning("rules.rejection_not_published", error=str(e))

    # -- readiness (served by /readyz, computed on the event loop once a second) ---------------------
    def ready(self) -> health.Verdict:
        """Connected, rules loaded, the model loaded or deliberately off, the role known, the controller's
        own tasks running and ticking. A stuck or disconnected controller is not ready."""
        check = health.Check
        ticks = next(
            (s.value for f in self.metrics.tick.collect() for s in f.samples if s.name.endswith("_count")),
            0.0,
        )
        now = time.monotonic()
        seen, since = getattr(self, "_ready_ticks", (-1.0, now))
        if ticks != seen:
            seen, since = ticks, now
        self._ready_ticks = (seen, since)
        stuck_s = now - since
        fresh = stuck_s <= max(TICK_STALE_MIN_S, 5 * self.cs.tick_s)
        ticking = check(fresh, f"{ticks:.0f} ticks" if fresh else f"no tick for {stuck_s:.1f} s")
        engine = self.engine
        if not self.cs.model:
            model = check(True, "off (anomaly_score is 0)")
        elif self.scorer is None:
            model = check(False, f"not loaded yet: {self.cs.model}")
        else:
            from healer.anomaly import scoring  # already imported when the model was loaded

            loaded = isinstance(self.scorer, scoring.Scorer)
            model = check(loaded, "loaded" if loaded else f"failed to load {self.cs.model} (see the log)")
        role = check(True, "leader" if self.leader else "standby") if self._bg else check(False, "starting")
        dead = [  # the events task ends by design when leadership is lost; the others run until stop
            t.get_name()
            for t in self._bg
            if t.done() and (t.get_name() in STANDING_TASKS or t.cancelled() or t.exception() is not None)
        ]
        return health.Verdict.of(
            nats=check(self.bus.connected, "connected" if self.bus.connected else "disconnected"),
            rules=check(True, f"{len(engine.rules.rules)} rules"),
            model=model,
            role=role,
            tasks=check(
                not dead and bool(self._bg),
                f"stopped: {', '.join(dead)}" if dead else "running" if self._bg else "not started",
            ),
            ticks=ticking,
        )
