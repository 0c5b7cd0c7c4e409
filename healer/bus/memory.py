"""MemoryBus: the Bus Protocol in one process, with real NATS subject semantics, for fast unit tests.

Wildcards behave as in NATS (``*`` one token, ``>`` one or more trailing tokens), queue groups deliver
each message to one member, each subscription delivers in order from its own task (as nats-py does), and
``publish_durable`` stores into in-memory streams with ``Nats-Msg-Id`` deduplication (core
subscribers still see the duplicate publish, exactly as with a real server). Streams have JetStream's
durable pull consumers (explicit acks, ``nak`` with a delay, redelivery after the ack wait, at most
``max_ack_pending`` unacknowledged) and ordered replays; key-value buckets have JetStream KV's revisions
and compare-and-set. ``connected`` can be switched off to rehearse an outage: then every call raises
``TemporaryError``. tests/bus/test_bus_contract.py holds both buses to the same semantics; the scenarios run
against a real nats-server in the integration tests too; this is a stand-in, not a replacement.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import math
import re
import time
import uuid
from typing import Literal

import structlog

from healer import errors
from healer.bus import base

log = structlog.get_logger(__name__)


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS matching of a concrete subject against a pattern with ``*`` and ``>``."""
    p_tokens = pattern.split(".")
    s_tokens = subject.split(".")
    for i, p in enumerate(p_tokens):
        if p == ">":
            return len(s_tokens) > i
        if i >= len(s_tokens):
            return False
        if p != "*" and p != s_tokens[i]:
            return False
    return len(p_tokens) == len(s_tokens)


def valid_subject(subject: str, *, wildcards: bool) -> bool:
    if not subject or subject != subject.strip() or " " in subject:
        return False
    tokens = subject.split(".")
    for i, t in enumerate(tokens):
        if not t:
            return False
        if t in ("*", ">"):
            if not wildcards or (t == ">" and i != len(tokens) - 1):
                return False
        elif "*" in t or ">" in t:
            return False
    return True


_KEY = re.compile(r"[-/_=.a-zA-Z0-9]+")


def valid_key(key: str) -> bool:
    """A key JetStream KV takes (nats-py's rule): letters, digits, ``-/_=.``, no dot first or last."""
    return bool(_KEY.fullmatch(key)) and not key.startswith(".") and not key.endswith(".")


@dataclasses.dataclass
class StoredMsg:
    seq: int
    subject: str
    data: bytes
    msg_id: str
    ts: float = dataclasses.field(default_factory=time.time)
    """When it was stored (unix seconds): a replay from a time starts at the first stored at or after it."""


@dataclasses.dataclass
class MemoryStream:
    name: str
    subjects: list[str]
    messages: list[StoredMsg] = dataclasses.field(default_factory=list)
    seen_ids: set[str] = dataclasses.field(default_factory=set)
    consumers: dict[str, ConsumerState] = dataclasses.field(default_factory=dict)
    waiters: set[asyncio.Event] = dataclasses.field(default_factory=set)
    """Set when something changes that a fetch or a replay may be waiting for."""

    def append(self, subject: str, data: bytes, msg_id: str) -> None:
        self.messages.append(StoredMsg(len(self.messages) + 1, subject, data, msg_id))
        self.wake()

    def wake(self) -> None:
        for event in self.waiters:
            event.set()

    def matching(self, pattern: str, after: int) -> list[StoredMsg]:
        """Stored messages on ``pattern`` with a sequence above ``after``, in order."""
        return [m for m in self.messages[after:] if subject_matches(pattern, m.subject)]


@dataclasses.dataclass
class InFlight:
    due: float
    """Loop time at which it is delivered again unless acknowledged (or kept in progress) before."""
    delivered: int


@dataclasses.dataclass
class ConsumerState:
    """A durable consumer of a ``MemoryStream``: what it has delivered and what is not acknowledged."""

    name: str
    subject: str
    ack_wait_s: float
    max_ack_pending: int
    delivered_up_to: int
    """The highest stream sequence delivered at least once."""
    in_flight: dict[int, InFlight] = dataclasses.field(default_factory=dict)


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


