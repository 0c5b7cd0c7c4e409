"""The generated authorization, enforced by a real nats-server: what each identity can and cannot do.

One server per module runs with ``auth.conf`` from ``healer nats config``; every client connects with
the settings fragment generated for its identity (seed file + inbox prefix), through ``NatsBus``.

Denials are checked without waiting on time: nats-server answers a forbidden publish or subscribe with
``-ERR 'Permissions Violation ...'`` before it answers the PING that ``flush`` sends, so after ``flush``
the violation has been logged; and a spy subscribed with controller rights receives messages from one
publisher in order, so when the allowed message sent *after* a forbidden one arrives first, the
forbidden one was never delivered.
"""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import AsyncIterator, Iterator

import nats
import nats.errors
import pytest
import structlog
from nats.js import api as js_api
from structlog.testing import capture_logs

from healer import config, errors
from healer.agent import daemon
from healer.bus import base, embedded, provision, subjects
from healer.bus import nats as natsbus
from healer.schemas import codec, incidents
from healer.security import natsconf
from healer.sim import node_source
from tests.agent import test_runner as agent_tests

NODE_A = "gpu-a.dc1.example.com"
NODE_B = "gpu-b"
SUBJ = subjects.Subjects()

pytestmark = pytest.mark.nats


class Fleet:
    def __init__(self, srv: embedded.EmbeddedServer, result: natsconf.Result) -> None:
        self.srv = srv
        self.result = result

    async def connect(self, role: str, name: str) -> natsbus.NatsBus:
        settings = config.load(self.result.settings_files[(role, name)], env={})
        ns = settings.nats.model_copy(update={"url": self.srv.url})
        return await natsbus.NatsBus.connect(
            self.srv.url, name=f"{role}:{name}", nats_settings=ns, retry=config.RetrySettings(attempts=1)
        )


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    base_dir = tmp_path_factory.mktemp("secured")
    inventory = natsconf.Inventory(nodes=[NODE_A, NODE_B], feeds=["siem"])
    result = natsconf.generate(inventory, base_dir / "auth")
    srv = embedded.EmbeddedServer(base_dir / "nats", extra_config=result.auth_conf.read_text())
    srv.start()
    try:
        fleet = Fleet(srv, result)

        async def provision_as_controller() -> None:
            ctl = await fleet.connect("controller", "controller")
            try:
                await provision.ensure(ctl, SUBJ, config.NatsSettings())
            finally:
                await ctl.close()

        asyncio.run(provision_as_controller())
        yield fleet
    finally:
        srv.stop()


@pytest.fixture
async def controller(fleet: Fleet) -> AsyncIterator[natsbus.NatsBus]:
    bus = await fleet.connect("controller", "controller")
    yield bus
    await bus.close()


@pytest.fixture
async def node_a(fleet: Fleet) -> AsyncIterator[natsbus.NatsBus]:
    bus = await fleet.connect("node", NODE_A)
    yield bus
    await bus.close()


@pytest.fixture
async def node_b(fleet: Fleet) -> AsyncIterator[natsbus.NatsBus]:
    bus = await fleet.connect("node", NODE_B)
    yield bus
    await bus.close()


@pytest.fixture
async def feed(fleet: Fleet) -> AsyncIterator[natsbus.NatsBus]:
    bus = await fleet.connect("feed", "siem")
    yield bus
    await bus.close()


class Spy:
    """Controller-rights subscriber on every healer subject, keeping what arrives in order."""

    def __init__(self) -> None:
        self.received: asyncio.Queue[base.Msg] = asyncio.Queue()

    async def attach(self, bus: natsbus.NatsBus, *subjects_: str) -> None:
        for s in subjects_:
            await bus.subscribe(s, self._on)
        await bus.flush()

    async def _on(self, msg: base.Msg) -> None:
        await self.received.put(msg)

    async def next_subject(self) -> str:
        return (await asyncio.wait_for(self.received.get(), 5.0)).subject


