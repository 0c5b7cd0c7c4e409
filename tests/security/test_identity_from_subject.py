"""A node's own credentials cannot get another node cordoned (DESIGN §8, issue #12).

nats-server lets node A publish only on its own subjects; what A writes in a message body is still its
own claim. Against a real server running the ``healer nats config`` identities, with a real controller
admitting the fleet from the same nodes file: A publishing on its own subjects a frame and an XID whose
bodies name B is rejected and counted, and B is never acted on, while A's own XID is.
"""

from __future__ import annotations

import pathlib
import time
from collections.abc import AsyncIterator, Iterator

import pytest

from healer import config, testing
from healer.bus import base, embedded, provision, subjects
from healer.bus import nats as natsbus
from healer.controller.core import service
from healer.schemas import codec, events, telemetry
from healer.security import natsconf
from healer.sim import node_source
from tests.conftest import until
from tests.controller.conftest import metric

NODE_A = "gpu-a.dc1.example.com"
NODE_B = "gpu-b"
SUBJ = subjects.Subjects()
XID_RULES = (
    "rules:\n  - id: xid-fatal\n    description: fatal XID\n    on_event: {kind: xid, xid: [48]}\n"
    "    scope: gpu\n    severity: critical\n    actions: [cordon]\n"
)

pytestmark = pytest.mark.nats


class Secured:
    def __init__(
        self, srv: embedded.EmbeddedServer, result: natsconf.Result, nodes_file: pathlib.Path
    ) -> None:
        self.srv = srv
        self.result = result
        self.nodes_file = nodes_file

    async def connect(self, role: str, name: str) -> natsbus.NatsBus:
        settings = config.load(self.result.settings_files[(role, name)], env={})
        ns = settings.nats.model_copy(update={"url": self.srv.url})
        return await natsbus.NatsBus.connect(
            self.srv.url, name=f"{role}:{name}", nats_settings=ns, retry=config.RetrySettings(attempts=1)
        )


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    base_dir = tmp_path_factory.mktemp("identity")
    nodes_file = base_dir / "nodes.yaml"
    nodes_file.write_text(f"nodes: [{NODE_A}, {NODE_B}]\n")
    result = natsconf.generate(natsconf.load_inventory(nodes_file), base_dir / "auth")
    srv = embedded.EmbeddedServer(base_dir / "nats", extra_config=result.auth_conf.read_text())
    srv.start()
    try:
        yield Secured(srv, result, nodes_file)
    finally:
        srv.stop()


@pytest.fixture
async def controller(
    secured: Secured, tmp_path: pathlib.Path
) -> AsyncIterator[tuple[service.Controller, testing.RecordingActuator, list[str]]]:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "xid.yaml").write_text(XID_RULES)
    bus = await secured.connect("controller", "controller")
    await provision.ensure(bus, SUBJ, config.NatsSettings(lease_ttl_s=2))
    opened: list[str] = []

    async def on_incident(msg: base.Msg) -> None:
        if not msg.subject.startswith("healer.incidents.rules"):
            opened.append(codec.decode_incident(msg.data).data.node)

    await bus.subscribe(SUBJ.all_incidents, on_incident)
    settings = config.Settings(
        nats=config.NatsSettings(url=secured.srv.url, lease_ttl_s=2),
        controller=config.ControllerSettings(
            rules_dir=str(rules), tick_s=0.2, mode="enforce", admission="file",
            inventory_file=str(secured.nodes_file),
        ),
    )  # fmt: skip
    actuator = testing.RecordingActuator()
    ctl = await service.build(settings, bus, scheduler=actuator)
    await ctl.start()
    await bus.flush()  # the controller's subscriptions are registered before any node publishes
    try:
        yield ctl, actuator, opened
    finally:
        await ctl.stop()
        await bus.close()


def frame(node: str) -> telemetry.NodeFrame:
    return telemetry.NodeFrame(
        node=node, ts=time.time(), seq=1, boot_id="b", agent_version="t", source="sim", gpus_expected=2,
        gpus=node_source.SimSource(node, gpus=2, seed=1).sample().gpus,
    )  # fmt: skip


async def test_node_a_cannot_get_node_b_cordoned_with_its_own_credentials(
    secured: Secured, controller: tuple[service.Controller, testing.RecordingActuator, list[str]]
) -> None:
    ctl, actuator, opened = controller
    await until(lambda: ctl.leader)
    node_a = await secured.connect("node", NODE_A)
    try:
        await node_a.publish(SUBJ.telemetry(NODE_A), codec.encode(frame(NODE_B)))
        await node_a.publish(SUBJ.telemetry(NODE_A), codec.encode(frame(NODE_A)))
        forged = events.new(NODE_B, "xid", gpu_index=0, xid=48, message="forged")
        await node_a.publish_durable(SUBJ.events(NODE_A), codec.encode(forged), msg_id=forged.id)
        own = events.new(NODE_A, "xid", gpu_index=1, xid=48, message="real")
        await node_a.publish_durable(SUBJ.events(NODE_A), codec.encode(own), msg_id=own.id)
        await until(lambda: len(actuator.executed()) == 1)
        await until(lambda: opened == [NODE_A, NODE_A])  # opened, then the action
    finally:
        await node_a.close()
    assert [(r.kind, r.node) for r in actuator.executed()] == [("cordon", NODE_A)]
    rejected = "messages_rejected_total"
    assert metric(ctl.metrics, rejected, kind="frame", reason="identity_mismatch") == 1
    assert metric(ctl.metrics, rejected, kind="event", reason="identity_mismatch") == 1
    assert ctl.nodes == {NODE_A}
    assert NODE_B not in opened
