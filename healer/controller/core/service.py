"""Controller: ingest → rule engine → incidents → safety policy → actuators, once per tick.

This module only builds the controller and starts and stops it; each role has a room of its own:

- ``ingest`` — frames decoded at the edge into the engine; events pulled from a durable JetStream
  consumer, admitted, and acknowledged only after the tick that evaluated them recorded its decisions;
- ``tick`` — every rule over the shard's fleet at once, then (leader only) the firings to the shell;
- ``incident_shell`` — what ``decide`` says a firing does, carried out: open, join, the repeat count in
  KV, save and publish; it owns the ``ActionRunner`` (one task per incident, so a slow drain never
  delays detection elsewhere) and the recovery ladders, and is the ``shell.Shell`` they both receive;
- ``leadership`` / ``role`` — only the lease holder acts and publishes; a standby ingests the same
  telemetry and, when it wins the lease, reloads the incidents from KV and picks up where the old leader
  stopped (actions recorded as done are never repeated, every action carries the new fencing token);
- ``housekeeping`` and ``reload`` — labels, admission, exclusions, the rule pack;
- ``learning`` — the anomaly model and what it learned, kept in KV;
- ``power_shell`` / ``power_api`` — power budgets per failure domain (#30), capped and restored through the
  same actions; demand response and status on ``healer.power.shed`` / ``healer.power.status``;
- ``readiness`` — /readyz.

Every long-lived task (lease keeper, leadership, event puller, tick, housekeeping, feed) is supervised
by a ``tasks.Scheduler``: a failure is logged, counted and the task restarted with back-off, so losing
one NATS server of three (503s, leader elections, reconnects) is weathered, never a silently dead
controller.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import socket
import time
import uuid
from collections.abc import Callable
from typing import cast

import structlog

from healer import config, health, tasks
from healer.actuators import base as actuators
from healer.bus import base as bus_base
from healer.bus import subjects
from healer.controller.core import (
    context,
    housekeeping,
    incident_shell,
    ingest,
    leadership,
    learning,
    power_api,
    power_shell,
    readiness,
    reload,
    tick,
)
from healer.controller.incidents import book, closing, feed_publisher
from healer.controller.inventory import admission
from healer.controller.observability import metrics as controller_metrics
from healer.controller.observability import repairs, storage
from healer.controller.remediation import policy
from healer.controller.store import kv, lease, role
from healer.schemas import framecols

log = structlog.get_logger(__name__)

shard_of = ingest.shard_of


async def build(
    settings: config.Settings,
    bus: bus_base.Bus,
    *,
    scheduler: actuators.Actuator,
    power: actuators.Actuator | Callable[[Controller], actuators.Actuator] | None = None,
    gpu: actuators.Actuator | None = None,
    metrics: controller_metrics.ControllerMetrics | None = None,
    holder: str | None = None,
    clock: Callable[[], float] = time.time,
) -> Controller:
    """A fully wired controller on ``bus`` (its KV buckets bound, rules loaded, the model loaded when
    set); ``await ctl.start()`` runs it. PermanentError when the rules do not load, NotFound when the
    buckets were never provisioned."""
    subj = subjects.Subjects(settings.nats.prefix)
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
        metrics: controller_metrics.ControllerMetrics | None = None,
        holder: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Everything wired, nothing optional afterwards; ``build`` binds the KV buckets and calls this.
        ``power`` may be a function of the controller (the power actuator reads its power limits)."""
        self.settings = settings
        cs = self.cs = settings.controller
        self.bus = bus
        self.subjects = subjects.Subjects(settings.nats.prefix)
        self.scheduler = scheduler
        if power is not None and not hasattr(power, "apply"):  # a function of this controller
            power = power(self)
        self.power = cast(actuators.Actuator | None, power)
        self.gpu = gpu
        """GPU reset and validation through the node agent (recovery ladders); None: resets fail."""
        self.metrics = metrics = metrics or controller_metrics.ControllerMetrics()
        self.holder = holder or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.clock = clock
        self.log = log.bind(shard=cs.shard, holder=self.holder)
        self.admission = admission.Admission(cs, metrics, scheduler=scheduler, log=self.log, clock=clock)
        rules_sig = reload.signature(pathlib.Path(cs.rules_dir))
        self.engine = reload.load(cs)
        """Built with the rules at construction: a controller whose rules do not load is never made."""
        self.learning = learning.Learning(cs, state, metrics, self.log, settings.anomaly)
        self.state = state
        self.book = book.Book(state)
        self.feed = feed_publisher.FeedPublisher(bus, self.subjects, cs.cluster)
        self.breaker = policy.Breaker(state, cs)
        self.dry_breaker = policy.Breaker(kv.Prefixed(state, "dry-run."), cs)
        self.exclusions = policy.Exclusions(state)
        self.limits = policy.Limits(cs, state if cs.mode.acts else kv.Prefixed(state, f"{cs.mode}."))
        self.lease = lease.Lease(leases, lease.key_of(cs.shard), self.holder, settings.nats.lease_ttl_s)
        self._stop = asyncio.Event()
        self.supervisor = tasks.Scheduler(
            "controller", metrics.task_failures, log=self.log, stop=self._stop,
            initial_delay_s=settings.retry.initial_delay_s, max_delay_s=settings.retry.max_delay_s,
        )  # fmt: skip
        turn = asyncio.Lock()  # ``context.Context.turn``
        self.role = role.Role(self.lease, metrics, self.log, shard=cs.shard, margin_s=cs.leaderless_margin_s)
        self.ctx = context.Context(cs, metrics, self.role, clock, self._stop, self.log, turn)
        self._wire_roles(self.ctx, state, scheduler, gpu, rules_sig)

    def _wire_roles(
        self,
        ctx: context.Context,
        state: kv.Store,
        scheduler: actuators.Actuator,
        gpu: actuators.Actuator | None,
        rules_sig: reload.Signature,
    ) -> None:
        """The controller's roles, each given the shared ``ctx`` and its own collaborators."""
        bus = self.bus
        self.ingest = ingest.Ingest(
            ctx, bus, self.subjects, engine=self.engine, learning=self.learning, admission=self.admission
        )
        self.incidents = incident_shell.IncidentShell(
            ctx, state=state, book=self.book, feed=self.feed, engine=self.engine,
            admission=self.admission, learning=self.learning, scheduler=scheduler, power=self.power,
            gpu=gpu, lease=self.lease, breaker=self.breaker, dry_breaker=self.dry_breaker,
            exclusions=self.exclusions, limits=self.limits,
        )  # fmt: skip
        self.actions = self.incidents.actions
        self.recovery = self.incidents.recovery
        self.leadership = leadership.Leadership(
            ctx, book=self.book, recovery=self.recovery, engine=self.engine,
            exclusions=self.exclusions, ingest=self.ingest, shell=self.incidents, feed=self.feed,
            dedup_window_s=self.settings.nats.dedup_window_s,
        )  # fmt: skip
        self.reloader = reload.Reloader(
            ctx, bus, self.subjects, sig=rules_sig, engine=self.engine, shell=self.incidents
        )
        self.storage = storage.StorageWatch(bus, self.subjects, ctx.metrics, ctx.log)
        self.closer = closing.Closer(
            state, self.book, publish=self.incidents.publish, release=self.engine.release, clock=ctx.clock,
            log=ctx.log,
        )  # fmt: skip
        self.housekeeping = housekeeping.Housekeeping(
            ctx, storage=self.storage, actions=self.actions, closer=self.closer, scheduler=scheduler,
            nodes=self.ingest.nodes, engine=self.engine, admission=self.admission, reloader=self.reloader,
            exclusions=self.exclusions, breaker=self.breaker, learning=self.learning,
        )  # fmt: skip
        self.ticker = tick.Ticker(
            ctx, engine=self.engine, ingest=self.ingest, learning=self.learning, shell=self.incidents,
            book=self.book, feed=self.feed,
        )  # fmt: skip
        self.power_budgets = power_shell.PowerShell(
            ctx, state=state, book=self.book, ingest=self.ingest, admission=self.admission,
            shell=self.incidents,
        )  # fmt: skip
        self.power_api = power_api.PowerApi(
            ctx, bus, self.subjects, shell=self.power_budgets, holder=self.holder
        )
        self.readiness = readiness.Readiness(
            ctx, bus=bus, engine=self.engine, learning=self.learning, supervisor=self.supervisor
        )

    # -- lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        """Subscribe and run: the lease, leadership, events, ticks, housekeeping and the feed."""
        rules = self.engine.rules.rules
        self.metrics.rules_loaded.set(len(rules))
        repairs.start_at_zero(self.metrics, ((r.id, str(r.scope)) for r in rules))
        await self.learning.restore()
        await self.ingest.subscribe()
        await self.power_api.subscribe()
        self.supervisor.supervise("lease", lambda: self.lease.keep(self._stop, self.role.on_lease))
        self.supervisor.supervise("leadership", self.leadership.run)
        self.supervisor.supervise("events", self.ingest.pull_events)
        self.supervisor.supervise("ticks", self.ticker.run)
        self.supervisor.supervise("housekeeping", self.housekeeping.run)
        self.supervisor.supervise("feed", lambda: self.feed.run(self._stop))
        if self.cs.power_budgets:
            self.supervisor.supervise("power", self.power_budgets.run)
        decoder = "compiled" if framecols.ACCELERATED else "python"  # (python: ~4x the CPU per frame)
        self.log.info("controller.started", rules=len(rules), mode=self.cs.mode, frame_decoder=decoder)

    async def stop(self) -> None:
        was_leader = self.leader
        self._stop.set()
        running = list(self.actions.jobs.tasks)
        if running:  # actions in flight get 5 s together to finish their current call, not 5 s each
            await asyncio.wait(running, timeout=5.0)
        await self.supervisor.wait()
        # every action task, not only each incident's newest: one chained after a task still running
        # leaves that earlier task out of ``tasks``, and cancelling the newer one does not end it
        await self.actions.jobs.close()
        if was_leader and self.learning.scorer is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.learning.save(), timeout=10.0)
        if self.feed.outbox:  # the last changes, once (a failed publish is retried by the next leader's)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.feed.flush(), timeout=6.0)
        await self.ingest.close()
        await self.power_api.close()
        self.metrics.leader.set(0)
        self.log.info("controller.stopped")

    # -- what others read of a running controller ---------------------------------------------------
    @property
    def leader(self) -> bool:
        """Acting as leader: took over, and holds a lease renewed within half its TTL."""
        return self.role.leader

    @property
    def tasks(self) -> dict[str, asyncio.Task[None]]:
        """The running per-incident action tasks."""
        return self.actions.tasks

    @property
    def nodes(self) -> set[str]:
        """The shard's nodes that report (admitted, not forgotten)."""
        return self.ingest.nodes

    def ready(self) -> health.Verdict:
        """/readyz (``readiness``)."""
        return self.readiness.ready()

    def served(self, verdict: health.Verdict) -> None:
        """/readyz now serves ``verdict``: the leader gauge follows it (``Role.served``)."""
        self.role.served(verdict.ready)

    def components(self, node: str, gpu: int) -> dict[str, float] | None:
        """The status page's ``AnomalySource``: the anomaly model's components for one GPU."""
        return self.learning.components(node, gpu)

    def latest_power_limit(self, node: str, gpu_index: int) -> tuple[float, float] | None:
        """The power actuator's readings: (frame ts, power limit in W) from the node's newest frame."""
        return self.ingest.latest_power_limit(node, gpu_index)

    def reply_rejected(self, reason: str) -> None:
        """The power actuator did not believe an agent's reply (see ``actuators.power``): count it."""
        self.metrics.messages_rejected.labels("command_result", reason).inc()