class MemoryKeyValue:
    """A key-value bucket in memory, with JetStream KV's semantics: one revision sequence per bucket,
    compare-and-set on create and update, a deleted key reads as absent and may be created again."""

    def __init__(self, bus: MemoryBus, name: str) -> None:
        self.bus = bus
        self.name = name
        self._entries: dict[str, base.Entry] = {}
        self._revision = 0

    def _check(self, key: str | None = None) -> None:
        if not self.bus.connected:
            raise errors.TemporaryError(f"KV {self.name}: memory bus is disconnected")
        if key is not None and not valid_key(key):
            raise errors.PermanentError(f"KV {self.name}: invalid key {key!r}")

    def _write(self, key: str, value: bytes) -> int:
        self._revision += 1
        self._entries[key] = base.Entry(key, bytes(value), self._revision)
        return self._revision

    async def get(self, key: str) -> base.Entry | None:
        self._check(key)
        return self._entries.get(key)

    async def put(self, key: str, value: bytes) -> int:
        self._check(key)
        return self._write(key, value)

    async def create(self, key: str, value: bytes) -> int:
        self._check(key)
        if key in self._entries:
            raise base.KeyConflict(f"{key} exists")
        return self._write(key, value)

    async def update(self, key: str, value: bytes, last: int) -> int:
        self._check(key)
        entry = self._entries.get(key)
        if entry is None or entry.revision != last:
            raise base.KeyConflict(f"{key} changed since revision {last}")
        return self._write(key, value)

    async def delete(self, key: str) -> None:
        self._check(key)
        self._revision += 1  # a delete marker takes a revision, as in JetStream
        self._entries.pop(key, None)

    async def keys(self) -> list[str]:
        self._check()
        return list(self._entries)


class _MemAcker:
    """Settles one delivery of a stored message on its consumer."""

    def __init__(self, consumer: MemoryPullConsumer, state: ConsumerState, seq: int) -> None:
        self.consumer = consumer
        self.state = state
        self.seq = seq

    def _check(self) -> InFlight | None:
        if not self.consumer.bus.connected:
            raise errors.TemporaryError("memory bus is disconnected")
        return self.state.in_flight.get(self.seq)

    async def ack(self, timeout: float | None) -> None:
        if self._check() is not None:
            del self.state.in_flight[self.seq]
            self.consumer.stream.wake()

    async def nak(self, delay: float | None) -> None:
        pending = self._check()
        if pending is not None:
            pending.due = asyncio.get_running_loop().time() + (delay or 0.0)
            self.consumer.stream.wake()

    async def in_progress(self) -> None:
        pending = self._check()
        if pending is not None:
            pending.due = asyncio.get_running_loop().time() + self.state.ack_wait_s

    async def term(self) -> None:
        await self.ack(None)


class MemoryPullConsumer:
    """``base.PullConsumer`` on a ``MemoryStream``: the durable state lives on the stream (shared by every
    handle with the same name, as on a server); a handle makes it, or updates its ack settings, on the
    first fetch and again after a failed one."""

    def __init__(
        self,
        bus: MemoryBus,
        stream: str,
        subject: str,
        *,
        durable: str,
        ack_wait_s: float,
        max_ack_pending: int,
        start: Literal["all", "new"],
    ) -> None:
        self.bus = bus
        self.stream_name = stream
        self.subject = subject
        self.durable = durable
        self.ack_wait_s = ack_wait_s
        self.max_ack_pending = max_ack_pending
        self.start = start
        self._state: ConsumerState | None = None

    @property
    def stream(self) -> MemoryStream:
        return self.bus.stream(self.stream_name)

    def _bind(self) -> ConsumerState:
        stream = self.stream
        state = stream.consumers.get(self.durable)
        if state is None:
            state = ConsumerState(
                self.durable, self.subject, self.ack_wait_s, self.max_ack_pending,
                delivered_up_to=len(stream.messages) if self.start == "new" else 0,
            )  # fmt: skip
            stream.consumers[self.durable] = state
        state.ack_wait_s = self.ack_wait_s
        state.max_ack_pending = self.max_ack_pending
        return state

    def _take(self, state: ConsumerState, batch: int, now: float) -> list[base.StreamMsg]:
        """Due redeliveries first (in stream order), then new messages while fewer than
        ``max_ack_pending`` are out; each with what is still undelivered after it (``pending``)."""
        stream = self.stream
        taken: list[base.StreamMsg] = []
        fresh = stream.matching(state.subject, state.delivered_up_to)

        def deliver(m: StoredMsg, delivered: int) -> None:
            acker = _MemAcker(self, state, m.seq)
            taken.append(base.StreamMsg(m.subject, m.data, m.seq, delivered, len(fresh), acker))

        for seq in sorted(s for s, p in state.in_flight.items() if p.due <= now)[:batch]:
            again = state.in_flight[seq]
            again.delivered += 1
            again.due = now + state.ack_wait_s
            deliver(stream.messages[seq - 1], again.delivered)
        while fresh and len(taken) < batch and len(state.in_flight) < state.max_ack_pending:
            m = fresh.pop(0)
            state.delivered_up_to = m.seq
            state.in_flight[m.seq] = InFlight(now + state.ack_wait_s, 1)
            deliver(m, 1)
        return taken

    async def ensure(self) -> None:
        self._ensure()

    def _ensure(self) -> ConsumerState:
        if not self.bus.connected:
            self._state = None
            raise errors.TemporaryError("memory bus is disconnected")
        state = self.stream.consumers.get(self.durable)
        if state is None or state is not self._state:
            state = self._state = self._bind()  # made again if it was deleted
        return state

    async def fetch(self, batch: int, timeout: float) -> list[base.StreamMsg]:
        loop = asyncio.get_running_loop()
        until = loop.time() + timeout
        woken = asyncio.Event()
        while True:
            state = self._ensure()
            stream = self.stream
            now = loop.time()
            msgs = self._take(state, batch, now)
            if msgs or now >= until:
                return msgs
            due = min((p.due for p in state.in_flight.values()), default=math.inf)
            woken.clear()
            stream.waiters.add(woken)
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woken.wait(), max(0.0, min(until, due) - now))
            finally:
                stream.waiters.discard(woken)

    async def close(self) -> None:
        self._state = None


