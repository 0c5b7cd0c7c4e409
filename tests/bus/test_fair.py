"""The telemetry backlog is fair by source and bounded: a flooding subject loses its own frames, never
another node's, and costs one frame per round."""

from __future__ import annotations

import asyncio

import pytest

from healer.bus import base, embedded
from healer.bus import fair as fairqueue
from healer.bus import nats as natsbus


def test_a_flooding_source_sheds_its_own_oldest_frames_and_waits_its_turn() -> None:
    q = fairqueue.FairQueue[bytes](per_source=2, max_bytes=10_000)
    for i in range(1000):
        q.put("flood", b"x%d" % i)
    assert q.put("n1", b"frame-1") is None
    assert q.put("n2", b"frame-2") is None
    assert q.shed[fairqueue.Shed.SOURCE] == 998
    taken = [q.pop() for _ in range(4)]
    assert taken == [("flood", b"x998"), ("n1", b"frame-1"), ("n2", b"frame-2"), ("flood", b"x999")]
    assert q.pop() is None
    assert (q.bytes, len(q), q.sources) == (0, 0, 0), "an empty source holds nothing"


def test_each_source_keeps_its_order_and_turns_rotate() -> None:
    q = fairqueue.FairQueue[bytes](per_source=4, max_bytes=10_000)
    for i in range(3):
        q.put("a", b"a%d" % i)
        q.put("b", b"b%d" % i)
    assert [q.pop() for _ in range(6)] == [
        ("a", b"a0"), ("b", b"b0"), ("a", b"a1"), ("b", b"b1"), ("a", b"a2"), ("b", b"b2"),
    ]  # fmt: skip


def test_the_backlog_is_bounded_in_bytes_and_refusals_are_counted() -> None:
    q = fairqueue.FairQueue[bytes](per_source=4, max_bytes=100)
    accepted = [q.put(f"ghost-{i}", b"y" * 30) for i in range(10)]
    assert accepted.count(None) == 3
    assert accepted.count(fairqueue.Shed.TOTAL) == 7
    assert q.bytes == 90
    assert q.peak_bytes <= 100
    assert q.sources == 3, "refused names hold nothing"
    assert q.dropped == 7


def test_admit_is_asked_only_when_the_source_is_full_and_a_refusal_pushes_nothing_out() -> None:
    asked: list[bytes] = []

    def admit(item: bytes) -> bool:
        asked.append(item)
        return item.startswith(b"frame")

    q = fairqueue.FairQueue[bytes](per_source=2, max_bytes=10_000)
    assert [q.put("n1", b"frame-%d" % i, admit) for i in range(2)] == [None, None]
    assert asked == [], "a source with room is not vetted"
    assert q.put("n1", b"garbage", admit) is fairqueue.Shed.VETTED
    assert q.put("n1", b"frame-2", admit) is fairqueue.Shed.SOURCE
    assert asked == [b"garbage", b"frame-2"]
    assert q.shed == {fairqueue.Shed.SOURCE: 1}, "a refusal is the vet's to count, not a shed"
    assert [q.pop(), q.pop(), q.pop()] == [("n1", b"frame-1"), ("n1", b"frame-2"), None]


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        fairqueue.FairQueue(per_source=0, max_bytes=1)