def denials(logs: list[structlog.typing.EventDict]) -> list[str]:
    """The denied operations logged by NatsBus (nats-py lowercases the server's message)."""
    return [str(e["error"]).lower() for e in logs if e["event"] == "nats.permission_denied"]


async def test_node_cannot_publish_another_nodes_telemetry(
    controller: natsbus.NatsBus, node_a: natsbus.NatsBus
) -> None:
    spy = Spy()
    await spy.attach(controller, SUBJ.all_telemetry)
    with capture_logs() as logs:
        await node_a.publish(SUBJ.telemetry(NODE_B), b"forged")
        await node_a.publish(SUBJ.telemetry(NODE_A), b"own")
        await node_a.flush()
    assert any(SUBJ.telemetry(NODE_B).lower() in d for d in denials(logs)), logs
    assert await spy.next_subject() == SUBJ.telemetry(NODE_A)


async def test_node_cannot_command_another_node(
    controller: natsbus.NatsBus, node_a: natsbus.NatsBus, node_b: natsbus.NatsBus
) -> None:
    spy = Spy()
    await spy.attach(controller, SUBJ.all_commands, SUBJ.all_telemetry)
    victim = Spy()
    await victim.attach(node_b, SUBJ.command(NODE_B))
    with capture_logs() as logs:
        await node_a.publish(SUBJ.command(NODE_B), b"set power 100")
        await node_a.publish(SUBJ.telemetry(NODE_A), b"own")
        await node_a.flush()
    assert any(SUBJ.command(NODE_B).lower() in d for d in denials(logs))
    assert await spy.next_subject() == SUBJ.telemetry(NODE_A)
    assert victim.received.empty()


async def test_node_cannot_publish_incidents(controller: natsbus.NatsBus, node_a: natsbus.NatsBus) -> None:
    spy = Spy()
    await spy.attach(controller, SUBJ.all_incidents, SUBJ.all_telemetry)
    incident = SUBJ.incident(incidents.Change.OPENED, NODE_B)
    with capture_logs() as logs:
        await node_a.publish(incident, b"{}")
        await node_a.publish(SUBJ.telemetry(NODE_A), b"own")
        await node_a.flush()
    assert any(incident.lower() in d for d in denials(logs))
    assert await spy.next_subject() == SUBJ.telemetry(NODE_A)


async def test_node_cannot_listen_to_other_commands_or_replies(node_a: natsbus.NatsBus) -> None:
    with capture_logs() as logs:
        await node_a.subscribe(SUBJ.command(NODE_B), _ignore)
        await node_a.subscribe(SUBJ.all_commands, _ignore)
        await node_a.subscribe("_INBOX.>", _ignore)
        await node_a.flush()
    found = denials(logs)
    assert len(found) == 3, found
    assert all("subscription" in d for d in found)


async def test_node_publishes_its_own_telemetry_and_durable_events(
    controller: natsbus.NatsBus, node_a: natsbus.NatsBus
) -> None:
    spy = Spy()
    await spy.attach(controller, SUBJ.all_telemetry)
    with capture_logs() as logs:
        await node_a.publish(SUBJ.telemetry(NODE_A), b"frame")
        stored = await node_a.publish_durable(SUBJ.events(NODE_A), b"{}", msg_id="evt-own-1")
    assert stored is True  # the JetStream ack came back on the node's own inbox
    assert await spy.next_subject() == SUBJ.telemetry(NODE_A)
    assert denials(logs) == []
    info = await controller.js.stream_info(SUBJ.stream_events)
    assert info.state.messages >= 1


async def test_node_answers_its_own_commands(controller: natsbus.NatsBus, node_a: natsbus.NatsBus) -> None:
    async def answer(msg: base.Msg) -> None:
        await msg.respond(b"ok:" + msg.data)

    await node_a.subscribe(SUBJ.command(NODE_A), answer)
    await node_a.flush()
    reply = await controller.request(SUBJ.command(NODE_A), b"restore", timeout=5.0)
    assert reply.data == b"ok:restore"


