"""``tail.read`` against a real nats-server: order, --since, --follow, filters, garbage in the stream."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import orjson
import pytest
from structlog.testing import capture_logs

from healer import errors
from healer.bus import embedded
from healer.bus import nats as natsbus
from healer.feed import envelope, tail
from healer.schemas import codec, incidents
from tests import conftest
from tests.feed import helpers


async def read_all(bus: natsbus.NatsBus, query: tail.Query) -> tuple[list[envelope.Item], codec.DecodeStats]:
    items: list[envelope.Item] = []
    bad: list[int] = []
    stats = await tail.read(bus, helpers.SUBJ, query, items.append, lambda _s, seq, _e: bad.append(seq))
    assert len(bad) == stats.total_rejected
    return items, stats


def ids(items: list[envelope.Item]) -> list[str]:
    return [i.envelope.id for i in items]


async def test_tail_reads_every_event_in_publish_order(nats_bus: natsbus.NatsBus) -> None:
    published = [
        helpers.event(
            n, node=f"node-{n % 3}", change=incidents.Change.OPENED if n % 2 else incidents.Change.ACTION
        )
        for n in range(8)
    ]
    for ev in published:
        await helpers.publish(nats_bus, ev)
    items, stats = await read_all(nats_bus, tail.Query())
    assert ids(items) == [ev.id for ev in published]
    assert stats.total_rejected == 0
    assert [i.incident for i in items] == published


async def test_tail_of_an_empty_stream_returns_at_once(nats_bus: natsbus.NatsBus) -> None:
    items, _ = await read_all(nats_bus, tail.Query())
    assert items == []


async def test_since_skips_what_was_stored_before_the_start_time(nats_bus: natsbus.NatsBus) -> None:
    for n in range(3):
        await helpers.publish(nats_bus, helpers.event(n))
    boundary = datetime.now(tz=UTC)  # after the server acknowledged (stored) the first three
    for n in range(3, 5):
        await helpers.publish(nats_bus, helpers.event(n))
    items, _ = await read_all(nats_bus, tail.Query(since=boundary))
    assert ids(items) == ["ev-3", "ev-4"]


async def test_follow_prints_events_published_after_it_started(nats_bus: natsbus.NatsBus) -> None:
    await helpers.publish(nats_bus, helpers.event(0))
    seen: list[envelope.Item] = []
    task = asyncio.create_task(
        tail.read(nats_bus, helpers.SUBJ, tail.Query(follow=True), seen.append, lambda *_: None)
    )
    try:
        await conftest.until(lambda: len(seen) == 1)
        await helpers.publish(nats_bus, helpers.event(1))
        await helpers.publish(nats_bus, helpers.event(2))
        await conftest.until(lambda: len(seen) == 3)
        assert ids(seen) == ["ev-0", "ev-1", "ev-2"]
        assert not task.done(), "a follow read must keep running"
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_since_now_follows_only_new_events(nats_bus: natsbus.NatsBus) -> None:
    await helpers.publish(nats_bus, helpers.event(0))
    seen: list[envelope.Item] = []
    query = tail.Query(since="now", follow=True)
    task = asyncio.create_task(tail.read(nats_bus, helpers.SUBJ, query, seen.append, lambda *_: None))
    try:
        stream = helpers.SUBJ.stream_incidents
        async with asyncio.timeout(10):
            while (await nats_bus.js.stream_info(stream)).state.consumer_count == 0:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        await helpers.publish(nats_bus, helpers.event(1))
        await conftest.until(lambda: len(seen) == 1)
        assert ids(seen) == ["ev-1"]
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_node_change_and_severity_filters(nats_bus: natsbus.NatsBus) -> None:
    fqdn = "gpu-7.rack2.example.com"
    published = [
        helpers.event(0, node="gpu-1", change=incidents.Change.OPENED, severity="warning"),
        helpers.event(1, node=fqdn, change=incidents.Change.OPENED, severity="critical"),
        helpers.event(2, node=fqdn, change=incidents.Change.RESOLVED, severity="info"),
        helpers.event(3, node="gpu-1", change=incidents.Change.ACTION, severity="major"),
        helpers.event(4, node="gpu-10", change=incidents.Change.OPENED, severity="critical"),
    ]
    for ev in published:
        await helpers.publish(nats_bus, ev)
    cases = {
        tail.Query(node=fqdn): ["ev-1", "ev-2"],
        tail.Query(node="gpu-1"): ["ev-0", "ev-3"],
        tail.Query(change="opened"): ["ev-0", "ev-1", "ev-4"],
        tail.Query(min_severity="major"): ["ev-1", "ev-3", "ev-4"],
        tail.Query(node=fqdn, change="opened"): ["ev-1"],
        tail.Query(change="escalated"): [],
    }
    for query, expected in cases.items():
        items, _ = await read_all(nats_bus, query)
        assert ids(items) == expected, query


async def test_garbage_is_counted_and_reported_not_fatal(nats_bus: natsbus.NatsBus) -> None:
    subject = helpers.SUBJ.incident(incidents.Change.OPENED, "gpu-1")
    broken_incident = orjson.loads(codec.encode(helpers.event(9)))
    broken_incident["data"]["severity"] = "apocalyptic"
    other = {"specversion": "1.0", "id": "x-1", "source": "urn:example", "type": "io.example.other.v1"}
    rejected = helpers.rules_rejected("rej-1")
    bad_rejected = orjson.loads(codec.encode(rejected))
    del bad_rejected["data"]["kept_rules"]
    await helpers.publish(nats_bus, helpers.event(0))
    await helpers.publish_raw(nats_bus, subject, b"{not json")
    await helpers.publish_raw(nats_bus, subject, b"\xff\xfe")
    await helpers.publish_raw(nats_bus, subject, orjson.dumps(broken_incident))
    await helpers.publish_raw(nats_bus, subject, orjson.dumps({"id": "x"}))
    await helpers.publish_raw(nats_bus, subject, orjson.dumps(other))
    await helpers.publish_raw(nats_bus, helpers.SUBJ.rules_rejected, codec.encode(rejected))
    await helpers.publish_raw(nats_bus, helpers.SUBJ.rules_rejected, orjson.dumps(bad_rejected))
    await helpers.publish(nats_bus, helpers.event(1))
    with capture_logs() as logs:
        items, stats = await read_all(nats_bus, tail.Query())
    assert ids(items) == ["ev-0", "x-1", "rej-1", "ev-1"]
    assert items[1].incident is None
    assert items[2].rules_rejected == rejected
    assert stats.rejected == {
        ("cloudevent", "json"): 2,
        ("incident", "validation"): 1,
        ("cloudevent", "validation"): 1,
        ("rules_rejected", "validation"): 1,
    }
    assert [e["seq"] for e in logs if e["event"] == "tail.rejected"] == [2, 3, 4, 5, 8]


async def test_missing_stream_is_a_clear_permanent_error(nats_server: embedded.EmbeddedServer) -> None:
    bus = await natsbus.NatsBus.connect(nats_server.url)
    try:
        with pytest.raises(errors.PermanentError, match="HEALER_INCIDENTS"):
            await tail.read(bus, helpers.SUBJ, tail.Query(), lambda _i: None, lambda *_: None)
    finally:
        await bus.close()


def test_parse_since_accepts_durations_unix_seconds_rfc3339_and_now() -> None:
    now = 1_800_000_000.0
    assert tail.parse_since("1h", now=now) == datetime.fromtimestamp(now - 3600, tz=UTC)
    assert tail.parse_since("1h30m", now=now) == datetime.fromtimestamp(now - 5400, tz=UTC)
    assert tail.parse_since("2d", now=now) == datetime.fromtimestamp(now - 2 * 86400, tz=UTC)
    assert tail.parse_since("1700000000", now=now) == datetime.fromtimestamp(1_700_000_000, tz=UTC)
    assert tail.parse_since("2026-11-30T01:00:00Z") == datetime(2026, 11, 30, 1, tzinfo=UTC)
    assert tail.parse_since("now") == "now"
    for bad in ["yesterday", "1x", "", "2026-11-30T01:00:00"]:
        with pytest.raises(ValueError, match="time"):
            tail.parse_since(bad)


def test_render_shows_time_change_severity_where_rule_summary_actions_and_mode() -> None:
    acts = [incidents.ActionRecord(kind="cordon", status="done", at=1.0),
            incidents.ActionRecord(kind="migrate", status="planned", at=1.0)]  # fmt: skip
    ev = helpers.event(
        4, change=incidents.Change.ACTION, severity="critical", actions=acts, mode=incidents.Mode.DRY_RUN
    )
    line = tail.render(envelope.classify(codec.encode(ev)))
    stamp = ev.time.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert line == (
        f"{stamp} action    critical gpu-node-1/gpu3 ecc-uncorrectable event number 4 "
        "actions=cordon:done,migrate:planned [dry-run]"
    )
    node_level = tail.render(envelope.classify(codec.encode(helpers.event(5, gpu_index=None))))
    assert " gpu-node-1 ecc-uncorrectable " in node_level
    port = helpers.event(6, gpu_index=None)
    port = port.model_copy(update={"data": port.data.model_copy(update={"labels": {"port": "mlx5_3/1"}})})
    assert " gpu-node-1/port/mlx5_3/1 ecc-uncorrectable " in tail.render(
        envelope.classify(codec.encode(port))
    )


def test_json_line_is_the_stored_event_on_one_line() -> None:
    raw = codec.encode(helpers.event(1))
    assert tail.as_json_line(envelope.classify(raw)) == raw.decode()
    pretty = orjson.dumps(orjson.loads(raw), option=orjson.OPT_INDENT_2)
    line = tail.as_json_line(envelope.classify(pretty))
    assert "\n" not in line
    assert orjson.loads(line) == orjson.loads(raw)


def test_other_cloudevents_render_as_type_subject_and_id() -> None:
    raw = orjson.dumps(
        {"specversion": "1.0", "id": "o-7", "source": "urn:x", "subject": "thing/1",
         "type": "io.example.other.v1", "time": "2026-11-30T01:02:03.5Z", "data": {}}
    )  # fmt: skip
    assert tail.render(envelope.classify(raw)) == "2026-11-30T01:02:03Z io.example.other.v1 thing/1 id=o-7"


def test_rules_rejected_renders_directory_counts_and_first_error() -> None:
    ev = helpers.rules_rejected("rej-2")
    line = tail.render(envelope.classify(codec.encode(ev)))
    stamp = ev.time.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert (
        line
        == f"{stamp} rules-rejected rules 2 errors, 14 rules kept: rules/gpu.yaml:12:11: unknown field 'temp'"
    )
