"""Idempotent creation of healer's JetStream streams and KV buckets.

Every process that needs them calls ``ensure`` at start: each stream is looked up first; a missing one
is created, an existing one with the same settings is left alone, and one whose settings changed
(replicas, dedup window, a longer retention) is updated in place, so an upgrade never needs a manual step
and two processes racing at start are fine. An existing stream is never created again: nats-server
reserves a created stream's byte limit before it finds the stream exists, so on a store sized to healer's
reservation a restart, a standby or a second ``healer nats provision`` was refused (10047). A larger
limit the store cannot hold (a fleet grew) is one logged line naming both sizes; the stream keeps its
old limit and the process runs (``Plan.kept``). Retention is never lowered: a stream an operator gave
a longer ``max_age`` (or none, 0) keeps it, whatever the caller's settings say. Only ``healer nats
provision`` and the services' own start call ``ensure``; admin and read commands open what exists
(``Bus.key_value``).

Every stream and bucket has a byte limit (``max_bytes``), telemetry's sized from the fleet. JetStream
reserves a stream's byte limit in the server's file store when the stream is made, and refuses a stream
whose limit does not fit in what is left ("insufficient storage resources available"). So the space of
the events, incidents and KV streams is theirs: telemetry, dropping its oldest frames past its own limit,
can never fill the store and starve the leases, incidents or ``healer breaker reset``. A byte limit an
operator raised is kept, as a longer retention is.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable

import nats.errors
import nats.js.errors
import structlog
from nats.js import api

from healer import config, errors, sizing
from healer.bus import nats as natsbus
from healer.bus import subjects

log = structlog.get_logger(__name__)

STREAM_IN_USE = 10058
"""JetStream err_code: stream name already in use with a different configuration."""
NO_STORAGE_FOR_RESERVATION = 10047
"""JetStream err_code: "insufficient storage resources available" (the byte limits do not fit)."""


@dataclasses.dataclass(frozen=True)
class KeptLimit:
    """A stream whose larger byte limit (a fleet grew) did not fit in the store: it keeps its old one."""

    stream: str
    asked_bytes: int
    kept_bytes: int

    def line(self) -> str:
        return (
            f"{self.stream}: the store cannot reserve the new byte limit {self.asked_bytes / 2**30:.3f} GiB "
            f"({self.asked_bytes} bytes); it keeps {self.kept_bytes / 2**30:.3f} GiB ({self.kept_bytes} "
            f"bytes). Give the server {(self.asked_bytes - self.kept_bytes) / 2**30:.3f} GiB more "
            "max_file_store, or lower the limit (docs/deployment.md, sizing)"
        )


@dataclasses.dataclass(frozen=True)
class Plan:
    streams: list[api.StreamConfig]
    buckets: list[api.KeyValueConfig]
    kept: tuple[KeptLimit, ...] = ()
    """Limits the store could not grow to; the streams run on their old ones."""


def plan(subjects: subjects.Subjects, settings: config.NatsSettings) -> Plan:
    replicas = settings.replicas
    return Plan(
        streams=[
            api.StreamConfig(
                name=subjects.stream_telemetry,
                description="healer NodeFrames (core publishes captured for replay and training)",
                subjects=[subjects.all_telemetry],
                retention=api.RetentionPolicy.LIMITS,
                discard=api.DiscardPolicy.OLD,
                max_age=settings.telemetry_max_age_s,
                max_bytes=settings.telemetry_bytes(),
                storage=api.StorageType.FILE,
                num_replicas=replicas,
                duplicate_window=min(120.0, settings.telemetry_max_age_s),
            ),
            api.StreamConfig(
                name=subjects.stream_events,
                description="healer NodeEvents: XIDs, GPU lost, agent start/stop",
                subjects=[subjects.all_events],
                retention=api.RetentionPolicy.LIMITS,
                discard=api.DiscardPolicy.OLD,
                max_age=settings.events_max_age_s,
                max_bytes=settings.events_max_bytes,
                storage=api.StorageType.FILE,
                num_replicas=replicas,
                duplicate_window=min(settings.dedup_window_s, settings.events_max_age_s),
            ),
            api.StreamConfig(
                name=subjects.stream_incidents,
                description="healer incident feed (CloudEvents); deduplicated by Nats-Msg-Id",
                subjects=[subjects.all_incidents],
                retention=api.RetentionPolicy.LIMITS,
                discard=api.DiscardPolicy.OLD,
                max_age=settings.incidents_max_age_s,
                max_bytes=settings.incidents_max_bytes,
                storage=api.StorageType.FILE,
                num_replicas=replicas,
                duplicate_window=min(settings.dedup_window_s, settings.incidents_max_age_s),
            ),
        ],
        buckets=[
            api.KeyValueConfig(
                bucket=subjects.kv_state,
                description="healer durable controller state",
                history=5,
                max_bytes=settings.state_max_bytes,
                replicas=replicas,
                storage=api.StorageType.FILE,
            ),
            api.KeyValueConfig(
                bucket=subjects.kv_leases,
                description="healer leader and shard leases; the revision is the fencing token",
                history=1,
                ttl=settings.lease_ttl_s,
                max_bytes=settings.leases_max_bytes,
                replicas=replicas,
                storage=api.StorageType.FILE,
            ),
        ],
    )


PLACEMENT_PENDING = {10005}
"""JetStream's "no suitable peers for placement" (a replica's server is offline or not yet known):
temporary, it resolves when the peer is back."""


RETRY_FOR_S = 30.0
"""How long ``ensure`` keeps trying while JetStream answers "not yet" (a cluster still electing its meta
leader, a replica's server not yet known, an API request unanswered on a loaded machine)."""


async def ensure(
    bus: natsbus.NatsBus,
    subjects: subjects.Subjects,
    settings: config.NatsSettings,
    *,
    retry_for_s: float = RETRY_FOR_S,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Plan:
    """Create or update every stream and bucket; returns what it made sure of. A temporary refusal is
    retried, each one logged, for up to ``retry_for_s`` (0: once); the last one is raised. Creating a
    stream again with the settings it has is a no-op, so an attempt that timed out after the server
    made the stream is safe to repeat. A permanent refusal is raised at once."""
    deadline = clock() + retry_for_s
    attempt = 1
    while True:
        try:
            return await _ensure_once(bus, subjects, settings)
        except errors.TemporaryError as e:
            left = deadline - clock()
            if left <= 0:
                raise
            delay = min(left, e.delay or 1.0)
            log.warning("provision.retry", attempt=attempt, error=str(e), retry_in_s=round(delay, 2))
            attempt += 1
            await sleep(delay)


async def _ensure_once(
    bus: natsbus.NatsBus, subjects: subjects.Subjects, settings: config.NatsSettings
) -> Plan:
    wanted = plan(subjects, settings)
    kept: list[KeptLimit | None] = []
    try:
        for stream in wanted.streams:
            kept.append(await _ensure_stream(bus, stream))
        for bucket in wanted.buckets:
            kept.append(await _ensure_bucket(bus, bucket))
    except nats.js.errors.APIError as e:
        if e.err_code == NO_STORAGE_FOR_RESERVATION:
            raise errors.PermanentError(
                f"JetStream cannot reserve healer's storage ({sizing.gib_up(settings.reserved_bytes())} "
                "for the streams' byte limits, per replica): give every server holding a replica "
                f"max_file_store {sizing.store_bytes(settings)} or more, or lower nats.fleet_nodes / "
                "nats.*_max_bytes (docs/deployment.md, sizing)"
            ) from e
        if e.err_code in PLACEMENT_PENDING or (e.code is not None and e.code >= 500):
            raise errors.TemporaryError(f"JetStream cannot place it yet: {e}", delay=1.0) from e
        raise errors.PermanentError(f"JetStream provisioning failed: {e}") from e
    except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as e:
        raise errors.TemporaryError(f"JetStream not available: {e!r}") from e
    return dataclasses.replace(wanted, kept=tuple(k for k in kept if k is not None))


async def _current(bus: natsbus.NatsBus, name: str) -> api.StreamConfig | None:
    """The stream's configuration as the server holds it; None when there is no such stream."""
    try:
        return (await bus.js.stream_info(name)).config
    except nats.js.errors.NotFoundError:
        return None


async def _ensure_stream(bus: natsbus.NatsBus, stream: api.StreamConfig) -> KeptLimit | None:
    """Looked up first: an existing stream is updated (or left alone), never created again, because a
    create of an existing stream makes the server reserve its limit a second time (10047 on a store
    sized to healer's reservation, docs/deployment.md)."""
    name = stream.name or ""
    current = await _current(bus, name)
    if current is None:
        try:
            await bus.js.add_stream(stream)
            log.debug("provision.stream_created", stream=name)
            return None
        except nats.js.errors.BadRequestError as e:
            current = await _current(bus, name) if e.err_code == STREAM_IN_USE else None
            if current is None:  # not a race with another process creating it
                raise
    return await _update(bus, keep_retention(stream, current), current)


async def _update(
    bus: natsbus.NatsBus, wanted: api.StreamConfig, current: api.StreamConfig
) -> KeptLimit | None:
    """Update ``current`` to ``wanted`` where they differ. A larger byte limit the store cannot hold
    keeps the stream's old limit (its other changes still apply): returned, logged, not raised."""
    name = wanted.name or ""
    if same(wanted, current):
        log.debug("provision.stream_ok", stream=name)
        return None
    try:
        await bus.js.update_stream(wanted)
        log.info("provision.stream_updated", stream=name)
        return None
    except nats.js.errors.APIError as e:
        old = current.max_bytes or 0
        new = wanted.max_bytes or 0
        if e.err_code != NO_STORAGE_FOR_RESERVATION or not 0 < old < new:
            raise
    kept = KeptLimit(name, asked_bytes=new, kept_bytes=old)
    if not same(dataclasses.replace(wanted, max_bytes=old), current):
        await bus.js.update_stream(dataclasses.replace(wanted, max_bytes=old))
    log.warning("provision.limit_kept", stream=name, line=kept.line())
    return kept


COMPARED = (
    "subjects", "retention", "discard", "max_age", "max_bytes", "storage", "num_replicas",
    "duplicate_window", "description", "max_msgs_per_subject",
)  # fmt: skip
"""The settings provisioning sets; a stream equal in these is left alone (no update request)."""


def same(wanted: api.StreamConfig, current: api.StreamConfig) -> bool:
    """True when ``current`` already has every setting ``wanted`` sets (times to the millisecond: the
    server keeps them in nanoseconds, nats-py gives seconds as floats)."""
    for field in COMPARED:
        want, have = getattr(wanted, field), getattr(current, field)
        if want is None:
            continue
        if isinstance(want, float) or isinstance(have, float):
            if abs(float(want) - float(have or 0.0)) > 1e-3:
                return False
        elif want != have:
            return False
    return True


def keep_retention(wanted: api.StreamConfig, current: api.StreamConfig) -> api.StreamConfig:
    """``wanted``, except that an existing longer ``max_age`` (0: for ever) and an existing larger byte
    limit are kept (no byte limit at all is not kept: that is what lets one stream fill the store)."""
    wanted = keep_bytes(wanted, current.max_bytes)
    have = current.max_age or 0.0
    want = wanted.max_age or 0.0
    if have == 0.0 or (want != 0.0 and have > want):
        if want != have:
            log.info("provision.retention_kept", stream=wanted.name, max_age_s=have, asked_s=want)
        return dataclasses.replace(wanted, max_age=have)
    return wanted


def keep_bytes(wanted: api.StreamConfig, current: int | None) -> api.StreamConfig:
    if current is not None and wanted.max_bytes is not None and current > wanted.max_bytes > 0:
        log.info("provision.max_bytes_kept", stream=wanted.name, max_bytes=current, asked=wanted.max_bytes)
        return dataclasses.replace(wanted, max_bytes=current)
    return wanted


def kv_stream(bucket: api.KeyValueConfig) -> str:
    """The stream that holds a KV bucket."""
    return f"KV_{bucket.bucket}"


async def _ensure_bucket(bus: natsbus.NatsBus, bucket: api.KeyValueConfig) -> KeptLimit | None:
    """As ``_ensure_stream``: an existing bucket's stream is looked up and updated, never created."""
    current = await _current(bus, kv_stream(bucket))
    if current is None:
        try:
            await bus.js.create_key_value(bucket)
            log.debug("provision.bucket_created", bucket=bucket.bucket)
            return None
        except nats.js.errors.BadRequestError as e:
            current = await _current(bus, kv_stream(bucket)) if e.err_code == STREAM_IN_USE else None
            if current is None:
                raise
    updated = dataclasses.replace(
        current,
        max_age=bucket.ttl,
        max_msgs_per_subject=bucket.history,
        num_replicas=bucket.replicas,
        description=bucket.description,
        max_bytes=bucket.max_bytes,
    )
    return await _update(bus, keep_bytes(updated, current.max_bytes), current)
