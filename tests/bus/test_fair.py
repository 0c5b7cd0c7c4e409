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


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        fairqueue.FairQueue(per_source=0, max_bytes=1)


async def test_a_fair_subscription_on_a_real_server_sheds_the_flood_and_keeps_every_other_source(
    nats_server: embedded.EmbeddedServer,
) -> None:
    """The handler is stuck (on the first message it took) while 5,000 messages flood one subject and
    three other subjects send three each: the flood keeps its newest ``per_source``, every other message
    is delivered, a message the screen refuses never queues, and the shed ones are ``dropped``."""
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

    def source(subject: str, data: bytes) -> str | None:
        if data.startswith(b"junk"):
            refused.append(data)
            return None
        return subject.rsplit(".", 1)[-1]

    try:
        sub = await bus.subscribe("t.*", handler, fair=base.Fairness(source, per_source=4, max_bytes=1 << 20))
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
        assert sub.dropped in (4995, 4996), "the flood's own: all but its newest four and one taken"
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