async def test_controller_publishes_incidents_and_reads_events(
    controller: natsbus.NatsBus, node_b: natsbus.NatsBus
) -> None:
    stored = await controller.publish_durable(
        SUBJ.incident(incidents.Change.OPENED, NODE_B), b"{}", msg_id="inc-ctl-1"
    )
    assert stored is True
    await node_b.publish_durable(SUBJ.events(NODE_B), b"{}", msg_id="evt-b-1")
    sub = await controller.js.pull_subscribe(SUBJ.all_events, stream=SUBJ.stream_events)
    msgs = await sub.fetch(100, timeout=5.0)
    assert SUBJ.events(NODE_B) in {m.subject for m in msgs}


async def test_feed_reads_incidents_through_a_consumer(
    controller: natsbus.NatsBus, feed: natsbus.NatsBus
) -> None:
    subject = SUBJ.incident(incidents.Change.RESOLVED, NODE_A)
    await controller.publish_durable(subject, b'{"x": 1}', msg_id="inc-feed-1")
    with capture_logs() as logs:
        durable = await feed.js.pull_subscribe(
            SUBJ.all_incidents, durable="siem", stream=SUBJ.stream_incidents
        )
        pulled = await durable.fetch(100, timeout=5.0)
        for m in pulled:
            await m.ack()
        push = await feed.js.subscribe(SUBJ.all_incidents)  # stream looked up by subject
        pushed = await push.next_msg(timeout=5.0)
        await push.unsubscribe()
    assert subject in {m.subject for m in pulled}
    assert pushed.subject.startswith(f"{SUBJ.prefix}.incidents.")
    assert denials(logs) == []


async def test_controller_holds_leases_and_state_in_kv_and_a_node_cannot_touch_them(
    controller: natsbus.NatsBus, node_a: natsbus.NatsBus
) -> None:
    leases = await controller.js.key_value(SUBJ.kv_leases)
    revision = await leases.put("leader", b"controller-0")
    assert (await leases.get("leader")).revision == revision
    watcher = await leases.watch("leader")
    # nats-py leaves KeyValue.KeyWatcher's methods unannotated
    seen = await watcher.updates(timeout=5.0)  # type: ignore[no-untyped-call]
    assert seen is not None
    assert seen.value == b"controller-0"
    await watcher.stop()  # type: ignore[no-untyped-call]
    state = await controller.js.key_value(SUBJ.kv_state)
    await state.put("breaker", b"closed")
    with capture_logs() as logs:
        await node_a.publish(f"$KV.{SUBJ.kv_leases}.leader", b"node-a")  # take the lead by hand
        await node_a.flush()
    assert any(SUBJ.kv_leases in d for d in denials(logs))
    assert (await leases.get("leader")).value == b"controller-0"


async def test_a_node_reads_the_leases_and_nothing_else_of_jetstream(
    controller: natsbus.NatsBus, node_a: natsbus.NatsBus
) -> None:
    """The one JetStream right a node has beyond publishing its events: reading a lease (to check a new
    fencing token against it). The state bucket and the other streams stay closed to it."""
    leases = await controller.js.key_value(SUBJ.kv_leases)
    revision = await leases.put("leader.shard-0", b'{"holder": "controller-0"}')
    found = await node_a.last_message(SUBJ.stream_leases, SUBJ.lease_subject("leader.shard-0"))
    assert found == (revision, b'{"holder": "controller-0"}')
    state = await controller.js.key_value(SUBJ.kv_state)
    await state.put("breaker", b"closed")
    with capture_logs() as logs, pytest.raises(errors.HealerError):
        await node_a.last_message(f"KV_{SUBJ.kv_state}", f"$KV.{SUBJ.kv_state}.breaker")
    assert any(f"kv_{SUBJ.kv_state}" in d for d in denials(logs))


