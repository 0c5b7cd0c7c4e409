"""The status page inside another process (the controller): one call, a no-op unless ``ui.enabled``.

It imports the server (and aiohttp, a ``controller`` extra) only when the page is on, and shares the
caller's NATS connection (the page only reads: subscriptions and ephemeral consumers).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

import structlog

from healer import config
from healer.bus import nats as natsbus

if TYPE_CHECKING:
    from healer.ui import server

log = structlog.get_logger(__name__)


async def maybe_start(
    bus: natsbus.NatsBus,
    settings: config.Settings,
    *,
    labels: Callable[[], Mapping[str, Mapping[str, str]]] | None = None,
    anomaly: server.AnomalySource | None = None,
    admitted: Callable[[], Iterable[str]] | None = None,
) -> server.Running | None:
    """Start the page when ``settings.ui.enabled``; ``None`` otherwise. Stop it with ``running.stop()``.
    ``admitted``: the controller's admitted nodes, on the map from the first paint."""
    if not settings.ui.enabled:
        return None
    from healer.ui import server

    running = await server.start(bus, settings, labels=labels, anomaly=anomaly, admitted=admitted)
    log.info("ui.started", url=running.url)
    return running
