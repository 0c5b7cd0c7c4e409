"""The Bus Protocol: the few things healer asks of NATS, so the same code runs on the in-memory bus
in unit tests and on a real nats-server everywhere else.

- ``publish``: core NATS, fire and forget (telemetry frames);
- ``publish_durable``: JetStream publish with ``Nats-Msg-Id`` (events, incidents); returns once the
  stream has stored it (``True``) or recognised it as a duplicate (``False``); raises
  ``errors.TemporaryError`` when it could not be stored;
- ``subscribe`` (optionally in a queue group) with an async handler, or ``subscribe_batches`` with one
  that takes the messages waiting several at a time; ``request`` / ``Msg.respond`` for commands;
- ``key_value``: a key-value bucket (JetStream KV on NATS) with one revision sequence per bucket and
  compare-and-set (``create`` only if absent, ``update`` only at a given revision; ``KeyConflict``
  otherwise);
- ``pull_consumer``: a durable consumer of a stream with explicit acks. A fetched ``StreamMsg`` is
  acknowledged (``ack``), handed back (``nak``, optionally after a delay), kept (``in_progress``) or
  dropped for good (``term``); one neither acknowledged nor kept is delivered again after the ack wait;
- ``replay``: a stream read in order from a start (everything, only what is new, or a time), for readers
  that acknowledge nothing and leave nothing behind;
- ``storage``: how full the store and each named stream are (``StorageReport``), and in one line why
  JetStream would refuse writes, if it would.

Failures are ``errors.TemporaryError`` (try again) or ``errors.PermanentError`` (``NotFound`` for a stream,
consumer or bucket that is not there), never a client library's own: only ``healer/bus/`` imports nats-py.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Awaitable, Callable
from typing import Literal, Protocol

from healer import errors


@dataclasses.dataclass(slots=True)
class Msg:
    subject: str
    data: bytes
    reply: str = ""
    headers: dict[str, str] | None = None
    _responder: Callable[[str, bytes], Awaitable[None]] | None = dataclasses.field(default=None, repr=False)

    async def respond(self, data: bytes) -> None:
        """Answer a request; a message without a reply subject cannot be answered (ValueError)."""
        if not self.reply or self._responder is None:
            raise ValueError(f"message on {self.subject} has no reply subject")
        await self._responder(self.reply, data)


Handler = Callable[[Msg], Awaitable[None]]
BatchHandler = Callable[[list[Msg]], Awaitable[None]]
"""Takes the messages waiting on a subscription, several at a time (``Bus.subscribe_batches``)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Fairness:
    """A subscription's backlog fair by source (healer/bus/fair.py), for a subject where one source may
    flood: ``source(subject, data)`` names a message's source as it is read off the connection, or
    returns None to drop it there and then (it has counted why: a message certainly bad, another
    shard's), before it queues. Each source keeps at most ``per_source`` messages waiting, the backlog
    at most ``max_bytes`` (payload plus a per-message overhead); what is shed counts as dropped on the
    subscription (``Subscription.dropped``), and the handler takes them round-robin over sources.

    ``vet(subject, data)``, when set, judges a message whose source already has ``per_source`` waiting,
    before it may push the oldest out: one it refuses is dropped there (it has tallied why), so garbage
    on a source's own subject can never crowd out that source's real messages. It is asked only under
    that pressure, so a source whose queue has room pays nothing for it (the in-memory bus, whose
    queue is first-in first-out, never asks)."""

    source: Callable[[str, bytes], str | None]
    per_source: int = 4
    max_bytes: int = 128 * 2**20
    vet: Callable[[str, bytes], bool] | None = None


class Subscription(Protocol):
    async def unsubscribe(self) -> None: ...

    @property
    def pending(self) -> int:
        """Messages received and not yet handled (the subscriber's backlog)."""

    @property
    def dropped(self) -> int:
        """Messages the client dropped because the backlog was full (a slow consumer)."""


class NotFound(errors.PermanentError):
    """A stream, consumer or key-value bucket that does not exist (provisioning makes them)."""


