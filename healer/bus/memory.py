"""MemoryBus: the Bus Protocol in one process, with real NATS subject semantics, for fast unit tests.

Wildcards behave as in NATS (``*`` one token, ``>`` one or more trailing tokens), queue groups deliver
each message to one member, each subscription delivers in order from its own task (as nats-py does), and
``publish_durable`` stores into in-memory streams with ``Nats-Msg-Id`` deduplication (core
subscribers still see the duplicate publish, exactly as with a real server). ``connected`` can
be switched off to rehearse an outage: then every call raises ``TemporaryError``. The same scenarios run
against a real nats-server in the integration tests; this is a stand-in, not a replacement.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import uuid

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


@dataclasses.dataclass
class StoredMsg:
    seq: int
    subject: str
    data: bytes
    msg_id: str


@dataclasses.dataclass
class MemoryStream:
    name: str
    subjects: list[str]
    messages: list[StoredMsg] = dataclasses.field(default_factory=list)
    seen_ids: set[str] = dataclasses.field(default_factory=set)


class _MemSub:
    def __init__(self, bus: MemoryBus, pattern: str, handler: base.Handler, queue: str) -> None:
        self.bus = bus
        self.pattern = pattern
        self.handler = handler
        self.queue = queue
        self.inbox: asyncio.Queue[base.Msg] = asyncio.Queue()
        self.task = asyncio.get_running_loop().create_task(self._run(), name=f"memsub:{pattern}")

    async def _run(self) -> None:
        while True:
            msg = await self.inbox.get()
            try:
                await self.handler(msg)
            except Exception:
                log.exception("bus.handler_failed", subject=msg.subject)
            finally:
                self.inbox.task_done()

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
        self.streams: dict[str, MemoryStream] = {}
        self._connected = True
        self.published = 0

    # -- test controls ---------------------------------------------------------------------------
    def add_stream(self, name: str, subjects: list[str]) -> MemoryStream:
        stream = MemoryStream(name=name, subjects=subjects)
        self.streams[name] = stream
        return stream

    def set_connected(self, up: bool) -> None:
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
        stream.messages.append(StoredMsg(len(stream.messages) + 1, subject, data, msg_id))
        return True

    async def subscribe(
        self, subject: str, handler: base.Handler, queue: str = "", *, pending_bytes: int | None = None
    ) -> base.Subscription:
        """``pending_bytes`` is accepted for parity with NatsBus and ignored: the inbox is unbounded."""
        self._check(subject, wildcards=True)
        sub = _MemSub(self, subject, handler, queue)
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

    async def close(self) -> None:
        for sub in list(self._subs):
            await sub.unsubscribe()
