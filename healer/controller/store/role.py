"""Whether this controller leads: the one fact about leadership that every room reads.

``leadership.Leadership`` sets it (take over, step down); ingest pulls events only while it holds, the
incident shell and the action runner act only while it holds, and the tick publishes only then.
"""

from __future__ import annotations

import asyncio

import structlog

from healer.controller.observability import metrics as controller_metrics
from healer.controller.store import lease


class Role:
    """Whether this process leads: it took over, and holds a lease renewed within half its TTL."""

    def __init__(
        self,
        lease: lease.Lease,
        metrics: controller_metrics.ControllerMetrics,
        log: structlog.typing.FilteringBoundLogger,
        *,
        shard: int = 0,
        margin_s: float = 10.0,
    ) -> None:
        self.lease = lease
        self.shard = str(shard)
        self.margin_s = margin_s
        """Past the lease TTL plus this without a holder seen, the shard is leaderless."""
        self.metrics = metrics
        self.log = log
        self.took_over = False
        """The takeover finished (incidents reloaded) and the lease was not lost since."""
        self.changed = asyncio.Event()
        """Set when the lease is won or lost (or released after failed takeovers)."""
        self.probe_ready: bool | None = None
        """What /readyz serves now; None where no probe runs (a controller embedded in a test or bench)."""

    @property
    def leader(self) -> bool:
        """Acting as leader: took over, and holds a lease renewed within half its TTL."""
        return self.took_over and self.lease.valid()

    def show(self) -> None:
        """``healer_controller_leader`` follows ``leader`` (set on every flip and every tick), and the
        lease gauges say how long no holder of the shard's lease was seen. The gauge never says leader
        while /readyz says not ready: it reads 1 only while the verdict served is ready (the probe's
        verdict is computed once a second, the lease flips at any instant)."""
        self.metrics.leader.set(1 if self.leader and self.probe_ready is not False else 0)
        unheld = self.lease.unheld_s()
        self.metrics.lease_unheld.labels(self.shard).set(unheld)
        self.metrics.leaderless.labels(self.shard).set(1 if unheld > self.lease.ttl_s + self.margin_s else 0)

    def served(self, ready: bool) -> None:
        """/readyz serves a verdict that is ``ready`` or not (each heartbeat)."""
        self.probe_ready = ready
        self.show()

    def on_lease(self, held: bool) -> None:
        """The lease keeper's word that the lease was won or lost."""
        self.log.warning("controller.leadership", leader=held, token=self.lease.token)
        if not held:
            self.took_over = False
        self.show()
        self.changed.set()
