"""The shipped feed consumers, `healer incidents tail` (ordered push consumer) and `healer forward`
(durable pull consumer), work under a feed identity with nothing denied: the feed permissions cover
exactly the JetStream calls they make."""

from __future__ import annotations

import pathlib
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence

import pytest
from structlog.testing import capture_logs

from healer import config
from healer.bus import embedded, provision, subjects
from healer.bus import nats as natsbus
from healer.feed import forward, tail, webhook
from healer.security import natsconf
from tests.feed import helpers

SUBJ = subjects.Subjects()

pytestmark = pytest.mark.nats


@pytest.fixture
def secured(tmp_path: pathlib.Path) -> Iterator[tuple[embedded.EmbeddedServer, natsconf.Result]]:
    result = natsconf.generate(natsconf.Inventory(nodes=["gpu-node-1"], feeds=["siem"]), tmp_path / "auth")
    srv = embedded.EmbeddedServer(tmp_path / "nats", extra_config=result.auth_conf.read_text())
    srv.start()
    try:
        yield srv, result
    finally:
        srv.stop()


async def _connect(
    srv: embedded.EmbeddedServer, result: natsconf.Result, role: str, name: str
) -> natsbus.NatsBus:
    ns = config.load(result.settings_files[(role, name)], env={}).nats.model_copy(update={"url": srv.url})
    return await natsbus.NatsBus.connect(
        srv.url, name=name, nats_settings=ns, retry=config.RetrySettings(attempts=1)
    )


@pytest.fixture
async def buses(
    secured: tuple[embedded.EmbeddedServer, natsconf.Result],
) -> AsyncIterator[tuple[natsbus.NatsBus, natsbus.NatsBus]]:
    srv, result = secured
    controller = await _connect(srv, result, "controller", "controller")
    await provision.ensure(controller, SUBJ, config.NatsSettings())
    feed = await _connect(srv, result, "feed", "siem")
    try:
        yield controller, feed
    finally:
        await feed.close()
        await controller.close()


def _denied(logs: Sequence[Mapping[str, object]]) -> list[object]:
    return [e["error"] for e in logs if e["event"] == "nats.permission_denied"]


async def test_incidents_tail_reads_the_feed_as_a_feed_identity(
    buses: tuple[natsbus.NatsBus, natsbus.NatsBus],
) -> None:
    controller, feed = buses
    for n in range(3):
        await helpers.publish(controller, helpers.event(n))
    items: list[str] = []
    with capture_logs() as logs:
        stats = await tail.read(
            feed,
            SUBJ,
            tail.Query(node="gpu-node-1"),
            lambda item: items.append(item.envelope.id),
            lambda *_: None,
        )
    assert items == ["ev-0", "ev-1", "ev-2"]
    assert stats.total_rejected == 0
    assert _denied(logs) == []


async def test_forward_delivers_the_feed_as_a_feed_identity(
    buses: tuple[natsbus.NatsBus, natsbus.NatsBus],
) -> None:
    controller, feed = buses
    for n in range(2):
        await helpers.publish(controller, helpers.event(n))
    posted: list[str] = []

    async def post(url: str, body: bytes, headers: Mapping[str, str], timeout_s: float) -> webhook.Delivery:
        posted.append(url)
        return webhook.Delivery(status=200, elapsed_s=0.0)

    fwd = forward.Forwarder(
        feed, SUBJ, "http://127.0.0.1:9/hook", config.FeedSettings(durable="siem-forward"), post=post
    )
    with capture_logs() as logs:
        # the forwarder's own steps, without its endless loop: set up the durable consumer, pull, deliver, ack
        await fwd.ensure_consumer()
        assert fwd.consumer is not None
        for _ in range(2):  # one in flight at a time (max_ack_pending 1)
            (msg,) = await fwd.consumer.fetch(1, timeout=5.0)
            await fwd._handle(msg)
        await fwd._unbind()
    assert len(posted) == 2
    assert _denied(logs) == []
    info = await controller.js.consumer_info(SUBJ.stream_incidents, "siem-forward")
    assert info.ack_floor.stream_seq == 2  # both acknowledged through the feed's $JS.ACK rights
