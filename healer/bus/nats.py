"""NatsBus: the Bus Protocol over nats-py, with JetStream for what must not be lost.

The first connection is retried with tenacity (a node agent often starts before the network or the NATS
cluster is up); once connected, nats-py reconnects by itself forever and this object reports the state
through ``connected`` and log events. nats-py errors are translated into healer's vocabulary here and
nowhere else: timeouts, no responders, a closed or reconnecting connection → ``TemporaryError``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import ssl
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import nats
import nats.errors
import nats.js.errors
import structlog
import tenacity
from nats.aio.client import Client
from nats.aio.msg import Msg as NatsMsg
from nats.js import api as js_api
from nats.js import kv as js_kv
from nats.js.client import JetStreamContext

from healer import config, errors
from healer.bus import base, fair

log = structlog.get_logger(__name__)
SLOW_CONSUMER_LOG_S = 10.0
DEFAULT_PENDING_BYTES = 128 * 2**20
"""nats-py's own default backlog per subscription."""
YIELD_EVERY = 64
"""A subscription handler lets other tasks run after this many messages in a row."""

_TEMPORARY = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.ConnectionDrainingError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.StaleConnectionError,
    nats.js.errors.ServiceUnavailableError,
    nats.js.errors.NoStreamResponseError,
    asyncio.TimeoutError,
    ConnectionError,
)


def is_temporary(e: BaseException) -> bool:
    """Whether a nats-py error means "try again": a server away or reconnecting, a timeout, no
    responders, a stream or consumer without a leader (an election in progress: 503, no stream
    response), or any other JetStream API error with a 5xx code. One definition for every caller (KV,
    streams, consumers), so losing one server of three is never a permanent failure anywhere."""
    if isinstance(e, _TEMPORARY):
        return True
    return isinstance(e, nats.js.errors.APIError) and e.code is not None and int(e.code) >= 500


_FAILURES = (nats.errors.Error, OSError, TimeoutError)


NO_STORAGE = 10023
"""JetStream err_code "insufficient resources": a write refused because the store (or the account's
storage) is full."""


def describe(e: BaseException) -> str:
    """A nats-py failure in one line that says why: JetStream's own code and description (nats-py's
    ``repr`` of an API error is only ``ServiceUnavailableError()``), and for a full store what to do."""
    if isinstance(e, nats.js.errors.APIError):
        if e.err_code == NO_STORAGE:
            return (
                "JetStream refused the write: its store is full (insufficient resources, err 10023); "
                "a stream without a byte limit filled it: see `healer nats status`, run `healer nats "
                "provision` (docs/operations.md)"
            )
        return f"JetStream {type(e).__name__} {e.code}/{e.err_code}: {e.description or 'no description'}"
    return repr(e)


