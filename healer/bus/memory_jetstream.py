"""JetStream in one process, for MemoryBus: streams with durable pull consumers (explicit acks, ``nak``
with a delay, redelivery after the ack wait, at most ``max_ack_pending`` unacknowledged), ordered
replays, and key-value buckets with revisions and compare-and-set."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import re
import time
from typing import TYPE_CHECKING, Literal

import structlog

from healer import errors
from healer.bus import base, subjects

if TYPE_CHECKING:
    from healer.bus.memory import MemoryBus

log = structlog.get_logger(__name__)

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
        return [m for m in self.messages[after:] if subjects.subject_matches(pattern, m.subject)]


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

    async def keys(self, prefix: str = "") -> list[str]:
        self._check()
        return [k for k in self._entries if k.startswith(prefix)]


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
