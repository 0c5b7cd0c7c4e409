"""The archive's database: every feed event, and the incidents, actions and verdicts derived from them.

SQLite (the standard library's ``sqlite3``): one file, WAL journal, no server, and the report's queries
are small aggregations over thousands to millions of rows (docs/archive.md says why not DuckDB).

Writes are idempotent by CloudEvent id: ``events.id`` is the primary key, and an event whose id is
already stored changes nothing (``INSERT OR IGNORE``), so a redelivery, a replay of the whole stream or
two archivers on one file add nothing twice. The derived rows do not depend on arrival order: times are
kept as the earliest or latest seen, the incident's state and evidence are those of its latest event
(by ``time``, then stream sequence), and an action's row is that of the latest event that listed it.

The schema is versioned (``meta.schema_version``); a file of another version is refused, never changed.
"""

from __future__ import annotations

import contextlib
import pathlib
import sqlite3
from collections.abc import Iterator
from typing import Final

import orjson

from healer import actions, errors
from healer.schemas import incidents, verdicts

SCHEMA_VERSION: Final = 1

DDL: Final = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS events (
    id TEXT PRIMARY KEY,
    stream_seq INTEGER NOT NULL,
    type TEXT NOT NULL,
    incident_id TEXT,
    time REAL NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_incident ON events (incident_id, time, stream_seq);
CREATE TABLE IF NOT EXISTS incidents (
    incident_id TEXT PRIMARY KEY,
    rule_id TEXT NOT NULL,
    severity TEXT NOT NULL,
    node TEXT NOT NULL,
    gpu_index INTEGER,
    gpu_uuid TEXT,
    scope TEXT NOT NULL,
    mode TEXT NOT NULL,
    state TEXT NOT NULL,
    summary TEXT NOT NULL,
    evidence TEXT NOT NULL,
    labels TEXT NOT NULL,
    ladder TEXT,
    outcome TEXT,
    opened_at REAL NOT NULL,
    contained_at REAL,
    resolved_at REAL,
    escalated_at REAL,
    last_time REAL NOT NULL,
    last_seq INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS incidents_opened ON incidents (opened_at);
CREATE TABLE IF NOT EXISTS actions (
    incident_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    kind TEXT NOT NULL,
    status TEXT NOT NULL,
    detail TEXT NOT NULL,
    at REAL NOT NULL,
    event_time REAL NOT NULL,
    PRIMARY KEY (incident_id, idx)
);
CREATE TABLE IF NOT EXISTS verdicts (
    id TEXT PRIMARY KEY,
    incident_id TEXT NOT NULL,
    verdict TEXT NOT NULL,
    by TEXT NOT NULL,
    note TEXT NOT NULL,
    time REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS verdicts_incident ON verdicts (incident_id, time);
"""

CONTAINS: Final[frozenset[str]] = frozenset(
    k.name for k in actions.CATALOG.values() if k.takes_out_of_service or k.caps_power
)
"""Action kinds that contain a fault (take capacity out of service, or cap power): the first of them that
took effect is the incident's containment."""
OUTCOME_KEY: Final = "outcome"
"""``evidence.outcome``: how a recovery ladder (or a shared-cause incident) ended (docs/remediation.md)."""
LADDER_KEY: Final = "ladder"
"""``evidence.ladder``: the recovery ladder an incident follows."""
RESOLVED: Final[incidents.Change] = incidents.Change.RESOLVED
"""The change that ends an incident (typed by the schema's ``Change``, so mypy holds it to the model)."""
ESCALATED: Final[incidents.Change] = incidents.Change.ESCALATED

_INCIDENT_UPSERT: Final = """
INSERT INTO incidents VALUES (
    :incident_id, :rule_id, :severity, :node, :gpu_index, :gpu_uuid, :scope, :mode, :state, :summary,
    :evidence, :labels, :ladder, :outcome, :time, :contained_at, :resolved_at, :escalated_at, :time, :seq)
ON CONFLICT (incident_id) DO UPDATE SET
    opened_at = min(opened_at, excluded.opened_at),
    contained_at = CASE WHEN contained_at IS NULL THEN excluded.contained_at
        WHEN excluded.contained_at IS NULL THEN contained_at
        ELSE min(contained_at, excluded.contained_at) END,
    resolved_at = coalesce(max(resolved_at, excluded.resolved_at), resolved_at, excluded.resolved_at),
    escalated_at = coalesce(min(escalated_at, excluded.escalated_at), escalated_at, excluded.escalated_at),
    rule_id = CASE WHEN {newer} THEN excluded.rule_id ELSE rule_id END,
    severity = CASE WHEN {newer} THEN excluded.severity ELSE severity END,
    mode = CASE WHEN {newer} THEN excluded.mode ELSE mode END,
    state = CASE WHEN {newer} THEN excluded.state ELSE state END,
    summary = CASE WHEN {newer} THEN excluded.summary ELSE summary END,
    evidence = CASE WHEN {newer} THEN excluded.evidence ELSE evidence END,
    labels = CASE WHEN {newer} THEN excluded.labels ELSE labels END,
    ladder = coalesce(CASE WHEN {newer} THEN excluded.ladder ELSE ladder END, ladder, excluded.ladder),
    outcome = coalesce(CASE WHEN {newer} THEN excluded.outcome ELSE outcome END, outcome, excluded.outcome),
    last_seq = CASE WHEN {newer} THEN excluded.last_seq ELSE last_seq END,
    last_time = max(last_time, excluded.last_time)
""".format(newer="(excluded.last_time, excluded.last_seq) >= (last_time, last_seq)")

_ACTION_UPSERT: Final = """
INSERT INTO actions VALUES (:incident_id, :idx, :kind, :status, :detail, :at, :event_time)
ON CONFLICT (incident_id, idx) DO UPDATE SET
    kind = excluded.kind, status = excluded.status, detail = excluded.detail, at = excluded.at,
    event_time = excluded.event_time
WHERE excluded.event_time >= actions.event_time
"""


def scope_of(data: incidents.IncidentData) -> str:
    """What an incident is about: ``port``, ``gpu`` or ``node``."""
    if incidents.port_of(data) is not None:
        return "port"
    return "node" if data.gpu_index is None else "gpu"


def contained_at(data: incidents.IncidentData) -> float | None:
    """When the first containing action took effect (``CONTAINS``, status in ``incidents.TOOK_EFFECT``)."""
    times = [a.at for a in data.actions if a.kind in CONTAINS and a.status in incidents.TOOK_EFFECT]
    return min(times) if times else None


class Archive:
    """One SQLite file. Each ``add_*`` call stores one event; ``commit`` makes what was added durable."""

    def __init__(self, path: pathlib.Path | str, *, readonly: bool = False) -> None:
        """Open (or make) the archive; ``readonly``: an existing one, for reading only (``healer report``)."""
        self.path = str(path)
        try:
            if readonly:
                self.db = sqlite3.connect(f"{pathlib.Path(path).resolve().as_uri()}?mode=ro", uri=True)
                self._check_version()
                return
            self.db = sqlite3.connect(self.path, isolation_level="DEFERRED")
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=FULL")
            self._migrate()
        except sqlite3.Error as e:
            raise errors.PermanentError(f"cannot open the archive {self.path}: {e}") from e

    def _check_version(self) -> None:
        row = self.db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if row is None or int(row[0]) != SCHEMA_VERSION:
            found = "no schema version" if row is None else f"archive schema {row[0]}"
            raise errors.PermanentError(f"{self.path} holds {found}; this healer reads {SCHEMA_VERSION}")

    def _migrate(self) -> None:
        row = None
        with contextlib.suppress(sqlite3.OperationalError):  # a new file has no meta table yet
            row = self.db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if row is not None and int(row[0]) != SCHEMA_VERSION:
            raise errors.PermanentError(
                f"{self.path} holds archive schema {row[0]}; this healer reads and writes {SCHEMA_VERSION}"
            )
        self.db.executescript(DDL)
        self.db.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        self.db.commit()

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Archive:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def commit(self) -> None:
        self.db.commit()

    def rollback(self) -> None:
        self.db.rollback()

    def _add_event(
        self, event_id: str, seq: int, type_: str, incident_id: str | None, ts: float, raw: bytes
    ) -> bool:
        cur = self.db.execute(
            "INSERT OR IGNORE INTO events VALUES (?, ?, ?, ?, ?, ?)",
            (event_id, seq, type_, incident_id, ts, raw.decode("utf-8", "replace")),
        )
        return cur.rowcount == 1

    def add_incident(self, ev: incidents.IncidentEvent, raw: bytes, seq: int) -> bool:
        """Store one incident event; False when its id was already stored (nothing changes then)."""
        d = ev.data
        ts = ev.time.timestamp()
        if not self._add_event(ev.id, seq, ev.type, d.incident_id, ts, raw):
            return False
        ladder, outcome = d.evidence.get(LADDER_KEY), d.evidence.get(OUTCOME_KEY)
        self.db.execute(
            _INCIDENT_UPSERT,
            {
                "incident_id": d.incident_id, "rule_id": d.rule_id, "severity": d.severity, "node": d.node,
                "gpu_index": d.gpu_index, "gpu_uuid": d.gpu_uuid, "scope": scope_of(d), "mode": str(d.mode),
                "state": str(d.state), "summary": d.summary, "evidence": orjson.dumps(d.evidence).decode(),
                "labels": orjson.dumps(d.labels).decode(),
                "ladder": None if ladder is None else str(ladder),
                "outcome": None if outcome is None else str(outcome),
                "time": ts, "seq": seq, "contained_at": contained_at(d),
                "resolved_at": ts if ev.change == RESOLVED else None,
                "escalated_at": ts if ev.change == ESCALATED else None,
            },
        )  # fmt: skip
        self.db.executemany(
            _ACTION_UPSERT,
            [
                {"incident_id": d.incident_id, "idx": i, "kind": a.kind, "status": str(a.status),
                 "detail": a.detail, "at": a.at, "event_time": ts}
                for i, a in enumerate(d.actions)
            ],
        )  # fmt: skip
        return True

    def add_verdict(self, ev: verdicts.VerdictEvent, raw: bytes, seq: int) -> bool:
        """Store one verdict; False when its id was already stored."""
        d = ev.data
        ts = ev.time.timestamp()
        if not self._add_event(ev.id, seq, ev.type, d.incident_id, ts, raw):
            return False
        self.db.execute(
            "INSERT OR IGNORE INTO verdicts VALUES (?, ?, ?, ?, ?, ?)",
            (ev.id, d.incident_id, str(d.verdict), d.by, d.note, ts),
        )
        return True

    def add_other(self, event_id: str, type_: str, ts: float, raw: bytes, seq: int) -> bool:
        """Store any other CloudEvent of the feed as it is (rule rejections, later types)."""
        return self._add_event(event_id, seq, type_, None, ts, raw)

    def count(self, table: str) -> int:
        if table not in ("events", "incidents", "actions", "verdicts"):
            raise ValueError(table)
        return int(self.db.execute(f"SELECT count(*) FROM {table}").fetchone()[0])

    def rows(self, sql: str, params: tuple[object, ...] = ()) -> Iterator[sqlite3.Row]:
        """Read-only queries for the report."""
        cur = self.db.cursor()
        cur.row_factory = sqlite3.Row
        yield from cur.execute(sql, params)
