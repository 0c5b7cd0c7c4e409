"""``forward.Forwarder`` against a real nats-server and a real HTTP receiver on loopback."""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import AsyncIterator, Iterator

import orjson
import pytest
from structlog.testing import capture_logs

from healer import config, errors
from healer.bus import embedded, provision
from healer.bus import nats as natsbus
from healer.feed import forward, webhook
from healer.schemas import codec, incidents
from tests import conftest
from tests.feed import helpers

FAST = config.FeedSettings(
    retry_initial_delay_s=0.02, retry_max_delay_s=0.1, fetch_timeout_s=0.5, ack_wait_s=5.0, http_timeout_s=2.0
)


@pytest.fixture
def receiver() -> Iterator[helpers.Receiver]:
    r = helpers.Receiver(embedded.free_port())
    try:
        yield r
    finally:
        r.stop()


class Running:
    def __init__(self, fwd: forward.Forwarder) -> None:
        self.fwd = fwd
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(fwd.run(self.stop))

    def count(self, name: str) -> float:
        return self.fwd.metrics.registry.get_sample_value(name) or 0.0

    async def finish(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, 10)


@pytest.fixture
async def running(nats_bus: natsbus.NatsBus) -> AsyncIterator[list[Running]]:
    started: list[Running] = []
    try:
        yield started
    finally:
        for r in started:
            if not r.task.done():
                await r.finish()


async def pending(bus: natsbus.NatsBus, durable: str = "healer-forward") -> tuple[int, int]:
    info = await bus.js.consumer_info(helpers.SUBJ.stream_incidents, durable)
    return info.num_pending, info.num_ack_pending


async def test_nothing_is_lost_while_the_receiver_is_down_then_failing(
    nats_bus: natsbus.NatsBus, receiver: helpers.Receiver, running: list[Running]
) -> None:
    published = [helpers.event(n) for n in range(5)]
    for ev in published[:3]:
        await helpers.publish(nats_bus, ev)
    status = {"code": 503}
    receiver.answer = lambda _id: status["code"]
    run = Running(forward.Forwarder(nats_bus, helpers.SUBJ, receiver.url, FAST))
    running.append(run)

    await conftest.until(lambda: run.count("healer_forward_retried_total") >= 3)  # not even listening
    receiver.start()
    await conftest.until(lambda: len(receiver.snapshot()) >= 3)  # listening, answering 503
    for ev in published[3:]:
        await helpers.publish(nats_bus, ev)
    assert receiver.accepted_ids() == []
    status["code"] = 200
    await conftest.until(lambda: len(receiver.accepted_ids()) == 5)
    await conftest.until(lambda: run.count("healer_forward_delivered_total") == 5)
    await run.finish()

    assert receiver.accepted_ids() == [ev.id for ev in published]
    stored = {ev.id: codec.encode(ev) for ev in published}
    for req in receiver.snapshot():
        assert req.body == stored[req.body_id], "a retry sends the same bytes"
        assert req.content_type == webhook.CONTENT_TYPE
        assert not [h for h in req.headers if h.lower().startswith("ce-")], "structured mode: no ce- headers"
    assert receiver.attempts("ev-0") >= 2, "the first event was retried, not skipped"
    assert all(receiver.attempts(ev.id) == 1 for ev in published[1:]), "only the head of the line retries"
    assert await pending(nats_bus) == (0, 0)


async def test_refused_and_malformed_events_are_dead_lettered_without_blocking_the_feed(
    nats_bus: natsbus.NatsBus, receiver: helpers.Receiver, running: list[Running], tmp_path: pathlib.Path
) -> None:
    receiver.answer = lambda ce_id: 400 if ce_id == "ev-1" else 202
    receiver.start()
    await helpers.publish(nats_bus, helpers.event(0))
    await helpers.publish_raw(nats_bus, helpers.SUBJ.incident(incidents.Change.OPENED, "x"), b"garbage")
    await helpers.publish(nats_bus, helpers.event(1))
    await helpers.publish(nats_bus, helpers.event(2))
    dead = tmp_path / "dead.jsonl"
    with capture_logs() as logs:
        run = Running(forward.Forwarder(nats_bus, helpers.SUBJ, receiver.url, FAST, dead_letter=dead))
        running.append(run)
        await conftest.until(lambda: receiver.accepted_ids() == ["ev-0", "ev-2"])
        await run.finish()

    records = [orjson.loads(line) for line in dead.read_text().splitlines()]
    assert [(r["id"], r["status"], r["stream_seq"]) for r in records] == [(None, None, 2), ("ev-1", 400, 3)]
    assert records[0]["event"] == "garbage"
    assert records[1]["event"]["data"]["incident_id"] == "inc-1"
    assert receiver.attempts("ev-1") == 1, "a 400 is not retried"
    assert run.count("healer_forward_refused_total") == 1
    assert (
        run.count(
            "healer_forward_malformed_total",
        )
        == 0
    )
    assert (
        run.fwd.metrics.registry.get_sample_value("healer_forward_malformed_total", {"reason": "json"}) == 1
    )
    refused = [e for e in logs if e["event"] == "forward.refused"]
    assert [(e["event_id"], e["status"]) for e in refused] == [("ev-1", 400)]
    assert await pending(nats_bus) == (0, 0)