def translate(what: str, e: BaseException) -> errors.HealerError:
    """A nats-py failure as healer's: what "try again" means is decided once, in ``is_temporary``;
    anything else is permanent."""
    if is_temporary(e):
        return errors.TemporaryError(f"{what}: {describe(e)}")
    return errors.PermanentError(f"{what}: {describe(e)}")


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
        except _FAILURES as e:
            raise translate(f"KV get {key}", e) from e
        if entry.value is None:
            return None
        return base.Entry(key, bytes(entry.value), int(entry.revision or 0))

    async def put(self, key: str, value: bytes) -> int:
        try:
            return int(await self.kv.put(key, value))
        except _FAILURES as e:
            raise translate(f"KV put {key}", e) from e

    async def create(self, key: str, value: bytes) -> int:
        try:
            return int(await self.kv.create(key, value))
        except nats.js.errors.KeyWrongLastSequenceError as e:
            raise base.KeyConflict(f"{key} exists") from e
        except _FAILURES as e:
            raise translate(f"KV create {key}", e) from e

    async def update(self, key: str, value: bytes, last: int) -> int:
        try:
            return int(await self.kv.update(key, value, last=last))
        except nats.js.errors.KeyWrongLastSequenceError as e:
            raise base.KeyConflict(f"{key} changed since revision {last}") from e
        except _FAILURES as e:
            raise translate(f"KV update {key}", e) from e

    async def delete(self, key: str) -> None:
        try:
            await self.kv.delete(key)
        except _FAILURES as e:
            raise translate(f"KV delete {key}", e) from e

    async def keys(self) -> list[str]:
        """Every key with a value (deleted, purged and expired ones left out): the last message of each
        key's subject, headers only, read through a pull consumer made for the listing and deleted after
        it. A pull consumer delivers nothing before it is asked, so the count it reports when made is
        exactly what the listing reads: no key is missed however slow the machine. A consumer the
        server refuses is an error, never an empty bucket."""
        name = f"healer-keys-{uuid.uuid4().hex[:16]}"
        prefix = f"$KV.{self.bucket}."
        config = js_api.ConsumerConfig(
            name=name,
            deliver_policy=js_api.DeliverPolicy.LAST_PER_SUBJECT,
            ack_policy=js_api.AckPolicy.NONE,
            headers_only=True,
            filter_subject=prefix + ">",
            inactive_threshold=KEYS_CONSUMER_IDLE_S,
            mem_storage=True,
            num_replicas=1,
        )
        try:
            async with asyncio.timeout(KEYS_TIMEOUT_S):
                left = (await self.js.add_consumer(self.stream, config=config)).num_pending or 0
                try:
                    return await self._read_keys(name, prefix, left)
                finally:
                    with contextlib.suppress(*_FAILURES):
                        await self.js.delete_consumer(self.stream, name)
        except _FAILURES as e:
            raise translate("KV keys", e) from e

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
            with contextlib.suppress(*_FAILURES):
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
        except _FAILURES as e:
            raise translate(f"ack {self.msg.subject}", e) from e

    async def nak(self, delay: float | None) -> None:
        try:
            await self.msg.nak(delay=delay)
        except _FAILURES as e:
            raise translate(f"nak {self.msg.subject}", e) from e

    async def in_progress(self) -> None:
        try:
            await self.msg.in_progress()
        except _FAILURES as e:
            raise translate(f"in-progress ack {self.msg.subject}", e) from e

    async def term(self) -> None:
        try:
            await self.msg.term()
        except _FAILURES as e:
            raise translate(f"term {self.msg.subject}", e) from e


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
        return translate(f"pull from {self.durable}", e)

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
            raise translate("replay", e) from e
        return _stream_msg(m, acks=False)

    async def close(self) -> None:
        try:
            await self._sub.unsubscribe()
        except (nats.errors.Error, OSError) as e:
            log.debug("bus.replay_unsubscribe_failed", error=repr(e))


MSG_OVERHEAD_BYTES = 512
"""What one queued message costs beside its payload (nats-py's Msg object, its subject string): what a
fair backlog counts against its ``max_bytes``, so a flood of tiny messages cannot fill memory."""


