"""The Bus Protocol's key-value buckets, pull consumers and replays behave the same on the in-memory bus
and on a real nats-server: each test runs on both (the ``bus`` fixture), so the memory twin cannot drift
from JetStream's semantics (revisions, compare-and-set, acks, naks, redelivery after the ack wait)."""

from __future__ import annotations

import datetime
import uuid

import pytest

from healer import errors
from healer.bus import base, nats_jetstream, subjects
from healer.bus import nats as natsbus
from healer.controller.store import kv, lease

LONG_ACK_WAIT_S = 60.0
"""An ack wait no test outlives: nothing is redelivered because it ran out."""
SHORT_ACK_WAIT_S = 1.0
"""An ack wait a test waits out on purpose (it waits for the redelivery, never for a time)."""
EMPTY_S = 0.3
"""How long a fetch that must come back empty waits (what it checks does not depend on time)."""
ARRIVES_S = 10.0
"""Bound on waiting for something that must come: a failure, not a slow pass, when it does not."""


async def publish(bus: base.Bus, subj: subjects.Subjects, *nodes: str) -> None:
    for node in nodes:
        assert await bus.publish_durable(subj.events(node), node.encode(), msg_id=uuid.uuid4().hex)


def consumer(
    bus: base.Bus, subj: subjects.Subjects, *, ack_wait_s: float = LONG_ACK_WAIT_S, **kw: object
) -> base.PullConsumer:
    settings: dict[str, object] = {"durable": "contract", "max_ack_pending": 100, **kw}
    return bus.pull_consumer(subj.stream_events, subj.all_events, ack_wait_s=ack_wait_s, **settings)  # type: ignore[arg-type]


async def fetch_until(c: base.PullConsumer, predicate: object, batch: int = 10) -> list[base.StreamMsg]:
    """Fetch until a fetched message satisfies ``predicate``; every message fetched, in order."""
    seen: list[base.StreamMsg] = []
    for _ in range(int(ARRIVES_S / 0.5)):
        seen += await c.fetch(batch, timeout=0.5)
        if any(predicate(m) for m in seen):  # type: ignore[operator]
            return seen
    raise AssertionError(f"not delivered within {ARRIVES_S}s; got {[(m.data, m.delivered) for m in seen]}")


# -- key-value buckets -------------------------------------------------------------------------------


async def test_revisions_grow_and_compare_and_set_refuses_a_stale_writer(
    bus: base.Bus, subj: subjects.Subjects
) -> None:
    bucket = await bus.key_value(subj.kv_state)
    assert await bucket.get("t.a") is None
    first = await bucket.create("t.a", b"1")
    with pytest.raises(base.KeyConflict):
        await bucket.create("t.a", b"again")
    assert await bucket.get("t.a") == base.Entry("t.a", b"1", first)
    second = await bucket.update("t.a", b"2", first)
    assert second > first
    with pytest.raises(base.KeyConflict):
        await bucket.update("t.a", b"stale", first)
    assert (await bucket.get("t.a")) == base.Entry("t.a", b"2", second), "a lost update writes nothing"
    third = await bucket.put("t.b", b"x")
    assert third > second, "one revision sequence per bucket"
    assert sorted(await bucket.keys()) == ["t.a", "t.b"]
    await bucket.delete("t.a")
    assert await bucket.get("t.a") is None
    assert await bucket.keys() == ["t.b"]
    with pytest.raises(base.KeyConflict):
        await bucket.update("t.a", b"gone", second)
    assert await bucket.create("t.a", b"back") > third, "a deleted key may be created again"


async def test_an_empty_bucket_has_no_keys_and_a_bad_key_is_refused(
    bus: base.Bus, subj: subjects.Subjects
) -> None:
    bucket = await bus.key_value(subj.kv_state)
    assert await bucket.keys() == []
    with pytest.raises(errors.PermanentError):
        await bucket.put("not a key", b"x")
    with pytest.raises(base.KeyConflict):
        await bucket.update("never.written", b"x", 1)


async def test_a_listing_by_prefix_names_only_the_keys_under_it(
    bus: base.Bus, subj: subjects.Subjects
) -> None:
    """A prefix ending with a dot is the server's subject filter on JetStream; any other prefix is
    filtered after the listing: the same keys either way, on both buses (#43)."""
    bucket = await bus.key_value(subj.kv_state)
    for key in ("close.a", "close.b", "closed.c", "incident.a", "ladder.a", "ladder-stop.a"):
        await bucket.put(key, b"1")
    await bucket.delete("close.b")
    assert await bucket.keys("close.") == ["close.a"]
    assert sorted(await bucket.keys("close")) == ["close.a", "closed.c"]
    assert await bucket.keys("ladder.") == ["ladder.a"]
    assert await bucket.keys("ladder-stop.") == ["ladder-stop.a"]
    assert await bucket.keys("none.") == []
    assert len(await bucket.keys()) == 5