async def test_feed_cannot_read_telemetry(feed: natsbus.NatsBus) -> None:
    with capture_logs() as logs:
        await feed.subscribe(SUBJ.all_telemetry, _ignore)
        attempt = asyncio.create_task(
            feed.js.pull_subscribe(SUBJ.all_telemetry, durable="steal", stream=SUBJ.stream_telemetry)
        )
        while len(denials(logs)) < 2 and not attempt.done():
            await feed.flush()
        attempt.cancel()
        with pytest.raises((asyncio.CancelledError, nats.errors.TimeoutError)):
            await attempt
    found = denials(logs)
    assert any("subscription" in d and SUBJ.all_telemetry in d for d in found)
    assert any(SUBJ.stream_telemetry.lower() in d for d in found), found


async def test_feed_cannot_publish_incidents_or_commands(feed: natsbus.NatsBus) -> None:
    with capture_logs() as logs:
        await feed.publish(SUBJ.incident(incidents.Change.OPENED, NODE_A), b"{}")
        await feed.publish(SUBJ.command(NODE_A), b"{}")
        await feed.flush()
    assert len(denials(logs)) == 2


async def test_a_client_without_credentials_is_refused(fleet: Fleet) -> None:
    with pytest.raises(errors.TemporaryError):
        await natsbus.NatsBus.connect(fleet.srv.url, name="anon", retry=config.RetrySettings(attempts=1))


async def test_a_seed_not_in_the_config_is_refused(fleet: Fleet, tmp_path: pathlib.Path) -> None:
    stranger = tmp_path / "stranger.nk"
    stranger.write_bytes(natsconf.new_seed())
    ns = config.NatsSettings(url=fleet.srv.url, nkey_seed_file=str(stranger))
    with pytest.raises(errors.TemporaryError):
        await natsbus.NatsBus.connect(
            fleet.srv.url, name="stranger", nats_settings=ns, retry=config.RetrySettings(attempts=1)
        )


async def _ignore(msg: base.Msg) -> None:
    return None


async def test_the_real_agent_works_under_its_node_identity(
    fleet: Fleet, controller: natsbus.NatsBus, tmp_path: pathlib.Path
) -> None:
    """The agent as shipped (frames, spooled events through JetStream, power commands) needs no right
    beyond its node permissions: nothing is denied and everything arrives."""
    got = agent_tests.Frames()
    await controller.subscribe(SUBJ.telemetry(NODE_A), got)
    await controller.flush()
    stored = await controller.js.pull_subscribe(
        SUBJ.events(NODE_A),
        stream=SUBJ.stream_events,
        config=js_api.ConsumerConfig(deliver_policy=js_api.DeliverPolicy.NEW),
    )
    with capture_logs() as logs:
        node_bus = await fleet.connect("node", NODE_A)
        agent = daemon.Agent(
            node=NODE_A, source=node_source.SimSource(NODE_A, gpus=2, seed=1), bus=node_bus,
            state_dir=tmp_path, interval_s=0.05,
        )  # fmt: skip
        run = agent_tests.Running(agent)
        try:
            await got.wait(lambda fs: len(fs) >= 1)
            token = await agent_tests.hold_lease(controller, SUBJ)
            cmd = agent_tests.command(
                NODE_A, "set_power_limit", gpu_index=1, percent_of_default=80, token=token
            )
            reply = await controller.request(SUBJ.command(NODE_A), codec.encode(cmd), timeout=5.0)
            assert codec.decode_command_result(reply.data).status == "applied"
            forged = agent_tests.command(NODE_A, "restore_power_limit", gpu_index=1, token=10**15)
            reply = await controller.request(SUBJ.command(NODE_A), codec.encode(forged), timeout=5.0)
            refused = codec.decode_command_result(reply.data)
            assert refused.status == "refused", "checked against the lease with node rights alone"
            assert "no lease's" in refused.detail
            (first,) = await stored.fetch(1, timeout=10.0)
            assert codec.decode_event(first.data).kind == "agent_start"
        finally:
            await run.close()
            await node_bus.close()
    assert denials(logs) == []
