"""MemoryBus: the Bus Protocol in one process, with real NATS subject semantics, for fast unit tests.

Wildcards behave as in NATS (``*`` one token, ``>`` one or more trailing tokens), queue groups deliver
each message to one member, each subscription delivers in order from its own task (as nats-py does), and
``publish_durable`` stores into in-memory streams with ``Nats-Msg-Id`` deduplication (core
subscribers still see the duplicate publish, exactly as with a real server). Streams have JetStream's
durable pull consumers (explicit acks, ``nak`` with a delay, redelivery after the ack wait, at most
``max_ack_pending`` unacknowledged) and ordered replays; key-value buckets have JetStream KV's revisions
and compare-and-set. ``connected`` can be switched off to rehearse an outage: then every call raises
``TemporaryError``. tests/bus/test_bus_contract.py holds both buses to the same semantics; the scenarios run
against a real nats-server in the integration tests too; this is a stand-in, not a replacement. The
streams, consumers, replays and buckets are memory_jetstream.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import uuid
from typing import Literal

import structlog

from healer import errors
from healer.bus import base, memory_jetstream, subjects

log = structlog.get_logger(__name__)


class _MemSub:
    def __init__(
        self,
        bus: MemoryBus,
        pattern: str,
        handler: base.Handler | None,
        queue: str,
        fair: base.Fairness | None = None,
        batches: tuple[base.BatchHandler, int] | None = None,
    ) -> None:
        self.bus = bus
        self.fair = fair
        self.pattern = pattern
        self.handler = handler
        self.queue = queue
        self.inbox: asyncio.Queue[base.Msg] = asyncio.Queue()
        run = self._run() if batches is None else self._run_batches(*batches)
        self.task = asyncio.get_running_loop().create_task(run, name=f"memsub:{pattern}")

    async def _run(self) -> None:
        assert self.handler is not None
        while True:
            msg = await self.inbox.get()
            try:
                await self.handler(msg)
            except Exception:
                log.exception("bus.handler_failed", subject=msg.subject)
            finally:
                self.inbox.task_done()

    async def _run_batches(self, handler: base.BatchHandler, most: int) -> None:
        while True:
            batch = [await self.inbox.get()]
            while len(batch) < most and not self.inbox.empty():
                batch.append(self.inbox.get_nowait())
            try:
                await handler(batch)
            except Exception:
                log.exception("bus.handler_failed", subject=batch[0].subject, messages=len(batch))
            finally:
                for _ in batch:
                    self.inbox.task_done()
            await asyncio.sleep(0)

    @property
    def pending(self) -> int:
        return self.inbox.qsize()

    @property
    def dropped(self) -> int:
        return 0  # the inbox is unbounded

    async def unsubscribe(self) -> None:
        self.bus._subs.discard(self)
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


class MemoryBus:
    def __init__(self) -> None:
        self._subs: set[_MemSub] = set()
        self._rr = itertools.count()
        self.streams: dict[str, memory_jetstream.MemoryStream] = {}
        self._connected = True
        self.published = 0
        self.buckets: dict[str, memory_jetstream.MemoryKeyValue] = {}
        self.disconnects = 0

    # -- test controls ---------------------------------------------------------------------------
    def add_stream(self, name: str, subjects: list[str]) -> memory_jetstream.MemoryStream:
        stream = memory_jetstream.MemoryStream(name=name, subjects=subjects)
        self.streams[name] = stream
        return stream

    def add_bucket(self, name: str) -> memory_jetstream.MemoryKeyValue:
        """Provision a key-value bucket (as ``healer nats provision`` does on a server)."""
        return self.buckets.setdefault(name, memory_jetstream.MemoryKeyValue(self, name))

    def delete_consumer(self, stream: str, durable: str) -> None:
        """Delete a durable consumer (as ``nats consumer rm`` does); its handles make it again."""
        self.stream(stream).consumers.pop(durable, None)

    def stream(self, name: str) -> memory_jetstream.MemoryStream:
        found = self.streams.get(name)
        if found is None:
            raise base.NotFound(f"stream {name} does not exist")
        return found

    def set_connected(self, up: bool) -> None:
        if self._connected and not up:
            self.disconnects += 1
        self._connected = up

    async def idle(self) -> None:
        """Wait until every subscription has handled everything delivered so far (and what that caused)."""
        while True:
            before = self.published
            await asyncio.gather(*(s.inbox.join() for s in list(self._subs)))
            if self.published == before:
                return

    # -- Bus Protocol ----------------------------------------------------------------------------
    @property
    def connected(self) -> bool:
        return self._connected

    async def storage(self, streams: list[str]) -> base.StorageReport:
        """Bytes held by each named stream (a bucket is ``KV_<name>``); the twin has no limits."""
        found, missing = [], []
        for name in streams:
            held: list[bytes]
            if name in self.streams:
                held = [m.data for m in self.streams[name].messages]
            elif name.startswith("KV_") and name[3:] in self.buckets:
                held = [e.value for e in self.buckets[name[3:]]._entries.values()]
            else:
                missing.append(name)
                continue
            found.append(base.StreamUsage(name, sum(len(d) for d in held), None, len(held)))
        return base.StorageReport(sum(u.bytes for u in found), None, tuple(found), tuple(missing))

    async def sibling(self, suffix: str) -> MemoryBus:
        """One process, one in-memory world: itself."""
        return self

    def _check(self, subject: str, *, wildcards: bool = False) -> None:
        if not self._connected:
            raise errors.TemporaryError("memory bus is disconnected")
        if not subjects.valid_subject(subject, wildcards=wildcards):
            raise errors.PermanentError(f"invalid subject {subject!r}")

    async def publish(self, subject: str, data: bytes, headers: dict[str, str] | None = None) -> None:
        self._check(subject)
        self._deliver(base.Msg(subject=subject, data=data, headers=headers))

    def _deliver(self, msg: base.Msg) -> None:
        self.published += 1
        groups: dict[str, list[_MemSub]] = {}
        for sub in list(self._subs):
            if not subjects.subject_matches(sub.pattern, msg.subject):
                continue
            if sub.fair is not None and sub.fair.source(msg.subject, msg.data) is None:
                continue  # screened out before it queues
            if sub.queue:
                groups.setdefault(sub.queue, []).append(sub)
            else:
                sub.inbox.put_nowait(self._copy(msg))
        for members in groups.values():
            members.sort(key=id)
            members[next(self._rr) % len(members)].inbox.put_nowait(self._copy(msg))

    def _copy(self, msg: base.Msg) -> base.Msg:
        return base.Msg(
            subject=msg.subject,
            data=msg.data,
            reply=msg.reply,
            headers=dict(msg.headers) if msg.headers else None,
            _responder=self._respond,
        )

    async def _respond(self, reply: str, data: bytes) -> None:
        await self.publish(reply, data)

    async def publish_durable(self, subject: str, data: bytes, msg_id: str, timeout: float = 5.0) -> bool:
        self._check(subject)
        stream = next(
            (
                s
                for s in self.streams.values()
                if any(subjects.subject_matches(p, subject) for p in s.subjects)
            ),
            None,
        )
        if stream is None:
            raise errors.TemporaryError(f"no stream captures {subject} (nats: no responders)")
        # As in NATS: core subscribers see every publish; only the stream drops the duplicate.
        self._deliver(base.Msg(subject=subject, data=data, headers={"Nats-Msg-Id": msg_id}))
        if msg_id in stream.seen_ids:
            return False
        stream.seen_ids.add(msg_id)
        stream.append(subject, data, msg_id)
        return True

    async def subscribe(
        self,
        subject: str,
        handler: base.Handler,
        queue: str = "",
        *,
        pending_bytes: int | None = None,
        fair: base.Fairness | None = None,
    ) -> base.Subscription:
        """``pending_bytes`` is accepted for parity with NatsBus and ignored: the inbox is unbounded.
        ``fair``: its ``source`` screens each message (None drops it before it queues), as on NatsBus;
        the inbox stays first-in first-out."""
        self._check(subject, wildcards=True)
        sub = _MemSub(self, subject, handler, queue, fair)
        self._subs.add(sub)
        return sub

    async def subscribe_batches(
        self, subject: str, handler: base.BatchHandler, *, fair: base.Fairness, max_batch: int = 64
    ) -> base.Subscription:
        """As on NatsBus: the handler takes up to ``max_batch`` waiting messages per call (the inbox
        stays first-in first-out; ``fair.source`` screens each message as ``subscribe`` does)."""
        self._check(subject, wildcards=True)
        sub = _MemSub(self, subject, None, "", fair, batches=(handler, max_batch))
        self._subs.add(sub)
        return sub

    async def request(self, subject: str, data: bytes, timeout: float = 2.0) -> base.Msg:
        self._check(subject)
        inbox = f"_INBOX.{uuid.uuid4().hex}"
        answer: asyncio.Future[base.Msg] = asyncio.get_running_loop().create_future()

        async def on_reply(msg: base.Msg) -> None:
            if not answer.done():
                answer.set_result(msg)

        sub = await self.subscribe(inbox, on_reply)
        try:
            if not any(subjects.subject_matches(s.pattern, subject) for s in self._subs):
                raise errors.TemporaryError(f"no responders on {subject}")
            self._deliver(base.Msg(subject=subject, data=data, reply=inbox))
            try:
                return await asyncio.wait_for(answer, timeout)
            except TimeoutError as e:
                raise errors.TemporaryError(f"request to {subject} timed out after {timeout}s") from e
        finally:
            await sub.unsubscribe()

    async def flush(self, timeout: float = 2.0) -> None:
        await self.idle()

    async def key_value(self, bucket: str) -> base.KeyValue:
        if not self._connected:
            raise errors.TemporaryError("memory bus is disconnected")
        found = self.buckets.get(bucket)
        if found is None:
            raise base.NotFound(f"no KV bucket {bucket}: provision it first (MemoryBus.add_bucket)")
        return found

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
        return memory_jetstream.MemoryPullConsumer(
            self, stream, subject, durable=durable, ack_wait_s=ack_wait_s,
            max_ack_pending=max_ack_pending, start=start,
        )  # fmt: skip

    async def replay(self, stream: str, subject: str, start: base.Start = "all") -> base.Replay:
        if not self._connected:
            raise errors.TemporaryError("memory bus is disconnected")
        found = self.stream(stream)
        if start == "all":
            after = 0
        elif start == "new":
            after = len(found.messages)
        else:
            at = start.timestamp()
            after = next((m.seq - 1 for m in found.messages if m.ts >= at), len(found.messages))
        return memory_jetstream.MemoryReplay(self, found, subject, after)

    async def close(self) -> None:
        for sub in list(self._subs):
            await sub.unsubscribe()
