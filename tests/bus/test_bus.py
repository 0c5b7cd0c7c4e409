"""The Bus Protocol behaves the same on the in-memory bus and on a real nats-server."""

from __future__ import annotations

import asyncio
import pathlib

import nats.errors
import nats.js.api
import nats.js.errors
import pytest
from hypothesis import given
from hypothesis import strategies as st

from healer import config, errors
from healer.bus import base, embedded, memory, provision, subjects
from healer.bus import nats as natsbus
from tests import conftest


async def test_wildcard_subscription_receives_every_node(bus: base.Bus, subj: subjects.Subjects) -> None:
    got = conftest.Collector()
    await bus.subscribe(subj.all_telemetry, got)
    await bus.flush()
    for node in ["a", "b.example.org", "c"]:
        await bus.publish(subj.telemetry(node), node.encode())
    msgs = await got.wait_for(3)
    assert [subj.node_of(m.subject) for m in msgs] == ["a", "b.example.org", "c"]
    assert [m.data for m in msgs] == [b"a", b"b.example.org", b"c"]


async def test_queue_group_delivers_each_message_once(bus: base.Bus) -> None:
    got = conftest.Collector()
    members: list[str] = []

    def member(name: str) -> base.Handler:
        async def handle(msg: base.Msg) -> None:
            members.append(name)
            await got(msg)

        return handle

    await bus.subscribe("q.>", member("a"), queue="workers")
    await bus.subscribe("q.>", member("b"), queue="workers")
    await bus.flush()
    for i in range(20):
        await bus.publish(f"q.{i}", b"x")
    msgs = await got.wait_for(20)
    await bus.flush()
    assert sorted(m.subject for m in msgs) == sorted(f"q.{i}" for i in range(20))
    assert len(members) == 20


async def test_request_reply_round_trip(bus: base.Bus, subj: subjects.Subjects) -> None:
    async def echo(msg: base.Msg) -> None:
        await msg.respond(b"re:" + msg.data)

    await bus.subscribe(subj.command("n1"), echo)
    await bus.flush()
    reply = await bus.request(subj.command("n1"), b"hello", timeout=2)
    assert reply.data == b"re:hello"


async def test_request_without_responder_is_temporary(bus: base.Bus, subj: subjects.Subjects) -> None:
    with pytest.raises(errors.TemporaryError):
        await bus.request(subj.command("nobody"), b"x", timeout=0.5)


async def stored_in(bus: base.Bus, stream: str) -> int:
    if isinstance(bus, memory.MemoryBus):
        return len(bus.streams[stream].messages)
    assert isinstance(bus, natsbus.NatsBus)
    return int((await bus.js.stream_info(stream)).state.messages)


async def test_durable_publish_deduplicates_by_msg_id(bus: base.Bus, subj: subjects.Subjects) -> None:
    assert await bus.publish_durable(subj.events("n1"), b"e1", msg_id="id-1") is True
    assert await bus.publish_durable(subj.events("n1"), b"e1", msg_id="id-1") is False
    assert await bus.publish_durable(subj.events("n1"), b"e2", msg_id="id-2") is True
    assert await stored_in(bus, subj.stream_events) == 2


async def test_durable_publish_without_a_stream_is_temporary(bus: base.Bus) -> None:
    with pytest.raises(errors.TemporaryError):
        await bus.publish_durable("nostream.x", b"x", msg_id="m1", timeout=1)


async def test_handler_exception_does_not_stop_delivery(bus: base.Bus) -> None:
    got = conftest.Collector()

    async def flaky(msg: base.Msg) -> None:
        if msg.data == b"boom":
            raise RuntimeError("handler bug")
        await got(msg)

    await bus.subscribe("f.x", flaky)
    await bus.flush()
    for data in [b"1", b"boom", b"2"]:
        await bus.publish("f.x", data)
    msgs = await got.wait_for(2)
    assert [m.data for m in msgs] == [b"1", b"2"]


@pytest.mark.parametrize(
    ("pattern", "subject", "matches"),
    [
        ("healer.telemetry.*", "healer.telemetry.n1", True),
        ("healer.telemetry.*", "healer.telemetry.n1.x", False),
        ("healer.incidents.>", "healer.incidents.opened.n1", True),
        ("healer.incidents.>", "healer.incidents", False),
        ("a.*.c", "a.b.c", True),
        ("a.*.c", "a.b.d", False),
        ("a.b", "a.b", True),
        ("a.b", "a.b.c", False),
        (">", "anything.at.all", True),
    ],
)
def test_memory_bus_matches_like_nats(pattern: str, subject: str, matches: bool) -> None:
    assert subjects.subject_matches(pattern, subject) is matches


async def test_memory_bus_outage_raises_temporary(memory_bus: memory.MemoryBus) -> None:
    memory_bus.set_connected(False)
    assert not memory_bus.connected
    with pytest.raises(errors.TemporaryError):
        await memory_bus.publish("a.b", b"x")


