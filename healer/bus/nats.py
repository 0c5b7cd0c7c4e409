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
from collections.abc import Awaitable, Callable
from typing import Any

import nats
import nats.errors
import nats.js.errors
import structlog
import tenacity
from nats.aio.client import Client
from nats.aio.msg import Msg as NatsMsg
from nats.js import api as js_api

from healer import config, errors
from healer.bus import base

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


class PullConsumer:
    """A durable JetStream pull consumer that survives reconnects and server loss.

    One subscription (one reply inbox) while pulls succeed, so a pull request sent before a disconnect
    and answered after it still lands where the next ``fetch`` drains it; nothing is pulled while the
    connection is down (such pulls would pile up in nats-py's buffer); after a failed pull the
    subscription is made again (which creates the consumer if it is gone). ``fetch`` returns
    ``[]`` when nothing came within ``timeout`` and raises ``TemporaryError`` for what is worth a retry.
    """

    def __init__(
        self,
        bus: NatsBus,
        subject: str,
        *,
        durable: str,
        stream: str,
        ack_wait_s: float,
        max_ack_pending: int,
    ) -> None:
        self.bus = bus
        self.subject = subject
        self.durable = durable
        self.stream = stream
        self.ack_wait_s = ack_wait_s
        self.max_ack_pending = max_ack_pending
        self._sub: Any = None

    async def fetch(self, batch: int, timeout: float) -> list[NatsMsg]:
        if not self.bus.connected:
            raise errors.TemporaryError("not connected to NATS")
        try:
            if self._sub is None:
                self._sub = await self.bus.js.pull_subscribe(
                    self.subject,
                    durable=self.durable,
                    stream=self.stream,
                    config=js_api.ConsumerConfig(
                        ack_policy=js_api.AckPolicy.EXPLICIT,
                        ack_wait=self.ack_wait_s,
                        max_ack_pending=self.max_ack_pending,
                    ),
                )
            return list(await self._sub.fetch(batch, timeout=timeout))
        except (TimeoutError, nats.errors.TimeoutError):
            return []
        except (nats.errors.Error, OSError) as e:
            # The consumer may be gone (deleted, or lost with its stream's state; a pull then reads as
            # 503 for ever): the next fetch looks it up and creates it again.
            await self.close()
            if is_temporary(e):
                raise errors.TemporaryError(f"pull from {self.durable}: {e!r}") from e
            raise errors.PermanentError(f"pull from {self.durable}: {e!r}") from e

    async def close(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()


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

        async def on_disconnect() -> None:
            log.warning("nats.disconnected", name=name)
            bus = holder.get("bus")
            if bus is not None:
                bus.disconnects += 1

        async def on_reconnect() -> None:
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
            why = first_contact[-1] if first_contact else e
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
                raise errors.TemporaryError(f"JetStream publish to {subject}: {e}") from e
            raise errors.PermanentError(f"JetStream refused {subject}: {e}") from e
        except _TEMPORARY as e:
            raise errors.TemporaryError(f"JetStream publish to {subject} failed: {e!r}") from e
        return not bool(ack.duplicate)

    async def subscribe(
        self, subject: str, handler: base.Handler, queue: str = "", *, pending_bytes: int | None = None
    ) -> base.Subscription:
        """``pending_bytes``: the backlog past which nats-py drops messages (default nats-py's, 128 MiB);
        drops are counted in ``dropped`` and on the subscription."""
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
            sub = await self.nc.subscribe(subject, queue=queue, cb=deliver, pending_bytes_limit=limit)
        except _TEMPORARY as e:
            raise errors.TemporaryError(f"subscribe {subject} failed: {e!r}") from e
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

    async def close(self) -> None:
        if self.nc.is_closed:
            return
        try:
            await self.nc.drain()
        except (TimeoutError, nats.errors.Error, OSError):
            await self.nc.close()