async def test_listing_keys_again_and_again_leaves_no_consumer_behind(
    nats_bus: natsbus.NatsBus, subj: subjects.Subjects
) -> None:
    """nats-py's own key listing left its ordered consumer on the server for 5 minutes: a controller
    listing every second or two reached the KV stream's consumer limit (err 10026) and every listing
    after it failed, or read as an empty bucket. 600 listings in a row all see the keys, and the
    stream keeps no consumer after them."""
    bucket = await nats_bus.key_value(subj.kv_state)
    await bucket.put("t.a", b"1")
    await bucket.put("t.b", b"2")
    await bucket.delete("t.b")
    for _ in range(600):
        assert await bucket.keys() == ["t.a"]
    info = await nats_bus.js.stream_info(f"KV_{subj.kv_state}")
    assert info.state.consumer_count == 0


async def test_a_key_listing_reads_every_key_past_one_fetch(
    nats_bus: natsbus.NatsBus, subj: subjects.Subjects
) -> None:
    """A listing reads exactly the keys there were when it began, in several fetches when there are many
    (the pull consumer's own count, not a push consumer's guess at when the last one came)."""
    bucket = await nats_bus.key_value(subj.kv_state)
    for i in range(2 * nats_jetstream.KEYS_BATCH + 7):
        await bucket.put(f"k.{i:04d}", b"x")
    await bucket.delete("k.0003")
    listed = await bucket.keys()
    assert sorted(listed) == [f"k.{i:04d}" for i in range(2 * nats_jetstream.KEYS_BATCH + 7) if i != 3]


async def test_a_bucket_that_was_never_provisioned_is_not_found(bus: base.Bus) -> None:
    with pytest.raises(base.NotFound, match="no KV bucket"):
        await bus.key_value("healer-nothing-here")


async def test_one_lease_holder_at_a_time_through_either_bus(bus: base.Bus, subj: subjects.Subjects) -> None:
    store = kv.Store(await bus.key_value(subj.kv_leases))
    first = lease.Lease(store, "leader.shard-0", "first", ttl_s=30.0)
    second = lease.Lease(store, "leader.shard-0", "second", ttl_s=30.0)
    assert await first.try_acquire()
    assert not await second.try_acquire()
    assert await first.renew()
    await first.release(hold_off_s=0)
    assert await second.try_acquire()
    assert second.token is not None
    assert first.token is None
    assert not await first.renew(), "the old holder's revision is stale: compare-and-set refuses it"


# -- durable pull consumers --------------------------------------------------------------------------


async def test_a_consumer_delivers_in_order_and_an_acked_message_never_comes_back(
    bus: base.Bus, subj: subjects.Subjects
) -> None:
    await publish(bus, subj, "n1", "n2", "n3")
    c = consumer(bus, subj)
    try:
        got = await c.fetch(10, timeout=ARRIVES_S)
        assert [(m.data, m.subject, m.delivered) for m in got] == [
            (b"n1", subj.events("n1"), 1), (b"n2", subj.events("n2"), 1), (b"n3", subj.events("n3"), 1),
        ]  # fmt: skip
        assert [m.seq for m in got] == sorted(m.seq for m in got)
        for m in got:
            await m.ack(timeout=5.0)
        assert await c.fetch(10, timeout=EMPTY_S) == []
        await publish(bus, subj, "n4")
        assert [m.data for m in await c.fetch(10, timeout=ARRIVES_S)] == [b"n4"]
    finally:
        await c.close()


async def test_pending_counts_what_the_consumer_has_not_delivered_yet(
    bus: base.Bus, subj: subjects.Subjects
) -> None:
    await publish(bus, subj, "n1", "n2", "n3")
    c = consumer(bus, subj)
    try:
        (first,) = await c.fetch(1, timeout=ARRIVES_S)
        assert (first.data, first.pending) == (b"n1", 2)
        rest = await c.fetch(2, timeout=ARRIVES_S)
        assert [(m.data, m.pending) for m in rest] == [(b"n2", 1), (b"n3", 0)]
    finally:
        await c.close()


async def test_a_nak_delivers_again_at_once_and_a_delayed_nak_not_before_its_delay(
    bus: base.Bus, subj: subjects.Subjects
) -> None:
    await publish(bus, subj, "n1", "n2")
    c = consumer(bus, subj)
    try:
        first, later = await c.fetch(2, timeout=ARRIVES_S)
        await first.nak()
        await later.nak(delay=LONG_ACK_WAIT_S)
        again = await fetch_until(c, lambda m: m.data == b"n1")
        assert [(m.data, m.delivered) for m in again] == [(b"n1", 2)], "the delayed one waits"
        await again[0].ack()
    finally:
        await c.close()


async def test_a_message_neither_acked_nor_kept_comes_back_after_the_ack_wait_and_a_termed_one_never(
    bus: base.Bus, subj: subjects.Subjects
) -> None:
    await publish(bus, subj, "n1", "n2")
    c = consumer(bus, subj, ack_wait_s=SHORT_ACK_WAIT_S)
    try:
        dropped, forgotten = await c.fetch(2, timeout=ARRIVES_S)
        await dropped.term()
        # ``dropped``'s ack wait ran out before ``forgotten``'s: had term not worked, it came back first.
        back = await fetch_until(c, lambda m: m.data == b"n2")
        assert [(m.data, m.delivered) for m in back] == [(b"n2", 2)]
        assert back[0].seq == forgotten.seq
        await back[0].ack()
    finally:
        await c.close()