class KeyConflict(errors.HealerError):
    """Compare-and-set lost: the key exists (``create``) or moved past the revision (``update``)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Entry:
    key: str
    value: bytes
    revision: int
    """The bucket's sequence number of the write (grows with every write to the bucket)."""


class KeyValue(Protocol):
    """One key-value bucket. Every write returns the new revision."""

    async def get(self, key: str) -> Entry | None:
        """The key's newest value; None when it does not exist or was deleted."""

    async def put(self, key: str, value: bytes) -> int: ...

    async def create(self, key: str, value: bytes) -> int:
        """Write only if the key does not exist (or was deleted); ``KeyConflict`` otherwise."""

    async def update(self, key: str, value: bytes, last: int) -> int:
        """Write only if the key is still at revision ``last``; ``KeyConflict`` otherwise."""

    async def delete(self, key: str) -> None: ...

    async def keys(self, prefix: str = "") -> list[str]:
        """Every key that exists and starts with ``prefix`` (deleted keys are not listed)."""


class Acker(Protocol):
    """How a bus settles one delivery of a stream message (``StreamMsg`` calls it)."""

    async def ack(self, timeout: float | None) -> None:
        """``timeout``: wait that long for the server to confirm; ``None``: do not wait."""

    async def nak(self, delay: float | None) -> None: ...

    async def in_progress(self) -> None: ...

    async def term(self) -> None: ...


@dataclasses.dataclass(slots=True)
class StreamMsg:
    """One delivery of a message stored in a stream.

    ``ack``, ``nak`` and ``term`` settle it, once: a second raises ``PermanentError``; ``in_progress`` may
    repeat. A message from a ``replay`` acknowledges nothing (``PermanentError``). Failures to reach the
    server are ``TemporaryError``: JetStream then delivers the message again after the ack wait."""

    subject: str
    data: bytes
    seq: int
    """The stream sequence number."""
    delivered: int = 1
    """How many times it has been delivered (1 the first time)."""
    pending: int = 0
    """Messages after it that the consumer has not delivered yet."""
    _acker: Acker | None = dataclasses.field(default=None, repr=False)
    _settled: bool = dataclasses.field(default=False, repr=False)

    def _settle(self) -> Acker:
        acker = self._ready()
        if self._settled:
            raise errors.PermanentError(f"message {self.seq} on {self.subject} was already acknowledged")
        self._settled = True
        return acker

    def _ready(self) -> Acker:
        if self._acker is None:
            raise errors.PermanentError(f"message {self.seq} on {self.subject} takes no acknowledgement")
        return self._acker

    async def ack(self, timeout: float | None = None) -> None:
        """Acknowledge; with ``timeout``, wait that long for the server to confirm it."""
        await self._settle().ack(timeout)

    async def nak(self, delay: float | None = None) -> None:
        """Hand it back: delivered again at once, or after ``delay`` seconds."""
        await self._settle().nak(delay)

    async def in_progress(self) -> None:
        """Still being worked on: the ack wait starts again."""
        await self._ready().in_progress()

    async def term(self) -> None:
        """Never deliver it again."""
        await self._settle().term()


class PullConsumer(Protocol):
    """A durable consumer: made (or its ack settings brought up to date) by ``ensure`` or the first
    ``fetch``, and again after a fetch that failed (it may have been deleted)."""

    async def ensure(self) -> None:
        """Make the consumer now (``NotFound`` when the stream does not exist); ``fetch`` does it too."""

    async def fetch(self, batch: int, timeout: float) -> list[StreamMsg]:
        """Up to ``batch`` messages; ``[]`` when none came within ``timeout``."""

    async def close(self) -> None:
        """Stop pulling; the consumer and what it has not acknowledged stay on the server."""


Start = Literal["all", "new"] | datetime.datetime
"""Where a consumer or a replay starts: the whole stream, only what is stored from now, or a time."""


