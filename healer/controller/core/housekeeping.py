"""Housekeeping, every ``reload_check_s``: what changes slowly and is read from elsewhere.

Node labels from the scheduler (for rules' ``match.labels``, every ``labels_refresh_s``), job placements
and what each job is (for the fail-slow peer groups and the power budgets' job priorities, every
``jobs_refresh_s``), the admitted fleet, the rule pack (``reload``), JetStream's storage (``storage``,
every ``storage.CHECK_S``), and, on the leader, the maintenance exclusions, the breaker's gauge and its
incident (resolved once the breaker is closed), the incidents a person closed (``closing``), and what
the anomaly model learned (every ``anomaly_save_s``). A failure is logged and the previous values stay;
the next round tries again.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time

from healer import config, errors
from healer.actuators import base as actuators
from healer.controller.core import context, learning, reload
from healer.controller.incidents import closing
from healer.controller.inventory import admission, jobs
from healer.controller.observability import storage
from healer.controller.remediation import action_runner, policy
from healer.rules import engine


def listing_due(cs: config.ControllerSettings, since_s: float, unlisted: bool) -> bool:
    """Whether the scheduler's jobs are listed now, ``since_s`` after the last listing: every
    ``jobs_refresh_s`` (0: never), or, when jobs rank power (``power_priority``) and the frames named a
    job no listing describes (``unlisted``), as soon as ``jobs_unlisted_refresh_s`` has passed."""
    if not cs.jobs_refresh_s:
        return False
    if since_s >= cs.jobs_refresh_s:
        return True
    early = cs.power_priority.by_job and cs.jobs_unlisted_refresh_s > 0 and unlisted
    return early and since_s >= cs.jobs_unlisted_refresh_s


class Housekeeping:
    def __init__(
        self,
        ctx: context.Context,
        *,
        storage: storage.StorageWatch,
        actions: action_runner.ActionRunner,
        closer: closing.Closer,
        scheduler: actuators.Actuator,
        nodes: set[str],
        engine: engine.Engine,
        admission: admission.Admission,
        reloader: reload.Reloader,
        exclusions: policy.Exclusions,
        breaker: policy.Breaker,
        learning: learning.Learning,
    ) -> None:
        self.cs = ctx.cs
        self.storage = storage
        self.actions = actions
        self.closer = closer
        """The action runner: the breaker's incident resolves through it once the breaker is closed."""
        self.scheduler = scheduler
        self.nodes = nodes
        """The nodes reporting now (``Ingest.nodes``, the same set), whose labels are asked for."""
        self.engine = engine
        self.admission = admission
        self.reloader = reloader
        self.role = ctx.role
        self.exclusions = exclusions
        self.breaker = breaker
        self.learning = learning
        self.turn = ctx.turn
        self.metrics = ctx.metrics
        self.stop = ctx.stop
        self.log = ctx.log
        self._labels_at = -math.inf
        self._jobs_at = -math.inf

    async def run(self) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), timeout=self.cs.reload_check_s)
            if self.stop.is_set():
                return
            await self.refresh_labels()
            await self.refresh_jobs()
            await self.admission.refresh()
            self.learning.watch_topology(self.admission.topology())
            await self.storage.maybe_check()
            try:
                async with self.turn:
                    await self.reloader.maybe_reload()
                if self.role.leader:
                    await self.exclusions.refresh()
                    status = await self.breaker.status()
                    self.metrics.breaker_open.set(1 if status.get("open") else 0)
                    await self.actions.settle_breaker()  # its incident ends when it closes
                    async with self.turn:
                        await self.closer.apply()  # what a person closed (healer incidents close)
                    if self.learning.save_due():
                        await self.learning.save()
            except errors.HealerError as e:
                self.log.warning("controller.housekeeping_failed", error=str(e))

    async def refresh_jobs(self) -> None:
        """Which job runs on which node, and what it is (QOS, partition, priority class), from the
        scheduler (``squeue --json``; GPU pods), every ``jobs_refresh_s`` (sooner, at most every
        ``jobs_unlisted_refresh_s``, when jobs rank power and the frames name a job no listing
        describes), for the fail-slow peer groups and the power budgets' priorities. On failure the
        previous placements stay."""
        failslow = self.learning.failslow
        now = time.monotonic()
        if failslow is None or not listing_due(self.cs, now - self._jobs_at, failslow.jobs.unlisted()):
            return
        self._jobs_at = now
        try:
            if isinstance(self.scheduler, actuators.PodSource):
                pods = await asyncio.wait_for(self.scheduler.pods(), self.cs.labels_timeout_s)
                failslow.jobs.set_scheduled(
                    "kubernetes", jobs.placements_from_pods(pods), jobs.infos_from_pods(pods)
                )
            elif isinstance(self.scheduler, actuators.JobSource):
                listed = await asyncio.wait_for(self.scheduler.jobs(), self.cs.labels_timeout_s)
                failslow.jobs.set_scheduled(
                    "slurm", jobs.placements_from_squeue(listed), jobs.infos_from_squeue(listed)
                )
        except (errors.HealerError, TimeoutError) as e:
            self.log.warning("controller.jobs_failed", error=str(e) or repr(e), kept="previous placements")

    async def refresh_labels(self) -> None:
        """Node labels for rules' ``match.labels``, from the scheduler (Kubernetes labels, Slurm
        partitions and features) every ``labels_refresh_s``. On failure the previous labels stay."""
        now = time.monotonic()
        source = self.scheduler
        if not isinstance(source, actuators.LabelSource) or not self.cs.labels_refresh_s:
            return
        if now - self._labels_at < self.cs.labels_refresh_s:
            return
        self._labels_at = now
        try:
            labels = await asyncio.wait_for(source.node_labels(sorted(self.nodes)), self.cs.labels_timeout_s)
        except (errors.HealerError, TimeoutError) as e:
            self.metrics.label_refresh_failures.inc()
            self.log.warning("controller.labels_failed", error=str(e) or repr(e), kept="previous labels")
            return
        for node, node_labels in labels.items():
            self.engine.set_labels(node, node_labels)
        self.admission.learn_domains(labels)
        self.log.debug("controller.labels_refreshed", nodes=len(labels))
