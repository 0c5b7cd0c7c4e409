"""JetStream over nats-py: the KV bucket, the pull consumer and the replay, each a ``base`` Protocol."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import TYPE_CHECKING, Any, Literal

import nats
import nats.errors
import nats.js.errors
import structlog
from nats.aio.msg import Msg as NatsMsg
from nats.js import api as js_api
from nats.js import kv as js_kv
from nats.js.client import JetStreamContext

from healer import errors
from healer.bus import base, nats_errors

if TYPE_CHECKING:
    from healer.bus.nats import NatsBus

log = structlog.get_logger(__name__)

KEYS_CONSUMER_IDLE_S = 5.0
"""How long the server keeps a key listing's consumer if the listing could not delete it. nats-py's own
``KeyValue.keys`` leaves its consumer for 5 minutes: a controller listing keys every second or two kept
hundreds of them (and their heartbeats) alive until the KV stream refused new ones ("maximum consumers
limit reached", err 10026); and its push consumer could mark the listing complete before the first key
arrived on a loaded machine, so a listing read as an empty bucket. Both read here as "no incidents"."""
KEYS_TIMEOUT_S = 10.0
"""Longest one key listing may take."""
KEYS_BATCH = 256
"""Keys fetched per request of a listing."""
KV_DELETED_REASONS = frozenset({"MaxAge", "Purge", "Remove"})
"""``Nats-Marker-Reason`` values of a server-placed marker (nats-server 2.11+): the key is gone."""


class NatsKeyValue:
    """A JetStream KV bucket as a ``base.KeyValue``: nats-py's errors become healer's."""

    def __init__(self, kv: js_kv.KeyValue, js: JetStreamContext, bucket: str) -> None:
        self.kv = kv
        self.js = js
        self.bucket = bucket
        self.stream = f"KV_{bucket}"
        """The bucket's stream, which ``keys`` reads through a pull consumer of its own."""

    async def get(self, key: str) -> base.Entry | None:
        try:
            entry = await self.kv.get(key)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            return None
        except nats_errors.FAILURES as e:
            raise nats_errors.translate(f"KV get {key}", e) from e
        if entry.value is None:
            return None
        return base.Entry(key, bytes(entry.value), int(entry.revision or 0))

    async def put(self, key: str, value: bytes) -> int:
        try:
            return int(await self.kv.put(key, value))
        except nats_errors.FAILURES as e:
            raise nats_errors.translate(f"KV put {key}", e) from e

    async def create(self, key: str, value: bytes) -> int:
        try:
            return int(await self.kv.create(key, value))
        except nats.js.errors.KeyWrongLastSequenceError as e:
            raise base.KeyConflict(f"{key} exists") from e
        except nats_errors.FAILURES as e:
            raise nats_errors.translate(f"KV create {key}", e) from e

    async def update(self, key: str, value: bytes, last: int) -> int:
        try:
            return int(await self.kv.update(key, value, last=last))
        except nats.js.errors.KeyWrongLastSequenceError as e:
            raise base.KeyConflict(f"{key} changed since revision {last}") from e
        except nats_errors.FAILURES as e:
            raise nats_errors.translate(f"KV update {key}", e) from e

    async def delete(self, key: str) -> None:
        try:
            await self.kv.delete(key)
        except nats_errors.FAILURES as e:
            raise nats_errors.translate(f"KV delete {key}", e) from e

    async def keys(self, prefix: str = "") -> list[str]:
        """Every key with a value (deleted, purged and expired ones left out) that starts with ``prefix``:
        the last message of each key's subject, headers only, read through a pull consumer made for the
        listing and deleted after it. A prefix ending with a dot is the consumer's subject filter (the
        server sends only those keys); any other is filtered here. A pull consumer delivers nothing
        before it is asked, so the count it reports when made is exactly what the listing reads: no key
        is missed however slow the machine. A consumer the server refuses is an error, never an empty
        bucket."""
        name = f"healer-keys-{uuid.uuid4().hex[:16]}"
        start, prefix = prefix, f"$KV.{self.bucket}."
        config = js_api.ConsumerConfig(
            name=name,
            deliver_policy=js_api.DeliverPolicy.LAST_PER_SUBJECT,
            ack_policy=js_api.AckPolicy.NONE,
            headers_only=True,
            filter_subject=prefix + (start if start.endswith(".") else "") + ">",
            inactive_threshold=KEYS_CONSUMER_IDLE_S,
            mem_storage=True,
            num_replicas=1,
        )
        try:
            async with asyncio.timeout(KEYS_TIMEOUT_S):
                left = (await self.js.add_consumer(self.stream, config=config)).num_pending or 0
                try:
                    return [k for k in await self._read_keys(name, prefix, left) if k.startswith(start)]
                finally:
                    with contextlib.suppress(*nats_errors.FAILURES):
                        await self.js.delete_consumer(self.stream, name)
        except nats_errors.FAILURES as e:
            raise nats_errors.translate("KV keys", e) from e

    async def _read_keys(self, name: str, prefix: str, left: int) -> list[str]:
        out: list[str] = []
        if left == 0:
            return out
        sub = await self.js.pull_subscribe_bind(name=name, stream=self.stream)
        try:
            while left > 0:
                try:
                    msgs = await sub.fetch(min(left, KEYS_BATCH), timeout=KEYS_TIMEOUT_S / 4)
                except nats.errors.TimeoutError:
                    if (await sub.consumer_info()).num_pending == 0:
                        break  # the rest expired (a TTL bucket) or was purged since the count
                    raise
                for m in msgs:
                    left -= 1
                    headers = m.headers or {}
                    if headers.get("KV-Operation") in ("DEL", "PURGE"):
                        continue
                    if headers.get("Nats-Marker-Reason") in KV_DELETED_REASONS:
                        continue
                    out.append(m.subject[len(prefix) :])
        finally:
            with contextlib.suppress(*nats_errors.FAILURES):
                await sub.unsubscribe()
        return out


class _Acker:
    """Settles one nats-py JetStream message (``base.StreamMsg`` keeps it from settling twice)."""

    def __init__(self, msg: NatsMsg) -> None:
        self.msg = msg

    async def ack(self, timeout: float | None) -> None:
        try:
            if timeout is None:
                await self.msg.ack()
            else:
                await self.msg.ack_sync(timeout=timeout)
        except nats_errors.FAILURES as e:
            raise nats_errors.translate(f"ack {self.msg.subject}", e) from e

    async def nak(self, delay: float | None) -> None:
        try:
            await self.msg.nak(delay=delay)
        except nats_errors.FAILURES as e:
            raise nats_errors.translate(f"nak {self.msg.subject}", e) from e

    async def in_progress(self) -> None:
        try:
            await self.msg.in_progress()
        except nats_errors.FAILURES as e:
            raise nats_errors.translate(f"in-progress ack {self.msg.subject}", e) from e

    async def term(self) -> None:
        try:
            await self.msg.term()
        except nats_errors.FAILURES as e:
            raise nats_errors.translate(f"term {self.msg.subject}", e) from e


def _stream_msg(m: NatsMsg, *, acks: bool) -> base.StreamMsg:
    meta = m.metadata
    return base.StreamMsg(
        subject=m.subject,
        data=m.data,
        seq=int(meta.sequence.stream),
        delivered=int(meta.num_delivered or 1),
        pending=int(meta.num_pending or 0),
        _acker=_Acker(m) if acks else None,
    )


class PullConsumer:
    """A durable JetStream pull consumer that survives reconnects and server loss.

    One subscription (one reply inbox) while pulls succeed, so a pull request sent before a disconnect
    and answered after it still lands where the next ``fetch`` drains it; nothing is pulled while the
    connection is down (such pulls would pile up in nats-py's buffer); after a failed pull the
    consumer is looked up again (made if it is gone, its ack settings brought up to date) and bound
    anew. ``fetch`` returns ``[]`` when nothing came within ``timeout`` and raises ``TemporaryError`` for
    what is worth a retry (``NotFound`` when the stream does not exist).
    """

    def __init__(
        self,
        bus: NatsBus,
        stream: str,
        subject: str,
        *,
        durable: str,
        ack_wait_s: float,
        max_ack_pending: int,
        start: Literal["all", "new"] = "all",
        description: str = "",
    ) -> None:
        self.bus = bus
        self.subject = subject
        self.durable = durable
        self.stream = stream
        self.ack_wait_s = ack_wait_s
        self.max_ack_pending = max_ack_pending
        self.start = start
        self.description = description
        self._sub: Any = None

    async def _bind(self) -> Any:
        js = self.bus.js
        try:
            info = await js.consumer_info(self.stream, self.durable)
        except nats.js.errors.NotFoundError:
            policy = js_api.DeliverPolicy.NEW if self.start == "new" else js_api.DeliverPolicy.ALL
            await js.add_consumer(
                self.stream,
                js_api.ConsumerConfig(
                    name=self.durable,
                    durable_name=self.durable,
                    description=self.description or None,
                    deliver_policy=policy,
                    ack_policy=js_api.AckPolicy.EXPLICIT,
                    ack_wait=self.ack_wait_s,
                    max_ack_pending=self.max_ack_pending,
                    max_deliver=-1,
                    filter_subject=self.subject,
                ),
            )
            log.info("bus.consumer_created", stream=self.stream, durable=self.durable, start=self.start)
        else:
            current = info.config
            if current.ack_wait != self.ack_wait_s or current.max_ack_pending != self.max_ack_pending:
                current.ack_wait = self.ack_wait_s
                current.max_ack_pending = self.max_ack_pending
                await js.add_consumer(self.stream, current)
                log.info("bus.consumer_updated", durable=self.durable, ack_wait_s=self.ack_wait_s)
        return await js.pull_subscribe_bind(durable=self.durable, stream=self.stream)

    async def ensure(self) -> None:
        if not self.bus.connected:
            raise errors.TemporaryError("not connected to NATS")
        if self._sub is not None:
            return
        try:
            self._sub = await self._bind()
        except (nats.errors.Error, OSError, TimeoutError) as e:
            raise self._failed(e) from e

    async def fetch(self, batch: int, timeout: float) -> list[base.StreamMsg]:
        await self.ensure()
        try:
            msgs = await self._sub.fetch(batch, timeout=timeout)
        except (TimeoutError, nats.errors.TimeoutError):
            return []
        except (nats.errors.Error, OSError) as e:
            # The consumer may be gone (deleted, or lost with its stream's state; a pull then reads as
            # 503 for ever): the next fetch looks it up and creates it again.
            await self.close()
            raise self._failed(e) from e
        return [_stream_msg(m, acks=True) for m in msgs]

    def _failed(self, e: BaseException) -> errors.HealerError:
        if isinstance(e, nats.js.errors.NotFoundError):
            return base.NotFound(f"pull from {self.durable} on {self.stream}: {e!r}")
        return nats_errors.translate(f"pull from {self.durable}", e)

    async def close(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            with contextlib.suppress(nats.errors.Error, OSError, ValueError):
                await sub.unsubscribe()


class Replay:
    """A stream read in order by an ordered consumer (nats-py recreates it after a gap or a reconnect, so
    nothing is skipped)."""

    def __init__(self, sub: Any, backlog: int) -> None:
        self._sub = sub
        self._backlog = backlog

    @property
    def backlog(self) -> int:
        return self._backlog

    async def next(self, timeout: float) -> base.StreamMsg | None:
        try:
            m = await self._sub.next_msg(timeout=timeout)
        except (TimeoutError, nats.errors.TimeoutError):
            return None
        except (nats.errors.Error, OSError) as e:
            raise nats_errors.translate("replay", e) from e
        return _stream_msg(m, acks=False)

    async def close(self) -> None:
        try:
            await self._sub.unsubscribe()
        except (nats.errors.Error, OSError) as e:
            log.debug("bus.replay_unsubscribe_failed", error=repr(e))