class Replay(Protocol):
    """A stream read in order (an ephemeral consumer, gone when closed)."""

    @property
    def backlog(self) -> int:
        """Messages matching the replay that the stream held when it began."""

    async def next(self, timeout: float) -> StreamMsg | None:
        """The next message; None when none came within ``timeout``."""

    async def close(self) -> None: ...


@dataclasses.dataclass(frozen=True, slots=True)
class StreamUsage:
    name: str
    bytes: int
    max_bytes: int | None
    """The stream's byte limit, which the server reserves for it; None: it has none (it takes what is
    left of the store, and can fill it)."""
    messages: int

    @property
    def full(self) -> float | None:
        """Fraction of its byte limit in use; None without a limit."""
        return self.bytes / self.max_bytes if self.max_bytes else None


@dataclasses.dataclass(frozen=True, slots=True)
class StorageReport:
    """The account's file storage and healer's streams (KV buckets are streams ``KV_<bucket>``)."""

    used_bytes: int
    limit_bytes: int | None
    """The account's storage limit; None where the account has none (then the server's store is it)."""
    streams: tuple[StreamUsage, ...]
    missing: tuple[str, ...] = ()
    """Streams asked about that do not exist."""

    @property
    def reserved_bytes(self) -> int:
        return sum(s.max_bytes or 0 for s in self.streams)

    def problem(self) -> str | None:
        """One line, when writes are refused or about to be; None when storage is fine."""
        unlimited = [s.name for s in self.streams if not s.max_bytes]
        if self.limit_bytes is not None and self.used_bytes >= self.limit_bytes:
            return f"JetStream store full: {self.used_bytes} of {self.limit_bytes} bytes in use"
        if unlimited:
            return (
                f"{', '.join(unlimited)} without a byte limit: it can fill the store and stop healing; "
                "run `healer nats provision`"
            )
        if self.missing:
            return f"missing: {', '.join(self.missing)}; run `healer nats provision`"
        return None


class Bus(Protocol):
    @property
    def connected(self) -> bool:
        """True while the connection is up (the in-memory bus can be switched off in tests)."""

    @property
    def disconnects(self) -> int:
        """Times the connection was lost since it was made."""

    async def sibling(self, suffix: str) -> Bus:
        """A second connection to the same servers with the same identity, for traffic that must not
        queue behind this one's (the controller's telemetry); a bus that has none to make: itself."""

    async def publish(self, subject: str, data: bytes, headers: dict[str, str] | None = None) -> None: ...

    async def publish_durable(self, subject: str, data: bytes, msg_id: str, timeout: float = 5.0) -> bool: ...

    async def subscribe(
        self,
        subject: str,
        handler: Handler,
        queue: str = "",
        *,
        pending_bytes: int | None = None,
        fair: Fairness | None = None,
    ) -> Subscription: ...

    async def subscribe_batches(
        self, subject: str, handler: BatchHandler, *, fair: Fairness, max_batch: int = 64
    ) -> Subscription:
        """``subscribe`` for a subject that may flood (telemetry): the handler takes the messages
        waiting, fair by source as ``fair`` says, up to ``max_batch`` per call, instead of one call per
        message (a call, a task switch and a wait per message cost more than decoding a frame). The
        loop yields between batches, so a flood never keeps it from the connection's other work."""
        ...

    async def request(self, subject: str, data: bytes, timeout: float = 2.0) -> Msg: ...

    async def flush(self, timeout: float = 2.0) -> None: ...

    async def key_value(self, bucket: str) -> KeyValue:
        """The bucket; it must exist (provisioning makes buckets): ``NotFound`` otherwise."""

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
    ) -> PullConsumer:
        """The durable consumer ``durable`` of ``stream``, filtered on ``subject``; ``start`` applies when
        it is made. Nothing is asked of the server until the first ``fetch``."""

    async def replay(self, stream: str, subject: str, start: Start = "all") -> Replay:
        """Read ``stream`` (only ``subject``) from ``start``; ``NotFound`` if there is no such stream."""

    async def storage(self, streams: list[str]) -> StorageReport:
        """How full the account's store and the named streams are."""

    async def close(self) -> None: ...
