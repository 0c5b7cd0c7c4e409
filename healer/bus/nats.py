"""NatsBus: the Bus Protocol over nats-py, with JetStream for what must not be lost.

The first connection is retried with tenacity (a node agent often starts before the network or the NATS
cluster is up); once connected, nats-py reconnects by itself forever and this object reports the state
through ``connected`` and log events. nats-py errors are translated into healer's vocabulary in the bus
package and nowhere else (``nats_errors``): timeouts, no responders, a closed or reconnecting connection
→ ``TemporaryError``. The first connect and the connection's callbacks are ``nats_connect``'s; JetStream's
KV, consumers and replays ``nats_jetstream``'s; the fair backlog ``nats_pending``'s.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import nats
import nats.errors
import nats.js.errors
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg as NatsMsg
from nats.js import api as js_api

from healer import config, errors
from healer.bus import base, nats_connect, nats_errors, nats_jetstream, nats_pending

log = structlog.get_logger(__name__)
SLOW_CONSUMER_LOG_S = 10.0
DEFAULT_PENDING_BYTES = 128 * 2**20
"""nats-py's own default backlog per subscription."""
YIELD_EVERY = 64
"""A subscription handler lets other tasks run after this many messages in a row."""


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
        callbacks = nats_connect.Callbacks(name)
        nc = await nats_connect.first_connect(url, name, ns, rs, callbacks, _tls_context(ns))
        nc.options["max_reconnect_attempts"] = -1
        bus = cls(nc)
        bus.js = nc.jetstream(timeout=ns.request_timeout_s)
        bus._connected_with = (url, name, ns, rs)
        callbacks.bus = bus
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
        except nats_errors.TEMPORARY as e:
            raise errors.TemporaryError(f"publish to {subject} failed: {e!r}") from e

    async def publish_durable(self, subject: str, data: bytes, msg_id: str, timeout: float = 5.0) -> bool:
        try:
            ack = await self.js.publish(subject, data, timeout=timeout, headers={"Nats-Msg-Id": msg_id})
        except nats.js.errors.APIError as e:
            if e.code is not None and e.code >= 500:
                raise errors.TemporaryError(
                    f"JetStream publish to {subject}: {nats_errors.describe(e)}"
                ) from e
            raise errors.PermanentError(f"JetStream refused {subject}: {nats_errors.describe(e)}") from e
        except nats_errors.TEMPORARY as e:
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
        except nats_errors.TEMPORARY as e:
            raise errors.TemporaryError(f"subscribe {subject} failed: {e!r}") from e
        if fair is not None:
            nats_pending.FairPending.install(sub, fair, self)
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

        async def run(queue: nats_pending.FairPending) -> None:
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
        except nats_errors.TEMPORARY as e:
            raise errors.TemporaryError(f"subscribe {subject} failed: {e!r}") from e
        nats_pending.FairPending.install(sub, fair, self, batches=run)
        return _Sub(sub, self)

    async def _respond(self, reply: str, data: bytes) -> None:
        await self.publish(reply, data)

    async def request(self, subject: str, data: bytes, timeout: float = 2.0) -> base.Msg:
        try:
            m = await self.nc.request(subject, data, timeout=timeout)
        except nats_errors.TEMPORARY as e:
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
        except nats_errors.TEMPORARY as e:
            raise errors.TemporaryError(f"flush failed: {e!r}") from e

    async def last_message(self, stream: str, subject: str) -> tuple[int, bytes] | None:
        """(sequence, data) of the newest message on ``subject`` in ``stream``, read from the stream
        leader (``$JS.API.STREAM.MSG.GET``); None when there is none or it is a KV delete marker."""
        try:
            raw = await self.js.get_msg(stream, subject=subject)
        except nats.js.errors.NotFoundError:
            return None
        except (nats.errors.Error, OSError, TimeoutError) as e:
            if nats_errors.is_temporary(e):
                raise errors.TemporaryError(f"read {subject} from {stream}: {e!r}") from e
            raise errors.PermanentError(f"read {subject} from {stream}: {e!r}") from e
        if raw.headers and raw.headers.get("KV-Operation") in ("DEL", "PURGE"):
            return None
        return int(raw.seq or 0), bytes(raw.data or b"")

    async def key_value(self, bucket: str) -> base.KeyValue:
        try:
            return nats_jetstream.NatsKeyValue(await self.js.key_value(bucket), self.js, bucket)
        except nats.js.errors.BucketNotFoundError as e:
            raise base.NotFound(
                f"no KV bucket {bucket}: run `healer nats provision` (or start the controller) first, or "
                "check --prefix / nats.prefix"
            ) from e
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as e:
            raise errors.PermanentError(
                f"JetStream not available (is it enabled on the server?): {e!r}"
            ) from e
        except nats_errors.FAILURES as e:
            raise nats_errors.translate(f"KV bucket {bucket}", e) from e

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
        return nats_jetstream.PullConsumer(
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
        except nats_errors.FAILURES as e:
            raise nats_errors.translate(f"replay {stream}", e) from e
        try:
            info = await sub.consumer_info()
        except nats_errors.FAILURES as e:
            with contextlib.suppress(nats.errors.Error, OSError):
                await sub.unsubscribe()
            raise nats_errors.translate(f"replay {stream}", e) from e
        delivered = info.delivered.consumer_seq if info.delivered else 0
        return nats_jetstream.Replay(sub, int(delivered or 0) + int(info.num_pending or 0))

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
        except nats_errors.FAILURES as e:
            raise nats_errors.translate("JetStream storage", e) from e
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