class _FairPending(asyncio.Queue):  # type: ignore[type-arg]
    """nats-py's per-subscription queue, made fair by source (healer/bus/fair.py).

    nats-py puts each message it reads off the socket into ``Subscription._pending_queue``
    (``put_nowait``) and the subscription's task takes them (``get``) for the callback. This queue
    screens each message as it is put (``Fairness.source``: None drops it before it queues), keeps it
    under its source, sheds a source's oldest past ``per_source`` (counted in ``bus.dropped``) and
    gives them out round-robin, so a flooding subject never fills the queue for the others and the
    flood's backlog is gone as soon as it stops. It relies on asyncio.Queue's ``_init``/``_put``/``_get``
    hooks (as ``PriorityQueue`` does) and on nats-py 2.x keeping the queue in ``_pending_queue``; where
    that attribute is missing the subscription stays first-in first-out, logged once."""

    def __init__(self, fair: base.Fairness, on_shed: Callable[[], None]) -> None:
        self._fair_spec = fair
        self._on_shed = on_shed
        super().__init__(maxsize=0)

    def _init(self, maxsize: int) -> None:
        self._queue: fair.FairQueue[Any] = fair.FairQueue(
            self._fair_spec.per_source, self._fair_spec.max_bytes,
            size=lambda m: len(m.data) + MSG_OVERHEAD_BYTES,
        )  # fmt: skip

    def _put(self, item: Any) -> None:
        # put_nowait counts one more unfinished task after this; one that is not kept must not count.
        source = self._fair_spec.source(item.subject, item.data)
        vet = self._fair_spec.vet
        if source is None or (
            vet is not None and self._queue.full(source) and not vet(item.subject, item.data)
        ):
            self._unfinished_tasks -= 1  # type: ignore[attr-defined]
            return
        shed = self._queue.put(source, item)
        if shed is not None:
            self._unfinished_tasks -= 1  # type: ignore[attr-defined]
            self._on_shed()

    def _get(self) -> Any:
        got = self._queue.pop()
        assert got is not None  # asyncio.Queue only calls _get when not empty
        return got[1]

    def take(self, most: int) -> list[Any]:
        """Up to ``most`` messages at once, in ``get``'s order (the queue is unbounded: no putter ever
        waits to be woken); each is ``task_done`` once handled, as a message from ``get`` is."""
        out: list[Any] = []
        pop = self._queue.pop
        while len(out) < most and (got := pop()) is not None:
            out.append(got[1])
        return out

    @classmethod
    def install(
        cls, sub: Any, fair: base.Fairness, bus: NatsBus, batches: Callable[[_FairPending], Any] | None = None
    ) -> bool:
        """Swap the subscription's queue for a fair one; its messages are then taken by a fresh nats-py
        task (one callback per message), or by ``batches(queue)``'s coroutine, run as the subscription's
        task (nats-py cancels it on unsubscribe and waits on the queue when draining, as its own).
        False, logged, where nats-py's internals are not what this expects (nothing swapped)."""
        old = getattr(sub, "_pending_queue", None)
        task = getattr(sub, "_wait_for_msgs_task", None)
        if not isinstance(old, asyncio.Queue) or task is None or not hasattr(sub, "_start"):
            log.warning("nats.fair_backlog_unavailable", subject=getattr(sub, "subject", "?"))
            return False
        sid = sub._id

        def shed() -> None:
            bus.dropped[sid] += 1

        queue = cls(fair, shed)
        while not old.empty():  # what arrived before the swap (nothing awaits between these lines)
            queue.put_nowait(old.get_nowait())
        sub._pending_queue = queue
        task.cancel()  # it may be waiting on the old queue: a fresh one waits on this one
        if batches is None:
            sub._start(bus.nc._error_cb)
        else:
            sub._wait_for_msgs_task = asyncio.get_running_loop().create_task(
                batches(queue), name=f"nats-batches:{sub.subject}"
            )
        return True


class _Sub:
    def __init__(self, sub: Any, bus: NatsBus) -> None:
        self._sub = sub
        self._bus = bus

    @property
    def pending(self) -> int:
        return int(self._sub.pending_msgs)

    @property
    def dropped(self) -> int:
        return self._bus.dropped.get(self._sub._id, 0)

    async def unsubscribe(self) -> None:
        with contextlib.suppress(nats.errors.ConnectionClosedError, nats.errors.BadSubscriptionError):
            await self._sub.unsubscribe()


def _tls_context(ns: config.NatsSettings) -> ssl.SSLContext | None:
    """A client TLS context when a CA or client certificate is configured (``tls://`` URLs alone use
    nats-py's default context with the system CAs)."""
    if not (ns.tls_ca_file or ns.tls_cert_file):
        return None
    try:
        ctx = ssl.create_default_context(cafile=ns.tls_ca_file)
        if ns.tls_cert_file:
            ctx.load_cert_chain(ns.tls_cert_file, ns.tls_key_file)
    except (OSError, ssl.SSLError) as e:
        raise errors.PermanentError(f"bad NATS TLS settings: {e}") from e
    return ctx


