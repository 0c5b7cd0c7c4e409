"""A backlog fair by source: messages received and not yet handled, kept per source (a subject's node).

A flood on some telemetry subjects once starved every other node for about a minute: frames waited in
one first-in first-out queue (nats-py's), behind hundreds of thousands of the flood's, and whatever
arrived while it was full was dropped whoever sent it. Here each source (for telemetry, the node its
subject names: the identity the server's permissions vouch for) has its own short queue of at most
``per_source`` messages; a source that sends faster than it is handled loses its own oldest, nobody
else's. Messages are taken round-robin over the sources that have any, so a flooding subject costs one
message's work per round, the same as any node. The whole backlog is bounded in bytes too (``size``
of each item: its payload plus what the object costs): past ``max_bytes`` a message is refused. Both
are counted (``shed``). A source's queue is freed as soon as it is empty, so names that send once (a
flood of ghost subjects) hold nothing. Telemetry frames are readings, not events: a newer frame carries
the node's state and its counters are cumulative, so shedding an older one loses no fault.

No I/O, no clock. ``NatsBus.subscribe(fair_by=...)`` puts nats-py's messages here as they are read off
the socket (healer/bus/nats_pending.py), and the subscription's handler takes them.
"""

from __future__ import annotations

import collections
import enum
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Shed(enum.StrEnum):
    """Why a message was dropped before it was handled."""

    SOURCE = "source"
    """Its source had ``per_source`` messages waiting: the oldest of them went."""
    TOTAL = "total"
    """The backlog held ``max_bytes``: the message was refused."""
    VETTED = "vetted"
    """Its source was full and ``put``'s ``admit`` refused it: not queued, nothing pushed out, and not
    counted in ``shed`` (whoever refused it tallies why)."""


SOURCE, TOTAL, VETTED = Shed.SOURCE, Shed.TOTAL, Shed.VETTED
"""Read once: a member read off its enum class costs ~0.35 us on Python 3.11 (a flood sheds per message)."""


def _len(item: object) -> int:
    return len(item)  # type: ignore[arg-type]


class FairQueue(Generic[T]):
    def __init__(self, per_source: int, max_bytes: int, size: Callable[[T], int] = _len) -> None:
        if per_source < 1 or max_bytes < 1:
            raise ValueError("per_source and max_bytes must be at least 1")
        self.per_source = per_source
        self.max_bytes = max_bytes
        self.size = size
        self._queues: dict[str, collections.deque[T]] = {}
        self._turns: collections.deque[str] = collections.deque()
        """Sources with frames waiting, in the order they get their next turn."""
        self.bytes = 0
        self.frames = 0
        self.shed: collections.Counter[Shed] = collections.Counter()
        """Messages dropped before they were handled, by reason (cumulative)."""
        self.peak_bytes = 0

    def __len__(self) -> int:
        return self.frames

    @property
    def sources(self) -> int:
        """Sources with frames waiting."""
        return len(self._queues)

    @property
    def dropped(self) -> int:
        return sum(self.shed.values())

    def __bool__(self) -> bool:
        return self.frames > 0

    def put(self, source: str, data: T, admit: Callable[[T], bool] | None = None) -> Shed | None:
        """Queue one item of ``source``; what was shed to make room (or the item refused), if anything.
        ``admit``, when given, is asked only when ``source`` already has ``per_source`` waiting, before
        the item may push the oldest out: one it refuses is not queued (``Shed.VETTED``). Asked here,
        not before the call, so a source with room costs no second look-up."""
        q = self._queues.get(source)
        shed: Shed | None = None
        if q is not None and len(q) >= self.per_source:
            if admit is not None and not admit(data):
                return VETTED
            old = q.popleft()
            self.bytes -= self.size(old)
            self.frames -= 1
            shed = SOURCE
            self.shed[shed] += 1
        size = self.size(data)
        if self.bytes + size > self.max_bytes:
            self.shed[TOTAL] += 1
            if q is not None and not q:
                del self._queues[source]  # (its turn is skipped when it comes)
            return TOTAL
        if q is None:
            q = self._queues[source] = collections.deque()
            self._turns.append(source)
        q.append(data)
        self.bytes += size
        self.frames += 1
        self.peak_bytes = max(self.peak_bytes, self.bytes)
        return shed

    def pop(self) -> tuple[str, T] | None:
        """The next item, round-robin over the sources (each source's in arrival order)."""
        while self._turns:
            source = self._turns.popleft()
            q = self._queues.get(source)
            if not q:
                continue
            data = q.popleft()
            self.bytes -= self.size(data)
            self.frames -= 1
            if q:
                self._turns.append(source)
            else:
                del self._queues[source]
            return source, data
        return None
