"""``store.Archive``: idempotent by event id, independent of arrival order, versioned."""

from __future__ import annotations

import itertools
import pathlib
import sqlite3

import pytest

from healer import errors
from healer.archive import store
from healer.schemas import codec, incidents

T0 = 1_796_000_000.0


def ev(
    k: int, change: incidents.Change, state: incidents.IncidentState, acts: list[incidents.ActionRecord]
) -> incidents.IncidentEvent:
    data = incidents.IncidentData(
        incident_id="inc-a", rule_id="xid-fatal", severity="critical", node="gpu-a17", gpu_index=2,
        state=state, summary=f"change {k}", actions=acts, mode="enforce",
        evidence={"ladder": "gpu", "outcome": "recovered"} if k == 3 else {},
    )  # fmt: skip
    return incidents.build(event_id=f"inc-a.{k}", cluster="c", change=change, data=data, ts=T0 + 60 * k)


CAP_PLANNED = incidents.ActionRecord(kind="cordon", status="failed-temporary", at=T0 + 30)
CORDON = incidents.ActionRecord(kind="cordon", status="done", at=T0 + 100)
NOTIFY = incidents.ActionRecord(kind="notify", status="done", at=T0 + 10)
EVENTS = [
    ev(0, incidents.Change.OPENED, incidents.IncidentState.OPEN, []),
    ev(1, incidents.Change.ACTION, incidents.IncidentState.OPEN, [NOTIFY, CAP_PLANNED]),
    ev(2, incidents.Change.ACTION, incidents.IncidentState.OPEN, [NOTIFY, CORDON]),
    ev(3, incidents.Change.RESOLVED, incidents.IncidentState.RESOLVED, [NOTIFY, CORDON]),
]


def snapshot(db: store.Archive) -> list[tuple[object, ...]]:
    incident = list(db.rows("SELECT * FROM incidents"))
    acts = list(db.rows("SELECT idx, kind, status, at FROM actions ORDER BY idx"))
    return [tuple(r) for r in incident] + [tuple(r) for r in acts]


def test_every_arrival_order_gives_the_same_archive(tmp_path: pathlib.Path) -> None:
    snapshots = []
    for i, order in enumerate(itertools.permutations(range(4))):
        with store.Archive(tmp_path / f"{i}.db") as db:
            for k in order:
                assert db.add_incident(EVENTS[k], codec.encode(EVENTS[k]), seq=k + 1)
            db.commit()
            snapshots.append(snapshot(db))
    assert all(s == snapshots[0] for s in snapshots)
    with store.Archive(tmp_path / "0.db") as db:
        (row,) = db.rows("SELECT * FROM incidents")
        assert (row["state"], row["opened_at"], row["resolved_at"]) == ("resolved", T0, T0 + 180)
        assert row["contained_at"] == T0 + 100, "notify and a failed cordon contain nothing"
        assert (row["ladder"], row["outcome"], row["scope"]) == ("gpu", "recovered", "gpu")
        assert [(r["kind"], r["status"]) for r in db.rows("SELECT * FROM actions ORDER BY idx")] == [
            ("notify", "done"),
            ("cordon", "done"),
        ]


def test_an_event_stored_twice_changes_nothing(tmp_path: pathlib.Path) -> None:
    with store.Archive(tmp_path / "a.db") as db:
        for e in EVENTS:
            db.add_incident(e, codec.encode(e), seq=1)
        db.commit()
        before = snapshot(db)
        assert not any(db.add_incident(e, codec.encode(e), seq=9) for e in EVENTS)
        db.commit()
        assert snapshot(db) == before
        assert db.count("events") == 4


def test_a_file_of_another_schema_version_is_refused_untouched(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "a.db"
    store.Archive(path).close()
    with sqlite3.connect(path) as raw:
        raw.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(errors.PermanentError, match="schema 99"):
        store.Archive(path)
    with sqlite3.connect(path) as raw:
        assert raw.execute("SELECT value FROM meta").fetchone() == ("99",)


def test_a_reader_opens_the_archive_read_only(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "a.db"
    with store.Archive(path) as db:
        db.add_incident(EVENTS[0], codec.encode(EVENTS[0]), seq=1)
        db.commit()
    with store.Archive(path, readonly=True) as reader:
        assert reader.count("incidents") == 1
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            reader.add_incident(EVENTS[1], codec.encode(EVENTS[1]), seq=2)
    with pytest.raises(errors.PermanentError, match="cannot open"):
        store.Archive(tmp_path / "absent.db", readonly=True)