@given(st.text(min_size=1, max_size=40))
def test_node_names_escape_into_exactly_one_token(node: str) -> None:
    subj = subjects.Subjects()
    token = subjects.escape_node(node)
    assert "." not in token
    assert "*" not in token
    assert ">" not in token
    assert subjects.unescape_node(token) == node
    assert subj.node_of(subj.telemetry(node)) == node


async def test_provisioning_is_idempotent_and_applies_changes(
    nats_server: embedded.EmbeddedServer, subj: subjects.Subjects
) -> None:
    bus = await natsbus.NatsBus.connect(nats_server.url)
    try:
        await provision.ensure(bus, subj, config.NatsSettings())
        await provision.ensure(bus, subj, config.NatsSettings())
        await provision.ensure(bus, subj, config.NatsSettings(telemetry_max_age_s=7200, lease_ttl_s=20))
        assert (await bus.js.stream_info("HEALER_TELEMETRY")).config.max_age == 7200
        await provision.ensure(bus, subj, config.NatsSettings(telemetry_max_age_s=600, lease_ttl_s=20))
        assert (await bus.js.stream_info("HEALER_TELEMETRY")).config.max_age == 7200, "never lowered"
        assert (await bus.js.stream_info("HEALER_EVENTS")).config.subjects == ["healer.events.*"]
        assert (await bus.js.stream_info("HEALER_INCIDENTS")).config.subjects == ["healer.incidents.>"]
        assert (await bus.js.stream_info("KV_healer-leases")).config.max_age == 20
        kv = await bus.js.key_value("healer-state")
        rev = await kv.put("k", b"v")
        assert (await kv.get("k")).revision == rev
    finally:
        await bus.close()


async def test_initial_connect_retries_until_the_server_appears(tmp_path: object) -> None:
    srv = embedded.EmbeddedServer(str(tmp_path) + "/late")
    connecting = asyncio.create_task(
        natsbus.NatsBus.connect(srv.url, retry=config.RetrySettings(initial_delay_s=0.05, max_delay_s=0.2))
    )
    await asyncio.sleep(0.5)
    assert not connecting.done()
    await asyncio.to_thread(srv.start)
    try:
        bus = await asyncio.wait_for(connecting, 10)
        assert bus.connected
        await bus.close()
    finally:
        srv.stop()


async def test_a_jetstream_request_nobody_answers_ends_at_request_timeout_s(tmp_path: object) -> None:
    """A JetStream request sent into an election goes unanswered: it must end at ``request_timeout_s``,
    not at nats-py's own 5 s, so a controller acts again soon after a stream's new leader is elected
    (the chaos tests kill leaders on a real cluster). Here a subscriber on the API subject that never
    answers stands in for the leaderless stream (a server without JetStream, so none answers for it)."""
    srv = embedded.EmbeddedServer(str(tmp_path) + "/nojs", jetstream=False)
    await asyncio.to_thread(srv.start)
    bus = await natsbus.NatsBus.connect(srv.url, nats_settings=config.NatsSettings(request_timeout_s=0.3))
    try:
        silent = await bus.nc.subscribe("$JS.API.STREAM.INFO.quiet")
        await bus.nc.flush()
        started = asyncio.get_running_loop().time()
        with pytest.raises(TimeoutError):
            await bus.js.stream_info("quiet")
        waited = asyncio.get_running_loop().time() - started
        assert waited < 4.0, f"ended by request_timeout_s (0.3 s), not nats-py's default 5 s: {waited}"
        assert silent.pending_msgs == 1, "the request reached a subscriber, which never answered"
        await silent.unsubscribe()  # its unread request would hold the connection's drain 30 s
    finally:
        await bus.close()
        srv.stop()


async def test_initial_connect_gives_up_after_configured_attempts() -> None:
    url = f"nats://127.0.0.1:{embedded.free_port()}"
    with pytest.raises(errors.TemporaryError, match="cannot connect"):
        await natsbus.NatsBus.connect(
            url, retry=config.RetrySettings(initial_delay_s=0.01, max_delay_s=0.02, attempts=2)
        )


async def test_cluster_keeps_replicated_streams_when_a_node_dies(
    nats_cluster: embedded.EmbeddedCluster, subj: subjects.Subjects
) -> None:
    bus = await natsbus.NatsBus.connect(nats_cluster.url)
    try:
        await provision.ensure(bus, subj, config.NatsSettings(replicas=3))
        info = await bus.js.stream_info(subj.stream_events)
        assert info.config.num_replicas == 3
        assert await bus.publish_durable(subj.events("n1"), b"before", msg_id="b1")
        victim = next(s for s in nats_cluster.servers if s.url not in str(bus.nc.connected_url))
        victim.kill()
        # The stream may first elect a new leader: a TemporaryError, retried as the agent does.
        async with asyncio.timeout(30):
            while True:
                try:
                    assert await bus.publish_durable(subj.events("n1"), b"after", msg_id="a1", timeout=2)
                    break
                except errors.TemporaryError:
                    await asyncio.sleep(0.2)
        info = await bus.js.stream_info(subj.stream_events)
        assert info.state.messages == 2
    finally:
        await bus.close()


