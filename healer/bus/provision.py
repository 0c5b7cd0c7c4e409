"""Idempotent creation of healer's JetStream streams and KV buckets.

Every process that needs them calls ``ensure`` at start: a missing stream is created, an existing one
with the same settings is left alone, and one whose settings changed (replicas, dedup window, a longer
retention) is updated in place, so an upgrade never needs a manual step and two processes racing at start
are fine. Retention is never lowered: a stream an operator gave a longer ``max_age`` (or none, 0) keeps
it, whatever the caller's settings say. Only ``healer nats provision`` and the services' own start call
``ensure``; admin and read commands open what exists (``Bus.key_value``).

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

from healer import config, errors
from healer.bus import nats as natsbus
from healer.bus import subjects

log = structlog.get_logger(__name__)

STREAM_IN_USE = 10058
"""JetStream err_code: stream name already in use with a different configuration."""
NO_STORAGE_FOR_RESERVATION = 10047
"""JetStream err_code: "insufficient storage resources available" (the byte limits do not fit)."""


@dataclasses.dataclass(frozen=True)
class Plan:
    streams: list[api.StreamConfig]
    buckets: list[api.KeyValueConfig]


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
    try:
        for stream in wanted.streams:
            await _ensure_stream(bus, stream)
        for bucket in wanted.buckets:
            await _ensure_bucket(bus, bucket)
    except nats.js.errors.APIError as e:
        if e.err_code == NO_STORAGE_FOR_RESERVATION:
            raise errors.PermanentError(
                f"JetStream cannot reserve healer's storage ({settings.reserved_bytes() / 2**30:.2f} GiB "
                "for the streams' byte limits, per replica): raise the server's jetstream max_file_store "
                "or lower nats.fleet_nodes / nats.*_max_bytes (docs/deployment.md, sizing)"
            ) from e
        if e.err_code in PLACEMENT_PENDING or (e.code is not None and e.code >= 500):
            raise errors.TemporaryError(f"JetStream cannot place it yet: {e}", delay=1.0) from e
        raise errors.PermanentError(f"JetStream provisioning failed: {e}") from e
    except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as e:
        raise errors.TemporaryError(f"JetStream not available: {e!r}") from e
    return wanted


async def _ensure_stream(bus: natsbus.NatsBus, stream: api.StreamConfig) -> None:
    try:
        await bus.js.add_stream(stream)
        log.debug("provision.stream_ok", stream=stream.name)
    except nats.js.errors.BadRequestError as e:
        if e.err_code != STREAM_IN_USE:
            raise
        current = (await bus.js.stream_info(stream.name or "")).config
        await bus.js.update_stream(keep_retention(stream, current))
        log.info("provision.stream_updated", stream=stream.name)


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


async def _ensure_bucket(bus: natsbus.NatsBus, bucket: api.KeyValueConfig) -> None:
    try:
        await bus.js.create_key_value(bucket)
        log.debug("provision.bucket_ok", bucket=bucket.bucket)
    except nats.js.errors.BadRequestError as e:
        if e.err_code != STREAM_IN_USE:
            raise
        info = await bus.js.stream_info(f"KV_{bucket.bucket}")
        current = info.config
        updated = dataclasses.replace(
            current,
            max_age=bucket.ttl,
            max_msgs_per_subject=bucket.history,
            num_replicas=bucket.replicas,
            description=bucket.description,
            max_bytes=bucket.max_bytes,
        )
        await bus.js.update_stream(keep_bytes(updated, current.max_bytes))
        log.info("provision.bucket_updated", bucket=bucket.bucket)