async def test_retry_limit_stops_the_forwarder_and_leaves_the_event_unacknowledged(
    nats_bus: natsbus.NatsBus, receiver: helpers.Receiver, running: list[Running]
) -> None:
    receiver.answer = lambda _id: 500
    receiver.start()
    await helpers.publish(nats_bus, helpers.event(0))
    settings = FAST.model_copy(update={"retry_attempts": 3})
    run = Running(forward.Forwarder(nats_bus, helpers.SUBJ, receiver.url, settings))
    running.append(run)
    with pytest.raises(errors.PermanentError, match="gave up on event ev-0 after 3 attempts"):
        await asyncio.wait_for(run.task, 10)
    assert receiver.attempts("ev-0") == 3
    info = await nats_bus.js.consumer_info(helpers.SUBJ.stream_incidents, "healer-forward")
    assert info.ack_floor.stream_seq == 0, "the event must not have been acknowledged"


def test_receiver_answers_map_to_retry_or_refusal(receiver: helpers.Receiver) -> None:
    headers = webhook.message(b"{}").headers
    with pytest.raises(errors.TemporaryError, match="unreachable"):
        webhook.post_sync(receiver.url, b"{}", headers, 2.0)
    codes = iter([200, 204, 500, 503, 408, 429, 400, 404, 301])
    receiver.answer = lambda _id: next(codes)
    receiver.start()
    assert webhook.post_sync(receiver.url, b"{}", headers, 2.0).status == 200
    assert webhook.post_sync(receiver.url, b"{}", headers, 2.0).status == 204
    for code in (500, 503, 408, 429):
        with pytest.raises(errors.TemporaryError, match=str(code)):
            webhook.post_sync(receiver.url, b"{}", headers, 2.0)
    for code in (400, 404, 301):
        with pytest.raises(webhook.Refused) as refused:
            webhook.post_sync(receiver.url, b"{}", headers, 2.0)
        assert refused.value.status == code


def test_retry_after_reads_seconds_and_http_dates() -> None:
    assert webhook.retry_after_s("7") == 7.0
    assert webhook.retry_after_s("Wed, 21 Oct 2015 07:28:10 GMT", now=1445412480.0) == 10.0
    assert webhook.retry_after_s("soon") == 0.0
    assert webhook.retry_after_s(None) == 0.0


async def test_forwarding_survives_a_nats_server_restart(
    nats_bus: natsbus.NatsBus,
    nats_server: embedded.EmbeddedServer,
    receiver: helpers.Receiver,
    running: list[Running],
) -> None:
    receiver.start()
    for n in range(2):
        await helpers.publish(nats_bus, helpers.event(n))
    run = Running(forward.Forwarder(nats_bus, helpers.SUBJ, receiver.url, FAST))
    running.append(run)
    await conftest.until(lambda: len(receiver.accepted_ids()) == 2)
    nats_server.stop()
    await conftest.until(lambda: not nats_bus.connected)
    nats_server.start()
    await conftest.until(lambda: nats_bus.connected, timeout=20)
    for n in range(2, 4):
        await helpers.publish(nats_bus, helpers.event(n))
    await conftest.until(lambda: len(receiver.accepted_ids()) == 4, timeout=30)
    assert receiver.accepted_ids() == [f"ev-{n}" for n in range(4)]


async def test_an_event_being_retried_is_not_handed_to_a_second_forwarder(
    nats_bus: natsbus.NatsBus, receiver: helpers.Receiver, running: list[Running]
) -> None:
    status = {"code": 503}
    receiver.answer = lambda _id: status["code"]
    receiver.start()
    for n in range(3):
        await helpers.publish(nats_bus, helpers.event(n))
    settings = FAST.model_copy(update={"ack_wait_s": 0.6, "retry_max_delay_s": 0.2})
    for _ in range(2):  # active and standby on one durable consumer
        running.append(Running(forward.Forwarder(nats_bus, helpers.SUBJ, receiver.url, settings)))
    await conftest.until(lambda: receiver.attempts("ev-0") >= 12)  # retried for well over ack_wait
    info = await nats_bus.js.consumer_info(helpers.SUBJ.stream_incidents, "healer-forward")
    assert info.num_redelivered == 0, "in-progress acks must keep the event with the forwarder retrying it"
    status["code"] = 200
    await conftest.until(lambda: len(receiver.accepted_ids()) == 3)
    assert receiver.accepted_ids() == ["ev-0", "ev-1", "ev-2"]
    assert [receiver.attempts(f"ev-{n}") for n in (1, 2)] == [1, 1]


async def test_forwarder_started_before_the_stream_exists_waits_for_it(
    nats_server: embedded.EmbeddedServer, receiver: helpers.Receiver
) -> None:
    receiver.start()
    bus = await natsbus.NatsBus.connect(nats_server.url)
    with capture_logs() as logs:
        run = Running(forward.Forwarder(bus, helpers.SUBJ, receiver.url, FAST))
        try:
            await conftest.until(lambda: any(e["event"] == "forward.fetch_failed" for e in logs))
            await provision.ensure(bus, helpers.SUBJ, config.NatsSettings())
            await helpers.publish(bus, helpers.event(0))
            await conftest.until(lambda: receiver.accepted_ids() == ["ev-0"])
        finally:
            await run.finish()
            await bus.close()
