"""Forwarding the incident feed to an HTTP receiver, at-least-once: ``healer forward``.

A durable pull consumer (explicit acks, one event in flight) hands events over in stream order. Each is
POSTed in a CloudEvents HTTP content mode (structured by default, or binary) and acknowledged only once
the receiver answered 2xx; while the receiver is down or answers 5xx/408/429 the event is retried with
exponential back-off (forever by default) and kept alive with in-progress acks, so nothing is lost and
nothing overtakes it. A killed forwarder's event is redelivered by JetStream after ``ack_wait_s``; a
stopped one hands it back at once. Receivers deduplicate on the event ``id``, which a redelivery repeats
(in structured mode the body is the stored bytes).

An answer that will never change (another 4xx) must not block the feed forever: the event is logged,
counted, written to the dead-letter file if there is one, and acknowledged. So is anything in the stream
that is not a CloudEvent.
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Literal

import orjson
import prometheus_client as prom
import structlog
import tenacity

from healer import buildinfo, config, errors, tasks
from healer.bus import base, subjects
from healer.feed import envelope, webhook
from healer.schemas import codec

log = structlog.get_logger(__name__)

ACK_TIMEOUT_S = 5.0
"""How long to wait for JetStream to confirm an ack (unconfirmed: maybe a duplicate later, never a loss)."""

Post = Callable[[str, bytes, Mapping[str, str], float], Awaitable[webhook.Delivery]]
Render = Callable[[envelope.Item], "webhook.Message | None"]
"""Turns a decoded event into the HTTP message to POST, or ``None`` to acknowledge it without sending.
Called again before every retry (a message may carry times that must be fresh when it is sent), so it
must give the same answer for the same event."""


def check_url(url: str) -> None:
    """Refuse, before anything starts, a receiver URL urllib could not POST to."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise errors.PermanentError(f"receiver URL must be http:// or https://, not {url!r}")


class ForwardMetrics:
    """The forwarder's Prometheus metrics, on a registry of its own."""

    def __init__(self, registry: prom.CollectorRegistry | None = None) -> None:
        self.registry = registry or prom.CollectorRegistry()
        r = self.registry
        self.delivered = prom.Counter(
            "healer_forward_delivered_total", "events the receiver accepted (2xx)", registry=r
        )
        self.retried = prom.Counter(
            "healer_forward_retried_total", "failed attempts that will be retried", registry=r
        )
        self.refused = prom.Counter(
            "healer_forward_refused_total", "events the receiver refused for good (4xx)", registry=r
        )
        self.malformed = prom.Counter(
            "healer_forward_malformed_total",
            "stream messages that are not CloudEvents",
            ["reason"],
            registry=r,
        )
        self.skipped = prom.Counter(
            "healer_forward_skipped_total", "events this receiver does not take (acked, not sent)", registry=r
        )
        self.redelivered = prom.Counter(
            "healer_forward_redelivered_total", "events JetStream delivered more than once", registry=r
        )
        self.backlog = prom.Gauge(
            "healer_forward_backlog", "events in the stream not yet handed to this forwarder", registry=r
        )
        self.last_delivered_ts = prom.Gauge(
            "healer_forward_last_delivered_timestamp_seconds", "when the last event was accepted", registry=r
        )
        self.task_failures = tasks.failures_counter("healer_forward", r)
        """The forwarder's own tasks that raised (``tasks.Scheduler``; a give-up ends the run too)."""
        self.build_info = buildinfo.register(r, "forwarder")
        for reason in codec.DECODE_REASONS:  # zeros, not "No data", while nothing is malformed
            self.malformed.labels(reason)


