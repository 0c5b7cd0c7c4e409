"""What every role of one controller shares, passed once (#40).

The ingest, the tick, the incident and power shells, leadership, reloads, housekeeping, the power API and
readiness each read the same settings, metrics, lease role, clock, stop event, bound log and turn lock.
``service.Controller`` builds one ``Context`` and hands it to each; a role takes from it what it uses
and names its own collaborators (the engine, the book, the feed ...) as keyword arguments.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

import structlog

from healer import config
from healer.controller.observability import metrics as controller_metrics
from healer.controller.store import role as lease_role


@dataclasses.dataclass(frozen=True, slots=True)
class Context:
    cs: config.ControllerSettings
    metrics: controller_metrics.ControllerMetrics
    role: lease_role.Role
    """Leader or standby of this controller's shard (``store.role``)."""
    clock: Callable[[], float]
    """Wall time (``time.time`` in production; a test's clock)."""
    stop: asyncio.Event
    """Set when the controller stops: every role's loop ends."""
    log: structlog.typing.FilteringBoundLogger
    """The controller's log, bound to its shard and holder."""
    turn: asyncio.Lock
    """Held by a tick, a takeover, a rules reload and a power step: a takeover never reloads the
    incidents under a tick that started before a lost lease was won again (that tick's objects would act
    twice)."""