async def test_a_message_is_settled_once_and_a_replayed_one_takes_no_ack(
    bus: base.Bus, subj: subjects.Subjects
) -> None:
    await publish(bus, subj, "n1")
    c = consumer(bus, subj)
    try:
        (m,) = await c.fetch(1, timeout=ARRIVES_S)
        await m.in_progress()
        await m.in_progress()  # may repeat
        await m.ack()
        for settle in (m.ack, m.nak, m.term):
            with pytest.raises(errors.PermanentError):
                await settle()
    finally:
        await c.close()
    replay = await bus.replay(subj.stream_events, subj.all_events)
    try:
        replayed = await replay.next(ARRIVES_S)
        assert replayed is not None
        with pytest.raises(errors.PermanentError):
            await replayed.ack()
    finally:
        await replay.close()


async def test_no_more_than_max_ack_pending_are_out_unacknowledged(
    bus: base.Bus, subj: subjects.Subjects
) -> None:
    await publish(bus, subj, "n1", "n2")
    c = consumer(bus, subj, max_ack_pending=1)
    try:
        assert [m.data for m in await c.fetch(5, timeout=ARRIVES_S)] == [b"n1"]
        assert await c.fetch(5, timeout=EMPTY_S) == [], "n2 waits for n1's ack"
    finally:
        await c.close()
    # A second handle on the same durable consumer shares its state (and its limit).
    again = consumer(bus, subj, max_ack_pending=1)
    try:
        assert await again.fetch(5, timeout=EMPTY_S) == []
    finally:
        await again.close()


async def test_the_consumer_is_durable_and_starts_where_it_was_told(
    bus: base.Bus, subj: subjects.Subjects
) -> None:
    await publish(bus, subj, "n1", "n2")
    c = consumer(bus, subj)
    (m,) = await c.fetch(1, timeout=ARRIVES_S)
    await m.ack(timeout=5.0)
    await c.close()
    resumed = consumer(bus, subj)
    try:
        assert [m.data for m in await resumed.fetch(5, timeout=ARRIVES_S)] == [b"n2"], "resumes after n1"
    finally:
        await resumed.close()
    fresh = consumer(bus, subj, durable="only-new", start="new")
    try:
        assert await fresh.fetch(5, timeout=EMPTY_S) == []
        await publish(bus, subj, "n3")
        assert [m.data for m in await fresh.fetch(5, timeout=ARRIVES_S)] == [b"n3"]
    finally:
        await fresh.close()


async def test_a_consumer_of_a_stream_that_does_not_exist_is_not_found(
    bus: base.Bus, subj: subjects.Subjects
) -> None:
    c = bus.pull_consumer("NO_SUCH_STREAM", "nothing.>", durable="x", ack_wait_s=5.0, max_ack_pending=1)
    try:
        with pytest.raises(base.NotFound):
            await c.fetch(1, timeout=EMPTY_S)
    finally:
        await c.close()


# -- replays -----------------------------------------------------------------------------------------


async def test_a_replay_reads_the_stream_in_order_filtered_then_what_comes_later(
    bus: base.Bus, subj: subjects.Subjects
) -> None:
    await publish(bus, subj, "n1", "n2", "n1")
    replay = await bus.replay(subj.stream_events, subj.events("n1"))
    try:
        assert replay.backlog == 2
        first, second = await replay.next(ARRIVES_S), await replay.next(ARRIVES_S)
        assert first is not None
        assert second is not None
        assert (first.data, first.pending, second.data, second.pending) == (b"n1", 1, b"n1", 0)
        assert first.seq < second.seq
        assert await replay.next(EMPTY_S) is None
        await publish(bus, subj, "n2", "n1")
        later = await replay.next(ARRIVES_S)
        assert later is not None
        assert later.data == b"n1"
        assert later.seq > second.seq
    finally:
        await replay.close()


async def test_a_replay_from_now_or_from_a_time_skips_what_came_before(
    bus: base.Bus, subj: subjects.Subjects
) -> None:
    await publish(bus, subj, "before")
    since = datetime.datetime.now(tz=datetime.UTC)
    await publish(bus, subj, "after")
    from_time = await bus.replay(subj.stream_events, subj.all_events, since)
    from_now = await bus.replay(subj.stream_events, subj.all_events, "new")
    try:
        assert from_time.backlog == 1
        m = await from_time.next(ARRIVES_S)
        assert m is not None
        assert m.data == b"after"
        assert from_now.backlog == 0
        assert await from_now.next(EMPTY_S) is None
        await publish(bus, subj, "latest")
        m = await from_now.next(ARRIVES_S)
        assert m is not None
        assert m.data == b"latest"
    finally:
        await from_time.close()
        await from_now.close()


async def test_a_replay_of_a_stream_that_does_not_exist_is_not_found(bus: base.Bus) -> None:
    with pytest.raises(base.NotFound):
        await bus.replay("NO_SUCH_STREAM", "nothing.>")
