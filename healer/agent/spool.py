"""EventSpool: the agent's write-ahead log of node events, so none is lost while NATS is away.

Every event is appended (and fsynced) here before any attempt to publish it, then published in order
with ``Nats-Msg-Id`` = event id and acknowledged in a cursor file once JetStream has stored it. An agent
that crashes or loses NATS for an hour resends what was not acknowledged; the stream's duplicate window
drops the copy of anything that was stored but not yet acknowledged here, so each event arrives once.

Files in the state directory: ``events.spool`` (JSON lines, the encoded NodeEvents) and
``events.cursor`` (how many bytes of the spool are acknowledged). When everything is acknowledged both
are truncated. A torn last line after a crash is skipped and counted, never fatal.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import pathlib

import structlog

from healer import errors
from healer.schemas import codec, events

log = structlog.get_logger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class Spooled:
    event_id: str
    node: str
    data: bytes
    end: int
    """Spool offset just after this event's line; acknowledging it moves the cursor there."""


class EventSpool:
    def __init__(self, directory: str | os.PathLike[str], *, max_bytes: int = 256 << 20) -> None:
        self.dir = pathlib.Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "events.spool"
        self.cursor_path = self.dir / "events.cursor"
        self.max_bytes = max_bytes
        self.corrupt_lines = 0
        self._pending: collections.deque[Spooled] = collections.deque()
        self._size = 0
        self._load()

    def _load(self) -> None:
        if not self.path.exists():
            self.path.write_bytes(b"")
        raw = self.path.read_bytes()
        self._size = len(raw)
        cursor = self._read_cursor()
        if cursor > len(raw):
            cursor = 0  # the spool was compacted after the cursor was written
        offset = cursor
        for line in raw[cursor:].splitlines(keepends=True):
            end = offset + len(line)
            offset = end
            if not line.endswith(b"\n"):
                self.corrupt_lines += 1
                log.warning("spool.torn_line", path=str(self.path), offset=end - len(line))
                continue
            try:
                ev = codec.decode_event(line.rstrip(b"\n"))
            except errors.DecodeError as e:
                self.corrupt_lines += 1
                log.warning("spool.bad_line", path=str(self.path), error=str(e))
                continue
            self._pending.append(Spooled(ev.id, ev.node, line.rstrip(b"\n"), end))
        if self._pending:
            log.info("spool.resumed", pending=len(self._pending), path=str(self.path))

    def _read_cursor(self) -> int:
        try:
            return int(self.cursor_path.read_text().strip() or 0)
        except (OSError, ValueError):
            return 0

    def __len__(self) -> int:
        return len(self._pending)

    def append(self, event: events.NodeEvent) -> Spooled:
        data = codec.encode(event)
        if self._size + len(data) + 1 > self.max_bytes:
            raise errors.PermanentError(f"event spool {self.path} is full ({self._size} bytes)")
        with self.path.open("ab") as f:
            f.write(data + b"\n")
            f.flush()
            os.fsync(f.fileno())
        self._size += len(data) + 1
        item = Spooled(event.id, event.node, data, self._size)
        self._pending.append(item)
        return item

    def peek(self) -> Spooled | None:
        return self._pending[0] if self._pending else None

    def ack(self, item: Spooled) -> None:
        """Mark ``item`` (the oldest pending) delivered."""
        if not self._pending or self._pending[0] is not item:
            raise ValueError("ack out of order")
        self._pending.popleft()
        if not self._pending:
            self._compact()
            return
        tmp = self.cursor_path.with_suffix(".tmp")
        tmp.write_text(str(item.end))
        os.replace(tmp, self.cursor_path)

    def drop(self, item: Spooled, reason: str) -> None:
        """Give up on an event JetStream refused for good; kept in ``events.rejected`` for a person."""
        with (self.dir / "events.rejected").open("ab") as f:
            f.write(item.data + b"\n")
        log.error("spool.event_rejected", event_id=item.event_id, reason=reason)
        self.ack(item)

    def _compact(self) -> None:
        with self.path.open("wb"):
            pass
        self._size = 0
        with contextlib.suppress(FileNotFoundError):
            self.cursor_path.unlink()
