"""The Bus Protocol: the few things healer asks of NATS, so the same code runs on the in-memory bus
in unit tests and on a real nats-server everywhere else.

- ``publish``: core NATS, fire and forget (telemetry frames);
- ``publish_durable``: JetStream publish with ``Nats-Msg-Id`` (events, incidents); returns once the
  stream has stored it (``True``) or recognised it as a duplicate (``False``); raises
  ``errors.TemporaryError`` when it could not be stored;
- ``subscribe`` (optionally in a queue group) with an async handler; ``request`` / ``Msg.respond`` for
  commands.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Protocol


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


class Subscription(Protocol):
    async def unsubscribe(self) -> None: ...

    @property
    def pending(self) -> int:
        """Messages received and not yet handled (the subscriber's backlog)."""

    @property
    def dropped(self) -> int:
        """Messages the client dropped because the backlog was full (a slow consumer)."""


class Bus(Protocol):
    @property
    def connected(self) -> bool:
        """True while the connection is up (the in-memory bus can be switched off in tests)."""

    async def publish(self, subject: str, data: bytes, headers: dict[str, str] | None = None) -> None: ...

    async def publish_durable(self, subject: str, data: bytes, msg_id: str, timeout: float = 5.0) -> bool: ...

    async def subscribe(
        self, subject: str, handler: Handler, queue: str = "", *, pending_bytes: int | None = None
    ) -> Subscription: ...

    async def request(self, subject: str, data: bytes, timeout: float = 2.0) -> Msg: ...

    async def flush(self, timeout: float = 2.0) -> None: ...

    async def close(self) -> None: ...
