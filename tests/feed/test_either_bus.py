"""The feed consumers run on the Bus Protocol: the same scenarios on the in-memory bus and on a real
nats-server (the ``bus`` fixture)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import orjson

from healer import config, errors
from healer.bus import base
from healer.feed import envelope, forward, tail, webhook
from healer.schemas import incidents
from tests import conftest
from tests.feed import helpers

FAST = config.FeedSettings(
    retry_initial_delay_s=0.02, retry_max_delay_s=0.1, fetch_timeout_s=0.5, ack_wait_s=5.0, http_timeout_s=2.0
)


async def test_the_forwarder_delivers_in_order_retries_and_acknowledges_on_either_bus(bus: base.Bus) -> None:
    events = [helpers.event(n) for n in range(3)]
    for ev in events:
        await helpers.publish(bus, ev)
    posted: list[str] = []
    attempts = [0]

    async def post(url: str, body: bytes, headers: Mapping[str, str], timeout_s: float) -> webhook.Delivery:
        attempts[0] += 1
        if attempts[0] == 2:
            raise errors.TemporaryError("receiver busy")
        posted.append(str(orjson.loads(body)["id"]))
        return webhook.Delivery(status=200, elapsed_s=0.0)

    fwd = forward.Forwarder(bus, helpers.SUBJ, "http://127.0.0.1:9/hook", FAST, post=post)
    stop = asyncio.Event()
    task = asyncio.create_task(fwd.run(stop))
    try:
        await conftest.until(lambda: len(posted) == 3)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    assert posted == [ev.id for ev in events], "in stream order, the retried one once"
    assert attempts[0] == 4
    leftover = bus.pull_consumer(
        helpers.SUBJ.stream_incidents, helpers.SUBJ.all_incidents, durable=FAST.durable,
        ack_wait_s=FAST.ack_wait_s, max_ack_pending=1,
    )  # fmt: skip
    try:
        assert await leftover.fetch(1, timeout=0.3) == [], "every delivered event was acknowledged"
    finally:
        await leftover.close()


async def test_tail_reads_the_feed_in_order_and_filtered_on_either_bus(bus: base.Bus) -> None:
    events = [helpers.event(n, node=f"node-{n % 2}") for n in range(4)]
    for ev in events:
        await helpers.publish(bus, ev)
    await bus.publish_durable(
        helpers.SUBJ.incident(incidents.Change.OPENED, "node-0"), b"not json", msg_id="junk"
    )
    items: list[envelope.Item] = []
    bad: list[int] = []
    stats = await tail.read(
        bus, helpers.SUBJ, tail.Query(), items.append, lambda _s, seq, _e: bad.append(seq)
    )
    assert [i.envelope.id for i in items] == [ev.id for ev in events]
    assert len(bad) == 1
    assert stats.total_rejected == 1
    only: list[envelope.Item] = []
    await tail.read(bus, helpers.SUBJ, tail.Query(node="node-1"), only.append, lambda *_: None)
    assert [i.envelope.id for i in only] == [events[1].id, events[3].id]
