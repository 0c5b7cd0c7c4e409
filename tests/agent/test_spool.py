"""EventSpool: nothing acknowledged is lost, nothing acknowledged comes back, torn lines are survived."""

from __future__ import annotations

import pathlib

import pytest

from healer import errors
from healer.agent import spool
from healer.schemas import events


def ev(i: int) -> events.NodeEvent:
    return events.new("n1", "xid", gpu_index=0, xid=79, message=f"e{i}", ts=1000.0 + i)


def test_unacknowledged_events_survive_a_restart(tmp_path: pathlib.Path) -> None:
    s = spool.EventSpool(tmp_path)
    sent = [s.append(ev(i)) for i in range(4)]
    s.ack(sent[0])
    s.ack(sent[1])
    again = spool.EventSpool(tmp_path)
    assert [item.event_id for item in again._pending] == [sent[2].event_id, sent[3].event_id]


def test_everything_acknowledged_compacts_the_files(tmp_path: pathlib.Path) -> None:
    s = spool.EventSpool(tmp_path)
    items = [s.append(ev(i)) for i in range(3)]
    for item in items:
        s.ack(item)
    assert s.path.stat().st_size == 0
    assert not s.cursor_path.exists()
    later = s.append(ev(9))
    assert spool.EventSpool(tmp_path).peek() == later


def test_torn_last_line_is_skipped_and_counted(tmp_path: pathlib.Path) -> None:
    s = spool.EventSpool(tmp_path)
    kept = s.append(ev(1))
    with s.path.open("ab") as f:
        f.write(b'{"schema":"healer.event.v1","id":"half')
    again = spool.EventSpool(tmp_path)
    assert again.corrupt_lines == 1
    assert [i.event_id for i in again._pending] == [kept.event_id]


def test_acks_must_be_in_order(tmp_path: pathlib.Path) -> None:
    s = spool.EventSpool(tmp_path)
    s.append(ev(1))
    second = s.append(ev(2))
    with pytest.raises(ValueError, match="out of order"):
        s.ack(second)


def test_a_full_spool_refuses_instead_of_filling_the_disk(tmp_path: pathlib.Path) -> None:
    one = len(spool.EventSpool(tmp_path / "probe").append(ev(1)).data) + 1
    s = spool.EventSpool(tmp_path / "real", max_bytes=2 * one + 10)
    s.append(ev(1))
    s.append(ev(2))
    with pytest.raises(errors.PermanentError, match="full"):
        s.append(ev(3))
    assert len(s) == 2


def test_rejected_event_is_kept_for_a_person(tmp_path: pathlib.Path) -> None:
    s = spool.EventSpool(tmp_path)
    item = s.append(ev(1))
    s.drop(item, "message too large")
    assert (tmp_path / "events.rejected").read_bytes().strip() == item.data
    assert len(s) == 0
