"""Reading the incident feed for people: ``healer incidents tail``.

A replay of the stream (``Bus.replay``: an ephemeral ordered consumer on NATS, recreated after a gap or a
reconnect, so nothing is skipped) starts at a time (``--since``: RFC3339, unix seconds, or a duration ago
such as ``1h30m``), at the start of the stream, or at ``now``. Node and change filters go to the server as
the consumer's filter subject; the severity filter is applied here. Without ``--follow`` the read stops
once everything that was in the stream when it started has been read. Malformed messages are counted and
reported, never fatal.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Literal, get_args

import orjson
import structlog

from healer import durations, errors
from healer.bus import base, subjects
from healer.feed import envelope
from healer.schemas import codec, incidents

log = structlog.get_logger(__name__)

CHANGES: tuple[str, ...] = tuple(incidents.Change)
SEVERITIES: tuple[str, ...] = get_args(incidents.Severity)
SEVERITY_RANK: dict[str, int] = {name: level.rank for name, level in incidents.SEVERITY_LEVELS.items()}

_NUMBER = re.compile(r"\d+(?:\.\d+)?")

Since = datetime | Literal["now"] | None
"""A start time, ``"now"`` (only what is published from now on), or ``None`` (the whole stream)."""


def parse_since(text: str, now: float | None = None) -> datetime | Literal["now"]:
    """``now``, a duration ago (``90s``, ``15m``, ``1h30m``, ``2d``: ``healer.durations``), unix seconds, or
    RFC3339. Raises ``ValueError`` (a ``DurationError`` for a duration outside the grammar)."""
    text = text.strip()
    now = time.time() if now is None else now
    if text == "now":
        return "now"
    if _NUMBER.fullmatch(text):
        return datetime.fromtimestamp(float(text), tz=UTC)
    if durations.looks_like(text):
        return datetime.fromtimestamp(now - durations.parse(text), tz=UTC)
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"cannot read time {text!r}: use RFC3339, unix seconds, a duration like 1h, or now"
        ) from None
    if parsed.tzinfo is None:
        raise ValueError(f"time {text!r} has no time zone (add Z or +00:00)")
    return parsed


@dataclasses.dataclass(frozen=True)
class Query:
    since: Since = None
    follow: bool = False
    node: str | None = None
    change: str | None = None
    min_severity: str | None = None

    def filter_subject(self, subj: subjects.Subjects) -> str:
        """Node and change filters as one subject the server filters on."""
        if self.node is None and self.change is None:
            return subj.all_incidents
        node = subjects.escape_node(self.node) if self.node is not None else "*"
        return f"{subj.prefix}.incidents.{self.change or '*'}.{node}"

    @property
    def start(self) -> base.Start:
        """Where the replay starts: ``since`` as the bus takes it."""
        if self.since == "now":
            return "new"
        if self.since is None:
            return "all"
        return self.since

    def wants(self, item: envelope.Item) -> bool:
        """The filters the server cannot apply: severity (an event without one never passes it)."""
        if self.min_severity is None:
            return True
        if item.incident is None:
            return False
        return SEVERITY_RANK[item.incident.data.severity] >= SEVERITY_RANK[self.min_severity]


def _iso(ts: datetime | None) -> str:
    return "-" if ts is None else ts.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def render(item: envelope.Item) -> str:
    """One line: time, change, severity, node[/gpuN | /port/<device>/<port>], rule, summary, actions (and
    the mode if not enforce)."""
    ev = item.incident
    if item.rules_rejected is not None:
        return _render_rejected(item.rules_rejected)
    if item.verdict is not None:
        v = item.verdict
        note = " ".join(v.data.note.split())
        return f"{_iso(v.time)} verdict {v.data.verdict} {v.data.incident_id} by {v.data.by}" + (
            f": {note}" if note else ""
        )
    if ev is None:
        env = item.envelope
        return f"{_iso(env.time)} {env.type} {env.subject or '-'} id={env.id}"
    d = ev.data
    where = d.node if d.gpu_index is None else f"{d.node}/gpu{d.gpu_index}"
    port = incidents.port_of(d)
    where += f"/port/{port}" if port is not None else ""
    summary = " ".join(d.summary.split())
    line = f"{_iso(ev.time)} {ev.change:<9} {d.severity:<8} {where} {d.rule_id} {summary}"
    if d.actions:
        line += " actions=" + ",".join(f"{a.kind}:{a.status}" for a in d.actions)
    if not d.mode.acts:
        line += f" [{d.mode}]"
    return line


def _render_rejected(ev: incidents.RulesRejectedEvent) -> str:
    d = ev.data
    line = f"{_iso(ev.time)} rules-rejected {d.rules_dir} {len(d.errors)} errors, {d.kept_rules} rules kept"
    if d.errors:
        first = d.errors[0]
        line += f": {first.path}:{first.line}:{first.col}: {' '.join(first.message.split())}"
    return line


def as_json_line(item: envelope.Item) -> str:
    """The CloudEvent as stored, on one line (only re-serialised if the producer pretty-printed it)."""
    raw = item.raw
    if b"\n" in raw or b"\r" in raw:
        raw = orjson.dumps(orjson.loads(raw))
    return raw.decode()


OnItem = Callable[[envelope.Item], None]
OnBad = Callable[[str, int, errors.DecodeError], None]


async def read(
    bus: base.Bus,
    subj: subjects.Subjects,
    query: Query,
    on_item: OnItem,
    on_bad: OnBad,
    stats: codec.DecodeStats | None = None,
    idle_timeout_s: float = 5.0,
) -> codec.DecodeStats:
    """Call ``on_item`` for every matching event in stream order; ``on_bad(subject, seq, error)`` for junk.

    Returns when the stream has been read up to where it was at the start (without ``follow``), or runs
    until cancelled (with ``follow``).
    """
    stats = stats or codec.DecodeStats()
    stream = subj.stream_incidents
    try:
        replay = await bus.replay(stream, query.filter_subject(subj), query.start)
    except base.NotFound as e:
        raise errors.PermanentError(
            f"stream {stream} does not exist: is the controller running? (healer nats provision makes it)"
        ) from e
    try:
        target = 0
        if not query.follow:
            target = replay.backlog
            if target == 0:
                return stats
        seen = 0
        while True:
            msg = await replay.next(idle_timeout_s)
            if msg is None:
                if query.follow:
                    continue
                log.warning("tail.stopped_early", read=seen, expected=target)
                return stats
            seen += 1
            _handle(msg.subject, msg.seq, msg.data, query, on_item, on_bad, stats)
            if not query.follow and (seen >= target or msg.pending == 0):
                return stats
    finally:
        await replay.close()


def _handle(
    subject: str,
    seq: int,
    data: bytes,
    query: Query,
    on_item: OnItem,
    on_bad: OnBad,
    stats: codec.DecodeStats,
) -> None:
    try:
        item = envelope.classify(data, seq)
    except errors.DecodeError as e:
        stats.bad(e)
        log.warning("tail.rejected", subject=subject, seq=seq, reason=e.reason, detail=e.detail)
        on_bad(subject, seq, e)
        return
    stats.ok("incident" if item.incident is not None else item.envelope.type)
    if query.wants(item):
        on_item(item)
