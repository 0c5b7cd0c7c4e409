"""Following a JetStream KV bucket read-only: its current values, then every change, pushed by the server.

Readers that show state (``healer ui``) learn the breaker and the exclusions from this instead of polling
the bucket: nats-py's KV watcher is an ordered consumer on the bucket's stream (recreated after a gap or a
reconnect), delivering the last value of each key first, then each put or delete as it happens. Nothing
is written, and the watcher leaves nothing behind on the server. nats-py errors are translated here.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable

import nats.errors
import nats.js.errors

from healer import errors
from healer.bus import nats as natsbus


@dataclasses.dataclass(frozen=True, slots=True)
class Change:
    key: str
    value: bytes | None
    """``None``: the key was deleted or purged."""
    revision: int


async def follow(
    bus: natsbus.NatsBus,
    bucket: str,
    on_change: Callable[[Change], None],
    on_ready: Callable[[], None] = lambda: None,
    keys: str = ">",
) -> None:
    """Call ``on_change`` for the current value of every key matching ``keys``, then ``on_ready`` once,
    then ``on_change`` for every later change, until cancelled."""
    try:
        kv = await bus.js.key_value(bucket)
        watcher = await kv.watch(keys)
    except nats.js.errors.BucketNotFoundError as e:
        raise errors.PermanentError(
            f"KV bucket {bucket} does not exist: is the controller running? (healer nats provision makes it)"
        ) from e
    except (nats.errors.TimeoutError, nats.errors.NoRespondersError, nats.errors.ConnectionClosedError) as e:
        raise errors.TemporaryError(f"KV watch {bucket}: {e!r}") from e
    try:
        ready = False
        async for entry in watcher:
            if entry is None:
                if not ready:
                    ready = True
                    on_ready()
                continue
            deleted = entry.operation in ("DEL", "PURGE") or entry.value is None
            on_change(Change(entry.key, None if deleted else bytes(entry.value), int(entry.revision or 0)))
            if not ready and entry.delta == 0:
                ready = True
                on_ready()
    finally:
        with contextlib.suppress(nats.errors.Error, OSError):
            await watcher.stop()  # type: ignore[no-untyped-call]