class NatsBus:
    """A connected client. Build with ``await NatsBus.connect(...)``; ``close()`` drains it."""

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.on_reconnect: list[Callable[[], Awaitable[None]]] = []
        self.dropped: collections.Counter[int] = collections.Counter()
        """Messages nats-py dropped per subscription id because its backlog was full."""
        self._drop_logged = -math.inf
        self.disconnects = 0
        """Times the connection was lost (a server gone, or one that cut this client off as a slow
        consumer: nats-server closes a client whose backlog outgrows its write deadline)."""
        self._connected_with: tuple[str, str, config.NatsSettings, config.RetrySettings] | None = None
        self._closing = False
        """``close`` was called: the disconnect that follows is no warning."""

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        name: str = "healer",
        nats_settings: config.NatsSettings | None = None,
        retry: config.RetrySettings | None = None,
    ) -> NatsBus:
        ns = nats_settings or config.NatsSettings(url=url)
        rs = retry or config.RetrySettings()
        servers = [u.strip() for u in url.split(",") if u.strip()]
        holder: dict[str, NatsBus] = {}

        last_error: list[Exception] = []
        """The error that ended the connection (nats-py reports it just before the disconnect)."""
        attempts = [0]

        async def on_disconnect() -> None:
            bus = holder.get("bus")
            if bus is not None and bus._closing:
                log.info("nats.closed", name=name)  # a clean exit is no warning
                return
            attempts[0] = 0
            log.warning("nats.disconnected", name=name, error=repr(last_error[-1]) if last_error else None)
            last_error.clear()
            if bus is not None:
                bus.disconnects += 1

        async def on_reconnect() -> None:
            attempts[0] = 0
            log.info("nats.reconnected", name=name, server=str(getattr(holder.get("bus"), "server", "")))
            bus = holder.get("bus")
            if bus is not None:
                for cb in bus.on_reconnect:
                    await cb()

        refused: list[BaseException] = []
        refused_event = asyncio.Event()
        first_contact: list[Exception] = []
        """What nats-py reported while not yet connected (its NoServersError alone says nothing)."""

        async def on_error(e: Exception) -> None:
            if "bus" not in holder:
                first_contact.append(e)
            if isinstance(e, ssl.SSLCertVerificationError) and "bus" not in holder:
                # The server's certificate does not verify against our CA: a setting to fix, not a
                # network blip (and nats-py can hang after it instead of giving up).
                refused.append(e)
                refused_event.set()
                return
            bus = holder.get("bus")
            if isinstance(e, nats.errors.SlowConsumerError) and bus is not None:
                bus._slow_consumer(e, name)
                return
            if "permissions violation" in str(e).lower():
                # Not transient: this identity tried something its credentials do not allow.
                log.error("nats.permission_denied", name=name, error=str(e))
                return
            if bus is not None and bus._closing:
                log.debug("nats.error_while_closing", name=name, error=repr(e))
            elif bus is not None and bus.nc.is_reconnecting:
                # one line per reconnection attempt (nats-py calls back once per failed attempt)
                attempts[0] += 1
                log.warning("nats.reconnect_failed", name=name, attempt=attempts[0], error=repr(e))
            elif bus is not None and isinstance(e, OSError | nats.errors.UnexpectedEOF):
                last_error.append(e)  # the connection is ending: said once, by nats.disconnected
            else:
                log.warning("nats.error", name=name, error=repr(e))

        options: dict[str, Any] = {
            "servers": servers,
            "name": name,
            "connect_timeout": ns.connect_timeout_s,
            "reconnect_time_wait": ns.reconnect_wait_s,
            # nats-py retries a failed *first* connect forever unless attempts are bounded, which would
            # hide a wrong URL; tenacity owns the first connect (bounded, logged), nats-py the rest:
            # once connected, reconnecting is switched to "forever" below.
            "max_reconnect_attempts": 1,
            "allow_reconnect": True,
            "disconnected_cb": on_disconnect,
            "reconnected_cb": on_reconnect,
            "error_cb": on_error,
        }
        if ns.creds_file:
            options["user_credentials"] = ns.creds_file
        if ns.nkey_seed_file:
            options["nkeys_seed"] = ns.nkey_seed_file
        if ns.inbox_prefix:
            options["inbox_prefix"] = ns.inbox_prefix
        tls = _tls_context(ns)
        if tls is not None:
            options["tls"] = tls

        retrying = tenacity.AsyncRetrying(
            retry=tenacity.retry_if_exception_type((OSError, nats.errors.Error, asyncio.TimeoutError)),
            wait=tenacity.wait_exponential(multiplier=rs.initial_delay_s, max=rs.max_delay_s),
            stop=tenacity.stop_after_attempt(rs.attempts) if rs.attempts else tenacity.stop_never,
            before_sleep=lambda state: log.warning(
                "nats.connect_retry",
                name=name,
                url=url,
                attempt=state.attempt_number,
                error=repr(first_contact[-1] if first_contact else state.outcome.exception())
                if state.outcome
                else None,
                delay_s=round(state.next_action.sleep, 3) if state.next_action else None,
            ),
            reraise=True,
        )

        async def attempt_once() -> Client:
            nc = Client()
            connecting = asyncio.create_task(nc.connect(**options))
            refusal = asyncio.create_task(refused_event.wait())
            try:
                await asyncio.wait({connecting, refusal}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                refusal.cancel()
            if connecting.done():
                await connecting  # raises what the attempt raised
                return nc
            connecting.cancel()
            await asyncio.wait({connecting}, timeout=2.0)
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(nc.close(), 2.0)
            raise errors.PermanentError(
                f"NATS at {url}: TLS certificate verification failed ({refused[0]}); check "
                "nats.tls_ca_file (the CA that signed the server's certificate)"
            )

        try:
            async for attempt in retrying:
                with attempt:
                    nc = await attempt_once()

        except (TimeoutError, OSError, nats.errors.Error) as e:
            # The server's refusal says most, even when a later attempt only timed out (a loaded machine)
            told = [f for f in first_contact if "authorization" in str(f).lower()] or first_contact
            why = told[-1] if told else e
            raise errors.TemporaryError(f"cannot connect to NATS at {url}: {why!r}") from e
        nc.options["max_reconnect_attempts"] = -1
        bus = cls(nc)
        bus.js = nc.jetstream(timeout=ns.request_timeout_s)
        bus._connected_with = (url, name, ns, rs)
        holder["bus"] = bus
        log.info("nats.connected", name=name, url=url)
        return bus

    async def sibling(self, suffix: str) -> NatsBus:
        """A second connection with this one's servers, identity and TLS (named ``<name>-<suffix>``),
        for traffic that must not queue with this one's (telemetry floods vs. lease and KV). A bus not
        built by ``connect`` has none to copy: itself."""
        if self._connected_with is None:
            return self
        url, name, ns, rs = self._connected_with
        return await NatsBus.connect(url, name=f"{name}-{suffix}", nats_settings=ns, retry=rs)

    @property
    def connected(self) -> bool:
        return bool(self.nc.is_connected)

    def _slow_consumer(self, e: nats.errors.SlowConsumerError, name: str) -> None:
        """nats-py calls back once per dropped message: count each, log at most every 10 s (a log line
        per message would deepen the overload that caused it)."""
        self.dropped[e.sid] += 1
        now = time.monotonic()
        if now - self._drop_logged >= SLOW_CONSUMER_LOG_S:
            self._drop_logged = now
            log.error(
                "nats.slow_consumer", name=name, subject=e.subject, dropped_total=sum(self.dropped.values())
            )

    async def publish(self, subject: str, data: bytes, headers: dict[str, str] | None = None) -> None:
        try:
            await self.nc.publish(subject, data, headers=headers)
        except _TEMPORARY as e:
            raise errors.TemporaryError(f"publish to {subject} failed: {e!r}") from e

    async def publish_durable(self, subject: str, data: bytes, msg_id: str, timeout: float = 5.0) -> bool:
        try:
            ack = await self.js.publish(subject, data, timeout=timeout, headers={"Nats-Msg-Id": msg_id})
        except nats.js.errors.APIError as e:
            if e.code is not None and e.code >= 500:
                raise errors.TemporaryError(f"JetStream publish to {subject}: {describe(e)}") from e
            raise errors.PermanentError(f"JetStream refused {subject}: {describe(e)}") from e
        except _TEMPORARY as e:
            raise errors.TemporaryError(f"JetStream publish to {subject} failed: {e!r}") from e
        return not bool(ack.duplicate)

    async def subscribe(
        self,
        subject: str,
        handler: base.Handler,
        queue: str = "",
        *,
        pending_bytes: int | None = None,
        fair: base.Fairness | None = None,
    ) -> base.Subscription:
        """``pending_bytes``: the backlog past which nats-py drops messages (default nats-py's, 128 MiB);
        drops are counted in ``dropped`` and on the subscription. ``fair``: the backlog is fair by
        source instead (``_FairPending``: its ``max_bytes`` bounds it; ``pending_bytes`` is unused)."""
        limit = DEFAULT_PENDING_BYTES if pending_bytes is None else pending_bytes
        delivered = 0

        async def deliver(m: NatsMsg) -> None:
            nonlocal delivered
            delivered += 1
            if delivered % YIELD_EVERY == 0:
                # nats-py's per-subscription task takes queued messages without yielding while any are
                # queued: under a flood it would keep the loop from lease renewals and KV for seconds.
                await asyncio.sleep(0)
            msg = base.Msg(
                subject=m.subject,
                data=m.data,
                reply=m.reply or "",
                headers=dict(m.headers) if m.headers else None,
                _responder=self._respond,
            )
            try:
                await handler(msg)
            except Exception:
                log.exception("bus.handler_failed", subject=m.subject)

        try:
            sub = await self.nc.subscribe(
                subject, queue=queue, cb=deliver, pending_bytes_limit=0 if fair else limit
            )
        except _TEMPORARY as e:
            raise errors.TemporaryError(f"subscribe {subject} failed: {e!r}") from e
        if fair is not None:
            _FairPending.install(sub, fair, self)
        return _Sub(sub, self)

    async def subscribe_batches(
        self, subject: str, handler: base.BatchHandler, *, fair: base.Fairness, max_batch: int = 64
    ) -> base.Subscription:
        """The fair backlog (``_FairPending``) taken up to ``max_batch`` messages at a time by one task
        of this module instead of nats-py's (which awaits one callback per message); it yields to the
        event loop after each batch. Where nats-py's internals do not allow it, one message per call."""
        respond = self._respond

        def msg(m: NatsMsg) -> base.Msg:
            return base.Msg(m.subject, m.data, m.reply or "", dict(m.headers) if m.headers else None, respond)

        async def one(m: NatsMsg) -> None:  # only where the fair backlog could not be installed
            try:
                await handler([msg(m)])
            except Exception:
                log.exception("bus.handler_failed", subject=m.subject)

        async def run(queue: _FairPending) -> None:
            while True:
                first = await queue.get()
                batch = [first, *queue.take(max_batch - 1)]
                try:
                    sub._pending_size -= sum(len(m.data) for m in batch)
                    await handler([msg(m) for m in batch])
                except Exception:
                    log.exception("bus.handler_failed", subject=first.subject, messages=len(batch))
                finally:
                    for _ in batch:
                        queue.task_done()
                await asyncio.sleep(0)  # the connection's other work (leases, KV) between batches

        try:
            sub = await self.nc.subscribe(subject, cb=one, pending_bytes_limit=0)
        except _TEMPORARY as e:
            raise errors.TemporaryError(f"subscribe {subject} failed: {e!r}") from e
        _FairPending.install(sub, fair, self, batches=run)
        return _Sub(sub, self)

    async def _respond(self, reply: str, data: bytes) -> None:
        await self.publish(reply, data)

    async def request(self, subject: str, data: bytes, timeout: float = 2.0) -> base.Msg:
        try:
            m = await self.nc.request(subject, data, timeout=timeout)
        except _TEMPORARY as e:
            raise errors.TemporaryError(f"request to {subject} failed: {e!r}") from e
        return base.Msg(subject=m.subject, data=m.data, headers=dict(m.headers) if m.headers else None)

    async def flush(self, timeout: float = 2.0) -> None:
        """Return once the server has processed everything published before the call.

        nats-py (2.16) writes the PING straight to the socket while earlier publishes may still wait in
        its pending buffer for the flusher task, so one PONG does not prove they were processed (and
        that their ``-ERR``, e.g. a permissions violation, was handled). The first round trip lets the
        flusher write them out; the second PING then travels behind them.
        """
        try:
            await self.nc.flush(timeout=max(1, round(timeout)))
            await self.nc.flush(timeout=max(1, round(timeout)))
        except _TEMPORARY as e:
            raise errors.TemporaryError(f"flush failed: {e!r}") from e

    async def last_message(self, stream: str, subject: str) -> tuple[int, bytes] | None:
        """(sequence, data) of the newest message on ``subject`` in ``stream``, read from the stream
        leader (``$JS.API.STREAM.MSG.GET``); None when there is none or it is a KV delete marker."""
        try:
            raw = await self.js.get_msg(stream, subject=subject)
        except nats.js.errors.NotFoundError:
            return None
        except (nats.errors.Error, OSError, TimeoutError) as e:
            if is_temporary(e):
                raise errors.TemporaryError(f"read {subject} from {stream}: {e!r}") from e
            raise errors.PermanentError(f"read {subject} from {stream}: {e!r}") from e
        if raw.headers and raw.headers.get("KV-Operation") in ("DEL", "PURGE"):
            return None
        return int(raw.seq or 0), bytes(raw.data or b"")

    async def key_value(self, bucket: str) -> base.KeyValue:
        try:
            return NatsKeyValue(await self.js.key_value(bucket), self.js, bucket)
        except nats.js.errors.BucketNotFoundError as e:
            raise base.NotFound(
                f"no KV bucket {bucket}: run `healer nats provision` (or start the controller) first, or "
                "check --prefix / nats.prefix"
            ) from e
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as e:
            raise errors.PermanentError(
                f"JetStream not available (is it enabled on the server?): {e!r}"
            ) from e
        except _FAILURES as e:
            raise translate(f"KV bucket {bucket}", e) from e

    def pull_consumer(
        self,
        stream: str,
        subject: str,
        *,
        durable: str,
        ack_wait_s: float,
        max_ack_pending: int,
        start: Literal["all", "new"] = "all",
        description: str = "",
    ) -> base.PullConsumer:
        return PullConsumer(
            self, stream, subject, durable=durable, ack_wait_s=ack_wait_s, max_ack_pending=max_ack_pending,
            start=start, description=description,
        )  # fmt: skip

    async def replay(self, stream: str, subject: str, start: base.Start = "all") -> base.Replay:
        if start == "new":
            cfg = js_api.ConsumerConfig(deliver_policy=js_api.DeliverPolicy.NEW)
        elif start == "all":
            cfg = js_api.ConsumerConfig(deliver_policy=js_api.DeliverPolicy.ALL)
        else:
            cfg = js_api.ConsumerConfig(
                deliver_policy=js_api.DeliverPolicy.BY_START_TIME, opt_start_time=start
            )
        try:
            await self.js.stream_info(stream)
            sub = await self.js.subscribe(subject, stream=stream, ordered_consumer=True, config=cfg)
        except nats.js.errors.NotFoundError as e:
            raise base.NotFound(f"stream {stream} does not exist") from e
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as e:
            raise errors.TemporaryError(f"JetStream not available: {e!r}") from e
        except _FAILURES as e:
            raise translate(f"replay {stream}", e) from e
        try:
            info = await sub.consumer_info()
        except _FAILURES as e:
            with contextlib.suppress(nats.errors.Error, OSError):
                await sub.unsubscribe()
            raise translate(f"replay {stream}", e) from e
        delivered = info.delivered.consumer_seq if info.delivered else 0
        return Replay(sub, int(delivered or 0) + int(info.num_pending or 0))

    async def storage(self, streams: list[str]) -> base.StorageReport:
        """The account's file storage (``$JS.API.INFO``) and each named stream's bytes and limit."""
        try:
            account = await self.js.account_info()
            found, missing = [], []
            for name in streams:
                try:
                    info = await self.js.stream_info(name)
                except nats.js.errors.NotFoundError:
                    missing.append(name)
                    continue
                limit = info.config.max_bytes
                found.append(
                    base.StreamUsage(
                        name, int(info.state.bytes or 0), int(limit) if limit and limit > 0 else None,
                        int(info.state.messages or 0),
                    )
                )  # fmt: skip
        except _FAILURES as e:
            raise translate("JetStream storage", e) from e
        limit_bytes = account.limits.max_storage if account.limits else None
        return base.StorageReport(
            int(account.storage or 0),
            int(limit_bytes) if limit_bytes is not None and limit_bytes >= 0 else None,
            tuple(found),
            tuple(missing),
        )

    async def close(self) -> None:
        if self.nc.is_closed:
            return
        self._closing = True
        try:
            await self.nc.drain()
        except (TimeoutError, nats.errors.Error, OSError):
            await self.nc.close()


async def bare_subscriber(
    url: str, subject: str, handle: Callable[[bytes], None]
) -> Callable[[], Awaitable[None]]:
    """A plain nats-py client that hands every message's payload on ``subject`` to ``handle``, with the
    largest buffers and none of ``NatsBus``'s bookkeeping: the ceiling ``healer bench`` measures the
    controller's ingest against. Returns the coroutine function that closes it."""
    nc = await nats.connect(url, name="bench-bare", pending_size=1 << 27)

    async def deliver(msg: NatsMsg) -> None:
        handle(msg.data)

    await nc.subscribe(subject, cb=deliver, pending_msgs_limit=2_000_000, pending_bytes_limit=1 << 31)
    await nc.flush()
    return nc.close