class Forwarder:
    def __init__(
        self,
        bus: base.Bus,
        subj: subjects.Subjects,
        url: str,
        settings: config.FeedSettings,
        *,
        dead_letter: pathlib.Path | None = None,
        headers: Mapping[str, str] | None = None,
        start: Literal["all", "new"] = "all",
        metrics: ForwardMetrics | None = None,
        post: Post = webhook.post,
        content_mode: webhook.ContentMode = "structured",
        render: Render | None = None,
    ) -> None:
        check_url(url)
        self.bus = bus
        self.subj = subj
        self.url = url
        self.settings = settings
        self.dead_letter = dead_letter
        self.extra_headers = dict(headers or {})
        self.start = start
        self.metrics = metrics or ForwardMetrics()
        self.post = post
        self.content_mode = content_mode
        self.render: Render = render or self._render_cloudevent
        self.log = log.bind(durable=settings.durable)
        self.consumer: base.PullConsumer | None = None
        """The durable consumer, once ``ensure_consumer`` has made it."""

    @property
    def stream(self) -> str:
        return self.subj.stream_incidents

    async def ensure_consumer(self) -> None:
        """Create the durable consumer, or bring an existing one's ack settings up to date (``NotFound``
        when the stream does not exist)."""
        s = self.settings
        consumer = self.bus.pull_consumer(
            self.stream, self.subj.all_incidents, durable=s.durable, ack_wait_s=s.ack_wait_s,
            max_ack_pending=1, start=self.start,
            description="healer forward: incident feed to an HTTP receiver",
        )  # fmt: skip
        await consumer.ensure()
        self.consumer = consumer

    async def run(self, stop: asyncio.Event) -> None:
        """Forward until ``stop`` is set; raises ``PermanentError`` if it cannot go on."""
        jobs = tasks.Scheduler("forward", self.metrics.task_failures, log=self.log)
        loop_task = jobs.spawn("loop", self._loop(), task_name="healer-forward")
        stop_task = jobs.spawn("stop", stop.wait())
        try:
            await asyncio.wait({loop_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            await jobs.close()
            await self._unbind()
        if not loop_task.cancelled() and (failed := loop_task.exception()) is not None:
            raise failed  # logged and counted when it ended; it is this run's failure too

    async def _loop(self) -> None:
        ready = False
        failures = 0
        while True:
            try:
                if not ready:
                    await self._unbind()
                    await self.ensure_consumer()
                    ready = True
                assert self.consumer is not None
                msgs = await self.consumer.fetch(1, timeout=self.settings.fetch_timeout_s)
            except errors.HealerError as e:
                # NATS away, the stream not provisioned yet, the consumer deleted: wait, then set up again.
                failures += 1
                self.log.warning("forward.fetch_failed", error=repr(e), ready=ready, failures=failures)
                ready = ready and not isinstance(e, base.NotFound)
                s = self.settings
                await asyncio.sleep(
                    min(s.retry_initial_delay_s * 2 ** min(failures, 16), s.retry_max_delay_s)
                )
                continue
            if not msgs:
                continue
            failures = 0
            for msg in msgs:
                await self._handle(msg)

    async def _unbind(self) -> None:
        consumer, self.consumer = self.consumer, None
        if consumer is not None:
            await consumer.close()

    async def _handle(self, msg: base.StreamMsg) -> None:
        bound = self.log.bind(seq=msg.seq, subject=msg.subject)
        if msg.delivered > 1:
            self.metrics.redelivered.inc()
        self.metrics.backlog.set(msg.pending)
        keepalive = asyncio.create_task(self._keep_alive(msg))
        try:
            try:
                item = envelope.classify(msg.data, msg.seq)
            except errors.DecodeError as e:
                self.metrics.malformed.labels(e.reason).inc()
                bound.warning("forward.malformed", reason=e.reason, detail=e.detail)
                self._write_dead_letter(msg, None, None, f"malformed: {e}")
                await self._ack(msg, bound)
                return
            bound = bound.bind(event_id=item.envelope.id, type=item.envelope.type)
            out = self.render(item)
            if out is None:
                self.metrics.skipped.inc()
                bound.debug("forward.skipped")
                await self._ack(msg, bound)
                return
            try:
                delivery = await self._deliver(item, bound)
            except webhook.Refused as e:
                self.metrics.refused.inc()
                bound.error("forward.refused", status=e.status, body=e.body[:200])
                self._write_dead_letter(msg, item.envelope.id, e.status, str(e))
                await self._ack(msg, bound)
                return
            except errors.TemporaryError as e:
                raise errors.PermanentError(
                    f"gave up on event {item.envelope.id} after {self.settings.retry_attempts} attempts "
                    f"(left unacknowledged): {e}"
                ) from e
            self.metrics.delivered.inc()
            self.metrics.last_delivered_ts.set(time.time())
            bound.info("forward.delivered", status=delivery.status, elapsed_s=round(delivery.elapsed_s, 4))
            await self._ack(msg, bound)
        except asyncio.CancelledError:
            # Stopping: hand the event back now rather than after ack_wait (a redelivery repeats its id).
            with contextlib.suppress(errors.HealerError):
                await msg.nak()
            raise
        finally:
            keepalive.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keepalive

    async def _keep_alive(self, msg: base.StreamMsg) -> None:
        """While an event is being delivered (and retried), keep JetStream from handing it out again."""
        interval_s = self.settings.ack_wait_s / 3
        while True:
            await asyncio.sleep(interval_s)
            with contextlib.suppress(errors.HealerError):
                await msg.in_progress()

    def _render_cloudevent(self, item: envelope.Item) -> webhook.Message:
        return webhook.message(item.raw, self.content_mode, self.extra_headers)

    async def _deliver(
        self, item: envelope.Item, bound: structlog.typing.FilteringBoundLogger
    ) -> webhook.Delivery:
        s = self.settings
        backoff = tenacity.wait_exponential(multiplier=s.retry_initial_delay_s, max=s.retry_max_delay_s)

        def wait(state: tenacity.RetryCallState) -> float:
            delay = float(backoff(state))
            exc = state.outcome.exception() if state.outcome else None
            if isinstance(exc, errors.TemporaryError) and exc.delay > delay:
                delay = min(exc.delay, s.retry_max_delay_s)
            return delay

        def before_sleep(state: tenacity.RetryCallState) -> None:
            self.metrics.retried.inc()
            exc = state.outcome.exception() if state.outcome else None
            bound.warning(
                "forward.retry",
                attempt=state.attempt_number,
                error=str(exc),
                delay_s=round(state.next_action.sleep, 3) if state.next_action else None,
            )

        retrying = tenacity.AsyncRetrying(
            retry=tenacity.retry_if_exception_type(errors.TemporaryError),
            wait=wait,
            stop=tenacity.stop_after_attempt(s.retry_attempts) if s.retry_attempts else tenacity.stop_never,
            before_sleep=before_sleep,
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                out = self.render(item)
                if out is None:
                    raise AssertionError("render skipped an event it rendered before")
                return await self.post(self.url, out.body, out.headers, s.http_timeout_s)
        raise AssertionError("unreachable: tenacity either returns or raises")

    async def _ack(self, msg: base.StreamMsg, bound: structlog.typing.FilteringBoundLogger) -> None:
        try:
            await msg.ack(timeout=ACK_TIMEOUT_S)
        except errors.HealerError as e:
            # The receiver has it; JetStream will send it again and the receiver dedups on the id.
            bound.warning("forward.ack_failed", error=repr(e))

    def _write_dead_letter(
        self, msg: base.StreamMsg, event_id: str | None, status: int | None, reason: str
    ) -> None:
        if self.dead_letter is None:
            return
        try:
            event: object = orjson.loads(msg.data)
        except orjson.JSONDecodeError:
            event = msg.data.decode("utf-8", "replace")
        record = {
            "at": datetime.now(tz=UTC).isoformat(),
            "stream_seq": msg.seq,
            "subject": msg.subject,
            "id": event_id,
            "status": status,
            "reason": reason,
            "event": event,
        }
        try:
            with self.dead_letter.open("ab") as f:
                f.write(orjson.dumps(record) + b"\n")
                f.flush()
        except OSError as e:
            raise errors.PermanentError(f"cannot write dead-letter file {self.dead_letter}: {e}") from e