@pytest.mark.parametrize("batches", [False, True], ids=["per-message", "in-batches"])
async def test_a_fair_subscription_on_a_real_server_sheds_the_flood_and_keeps_every_other_source(
    nats_server: embedded.EmbeddedServer, batches: bool
) -> None:
    """The handler is stuck (on the first message or batch it took) while 5,000 messages flood one
    subject and three other subjects send three each: the flood keeps its newest ``per_source`` (and
    what the handler took), every other message is delivered, a message the screen refuses never
    queues, and the shed ones are ``dropped``; the same whether it takes one message per call or a
    batch (``subscribe_batches``)."""
    bus = await natsbus.NatsBus.connect(nats_server.url, name="fair")
    pub = await natsbus.NatsBus.connect(nats_server.url, name="pub")
    release = asyncio.Event()
    got: list[tuple[str, bytes]] = []
    refused: list[bytes] = []

    entered: list[bytes] = []

    async def handler(msg: base.Msg) -> None:
        entered.append(msg.data)
        await release.wait()
        got.append((msg.subject, msg.data))

    async def batch_handler(msgs: list[base.Msg]) -> None:
        entered.extend(m.data for m in msgs)
        await release.wait()
        got.extend((m.subject, m.data) for m in msgs)

    def source(subject: str, data: bytes) -> str | None:
        if data.startswith(b"junk"):
            refused.append(data)
            return None
        return subject.rsplit(".", 1)[-1]

    try:
        fairness = base.Fairness(source, per_source=4, max_bytes=1 << 20)
        if batches:
            sub = await bus.subscribe_batches("t.*", batch_handler, fair=fairness, max_batch=16)
        else:
            sub = await bus.subscribe("t.*", handler, fair=fairness)
        await bus.flush()
        for i in range(5000):
            await pub.publish("t.flood", b"f%d" % i)
        for i in range(3):
            for node in ("n1", "n2", "n3"):
                await pub.publish(f"t.{node}", b"%s-%d" % (node.encode(), i))
        await pub.publish("t.n1", b"junk")
        await pub.flush()
        async with asyncio.timeout(20):  # every message read off the socket: queued, shed or refused
            while sub.pending + sub.dropped + len(refused) + len(entered) < 5010:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        taken = sum(d.startswith(b"f") for d in entered)  # (before the flood, or from its newest four)
        assert taken <= (16 if batches else 1)
        assert 4996 - taken <= sub.dropped <= 4996, (
            "the flood's own: all but its newest four, less those taken"
        )
        assert refused == [b"junk"], "screened out before it queued"
        release.set()
        async with asyncio.timeout(20):
            while len(got) < 5010 - sub.dropped - len(refused):  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        real = [d for s, d in got if s != "t.flood"]
        assert sorted(real) == sorted(b"%s-%d" % (n, i) for n in (b"n1", b"n2", b"n3") for i in range(3))
        flood = sorted((d for s, d in got if s == "t.flood"), key=lambda d: int(d[1:]))
        assert len(flood) == 5000 - sub.dropped
        assert flood[-4:] == [b"f4996", b"f4997", b"f4998", b"f4999"], "the newest four"
        n1 = [d for s, d in got if s == "t.n1"]
        assert n1 == [b"n1-0", b"n1-1", b"n1-2"], "each source in its own order"
    finally:
        release.set()
        await pub.close()
        await bus.close()


async def test_batches_take_what_waits_in_order_and_never_more_than_asked(bus: base.Bus) -> None:
    """While the handler holds its first batch, 100 more messages queue; then it is given them in
    batches of at most ``max_batch``, each source's in the order sent, and none twice or lost."""
    release = asyncio.Event()
    batches: list[list[bytes]] = []

    async def handler(msgs: list[base.Msg]) -> None:
        batches.append([m.data for m in msgs])
        await release.wait()

    sub = await bus.subscribe_batches(
        "t.*", handler, fair=base.Fairness(lambda subject, data: subject, per_source=1000), max_batch=16
    )
    try:
        await bus.flush()
        await bus.publish("t.a", b"a-first")
        async with asyncio.timeout(10):
            while not batches:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        for i in range(50):
            await bus.publish("t.a", b"a-%02d" % i)
            await bus.publish("t.b", b"b-%02d" % i)
        async with asyncio.timeout(10):
            while sub.pending < 100:  # noqa: ASYNC110 - every message read and queued
                await asyncio.sleep(0.01)
        release.set()
        async with asyncio.timeout(10):
            while sum(map(len, batches)) < 101:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        assert batches[0] == [b"a-first"]
        assert [len(b) for b in batches[1:]] == [16] * 6 + [4]
        flat = [d for b in batches for d in b]
        assert [d for d in flat if d.startswith(b"a-") and d != b"a-first"] == [
            b"a-%02d" % i for i in range(50)
        ]
        assert [d for d in flat if d.startswith(b"b-")] == [b"b-%02d" % i for i in range(50)]
    finally:
        release.set()
        await sub.unsubscribe()