JS = nats.js.errors


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (
            JS.BadRequestError(code=400, err_code=10005, description="no suitable peers"),
            errors.TemporaryError,
        ),
        (
            JS.ServerError(code=503, err_code=10008, description="temporarily unavailable"),
            errors.TemporaryError,
        ),
        (JS.BadRequestError(code=400, err_code=10052, description="replicas > 1"), errors.PermanentError),
    ],
)
async def test_provisioning_failures_are_classified(error: Exception, expected: type[Exception]) -> None:
    """A replica whose server is offline or not yet known (10005) and server-side errors are worth a
    retry; a configuration JetStream refuses is not. (A real cluster shows 10005 only for an instant
    while it forms, too briefly to provoke in a test: JetStream's own reply is stood in for.)"""

    class RefusingJetStream:
        async def stream_info(self, name: str) -> None:
            raise nats.js.errors.NotFoundError(code=404, err_code=10059, description="stream not found")

        async def add_stream(self, config: object) -> None:
            raise error

    class Bus:
        js = RefusingJetStream()

    with pytest.raises(expected):
        await provision.ensure(Bus(), subjects.Subjects(), config.NatsSettings(), retry_for_s=0)  # type: ignore[arg-type]


class FlakyJetStream:
    """Stands in for JetStream's API on a loaded cluster: the first ``misses`` requests go unanswered
    (nats-py's own TimeoutError), then every stream and bucket is made. None exists before: each look-up
    answers JetStream's "stream not found" (10059)."""

    def __init__(self, misses: int) -> None:
        self.misses = misses
        self.made: list[str] = []

    async def _answer(self, name: str) -> None:
        if self.misses > 0:
            self.misses -= 1
            raise nats.errors.TimeoutError
        self.made.append(name)

    async def stream_info(self, name: str) -> None:
        if self.misses > 0:
            self.misses -= 1
            raise nats.errors.TimeoutError
        raise nats.js.errors.NotFoundError(code=404, err_code=10059, description="stream not found")

    async def add_stream(self, config: nats.js.api.StreamConfig) -> None:
        await self._answer(config.name or "")

    async def create_key_value(self, config: nats.js.api.KeyValueConfig) -> None:
        await self._answer(config.bucket)


async def test_provisioning_retries_unanswered_requests_then_makes_everything() -> None:
    """A JetStream request unanswered while a cluster forms (CI saw it once on a fresh 3-node cluster)
    is retried after a pause, not raised: every stream and bucket is then made."""
    js = FlakyJetStream(misses=2)
    slept: list[float] = []

    class Bus:
        pass

    bus = Bus()
    bus.js = js  # type: ignore[attr-defined]

    async def sleep(s: float) -> None:
        slept.append(s)

    plan = await provision.ensure(bus, subjects.Subjects(), config.NatsSettings(), sleep=sleep)  # type: ignore[arg-type]
    assert slept == [1.0, 1.0]
    assert js.made == [s.name for s in plan.streams] + [b.bucket for b in plan.buckets]


async def test_provisioning_gives_up_after_its_retry_window() -> None:
    """A JetStream that never answers fails ``ensure`` once the window has passed (the clock is the
    test's), so a controller pointed at a server without JetStream still exits with a clear error."""
    now = [0.0]

    async def sleep(s: float) -> None:
        now[0] += s

    class Bus:
        js = FlakyJetStream(misses=10**6)

    with pytest.raises(errors.TemporaryError, match="JetStream not available"):
        await provision.ensure(
            Bus(),  # type: ignore[arg-type]
            subjects.Subjects(),
            config.NatsSettings(),
            retry_for_s=5,
            sleep=sleep,
            clock=lambda: now[0],
        )
    assert now[0] == 5.0


def test_a_cluster_that_fails_to_start_leaves_no_process_behind(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start that times out (a loaded machine) stops what it started: no test leaks a nats-server."""
    started: list[int] = []
    real_start = embedded.EmbeddedServer.start

    def remember(self: embedded.EmbeddedServer, *, wait: bool = True, timeout: float = 20.0) -> None:
        real_start(self, wait=wait, timeout=timeout)
        assert self._proc is not None
        started.append(self._proc.pid)

    monkeypatch.setattr(embedded.EmbeddedServer, "start", remember)
    cluster = embedded.EmbeddedCluster(tmp_path / "cluster", size=3)
    with pytest.raises(errors.HealerError, match="not ready after 0"):
        cluster.start(timeout=0.0)
    assert len(started) == 3
    assert [pid for pid in started if pathlib.Path(f"/proc/{pid}").exists()] == [], "all reaped"