class MemoryReplay:
    """``base.Replay`` on a ``MemoryStream``: in order from the start, then what is stored later."""

    def __init__(self, bus: MemoryBus, stream: MemoryStream, subject: str, after: int) -> None:
        self.bus = bus
        self.stream = stream
        self.subject = subject
        self.after = after
        self._backlog = len(stream.matching(subject, after))

    @property
    def backlog(self) -> int:
        return self._backlog

    async def next(self, timeout: float) -> base.StreamMsg | None:
        loop = asyncio.get_running_loop()
        until = loop.time() + timeout
        woken = asyncio.Event()
        while True:
            if not self.bus.connected:
                raise errors.TemporaryError("memory bus is disconnected")
            found = self.stream.matching(self.subject, self.after)
            if found:
                m = found[0]
                self.after = m.seq
                return base.StreamMsg(m.subject, m.data, m.seq, 1, len(found) - 1)
            now = loop.time()
            if now >= until:
                return None
            woken.clear()
            self.stream.waiters.add(woken)
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woken.wait(), until - now)
            finally:
                self.stream.waiters.discard(woken)

    async def close(self) -> None:
        self.after = len(self.stream.messages)


class MemoryBus:
    def __init__(self) -> None:
        self._subs: set[_MemSub] = set()
        self._rr = itertools.count()
        self.streams: dict[str, MemoryStream] = {}
        self._connected = True
        self.published = 0
        self.buckets: dict[str, MemoryKeyValue] = {}
        self.disconnects = 0

    # -- test controls ---------------------------------------------------------------------------
    def add_stream(self, name: str, subjects: list[str]) -> MemoryStream:
        stream = MemoryStream(name=name, subjects=subjects)
        self.streams[name] = stream
        return stream

    def add_bucket(self, name: str) -> MemoryKeyValue:
        """Provision a key-value bucket (as ``healer nats provision`` does on a server)."""
        return self.buckets.setdefault(name, MemoryKeyValue(self, name))

    def delete_consumer(self, stream: str, durable: str) -> None:
        """Delete a durable consumer (as ``nats consumer rm`` does); its handles make it again."""
        self.stream(stream).consumers.pop(durable, None)

    def stream(self, name: str) -> MemoryStream:
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
        if not valid_subject(subject, wildcards=wildcards):
            raise errors.PermanentError(f"invalid subject {subject!r}")

    async def publish(self, subject: str, data: bytes, headers: dict[str, str] | None = None) -> None:
        self._check(subject)
        self._deliver(base.Msg(subject=subject, data=data, headers=headers))

    def _deliver(self, msg: base.Msg) -> None:
        self.published += 1
        groups: dict[str, list[_MemSub]] = {}
        for sub in list(self._subs):
            if not subject_matches(sub.pattern, msg.subject):
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
            (s for s in self.streams.values() if any(subject_matches(p, subject) for p in s.subjects)), None
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
            if not any(subject_matches(s.pattern, subject) for s in self._subs):
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
        return MemoryPullConsumer(
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
        return MemoryReplay(self, found, subject, after)

    async def close(self) -> None:
        for sub in list(self._subs):
            await sub.unsubscribe()
