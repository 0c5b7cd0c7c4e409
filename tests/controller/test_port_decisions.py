"""Port incidents without NATS or a clock: the key's port part, correlation by port, the cordon's
hand-over, what the feed and the Alertmanager bridge say about the port, and old KV incidents."""

from __future__ import annotations

from typing import Any

from healer import actions, config
from healer.bus import memory
from healer.controller.incidents import book, correlation, decide, gates
from healer.controller.store import kv
from healer.feed import alertmanager
from healer.rules import engine, ruleset
from healer.schemas import fields, incidents

SETTINGS = config.ControllerSettings()
DOWN = ruleset.Rule(
    id="rdma-port-down", severity="major", scope=fields.Scope.PORT, description="port down",
    labels={"category": "fabric"}, actions=(actions.build("cordon", None),),
)  # fmt: skip
ERRORS = ruleset.Rule(
    id="rdma-port-errors", severity="major", scope=fields.Scope.PORT, actions=(actions.build("cordon", None),)
)
MISSING = ruleset.Rule(
    id="rdma-ports-missing",
    severity="major",
    scope=fields.Scope.NODE,
    actions=(actions.build("cordon", None),),
)
XID = ruleset.Rule(
    id="xid-fatal", severity="critical", scope=fields.Scope.GPU, actions=(actions.build("cordon", None),)
)


def fire(
    rule: ruleset.Rule, port: str | None = None, gpu: int | None = None, **evidence: Any
) -> engine.Firing:
    return engine.Firing(rule, "n1", gpu, engine.Status.FIRED, 100.0, 100.0, dict(evidence), None, port)


def opened(f: engine.Firing, incident_id: str = "inc-1") -> book.Incident:
    return decide.new_incident(f, incident_id, 100.0, incidents.Mode.ENFORCE, 1, SETTINGS)


def test_a_port_firing_opens_an_incident_keyed_and_named_by_its_port() -> None:
    f = fire(DOWN, "mlx5_3/1", port_state=1)
    assert f.key == ("rdma-port-down", "n1", None, "mlx5_3/1")
    inc = opened(f)
    assert inc.port == "mlx5_3/1"
    assert inc.key == f.key
    assert inc.summary.startswith("rdma-port-down on node n1 port mlx5_3/1")
    data = inc.data()
    assert incidents.port_of(data) == "mlx5_3/1"
    assert data.labels == {"category": "fabric", "port": "mlx5_3/1"}
    ev = incidents.build(event_id="e", cluster="c", change=incidents.Change.OPENED, data=data, ts=1.7e9)
    assert ev.subject == "node/n1/port/mlx5_3/1"
    assert alertmanager.labels_for(ev)["port"] == "mlx5_3/1"
    node = opened(fire(MISSING), "inc-2").data()
    assert incidents.port_of(node) is None
    assert "port" not in alertmanager.labels_for(
        incidents.build(event_id="e", cluster="c", change=incidents.Change.OPENED, data=node, ts=1.7e9)
    )


def test_a_port_firing_joins_only_an_incident_on_the_same_port() -> None:
    a = opened(fire(DOWN, "mlx5_3/1"), "inc-a")
    assert correlation.correlate(fire(DOWN, "mlx5_6/1"), [a], 110.0, 120.0) is None, (
        "two ports: two incidents"
    )
    assert correlation.correlate(fire(ERRORS, "mlx5_3/1"), [a], 110.0, 120.0) is a
    node_inc = opened(fire(MISSING), "inc-n")
    assert correlation.correlate(fire(DOWN, "mlx5_3/1"), [node_inc], 110.0, 120.0) is None
    assert correlation.correlate(fire(XID, gpu=1), [a], 110.0, 120.0) is None, (
        "a GPU fault never takes a port's incident"
    )
    assert correlation.correlate(fire(MISSING), [a], 110.0, 120.0) is a, "the node's one candidate"
    b = opened(fire(DOWN, "mlx5_6/1"), "inc-b")
    assert correlation.correlate(fire(MISSING), [a, b], 110.0, 120.0) is None


def test_a_skipped_uncordon_hands_the_cordon_to_the_incidents_still_holding_the_node() -> None:
    a, b = opened(fire(DOWN, "mlx5_3/1"), "inc-a"), opened(fire(DOWN, "mlx5_6/1"), "inc-b")
    a.actions[0].status, b.actions[0].status = (
        incidents.ActionStatus.DONE,
        incidents.ActionStatus.ALREADY_DONE,
    )
    assert gates.cordon_ours(a)
    assert not gates.cordon_ours(b), "its cordon found the node drained already"
    assert gates.holding(a, [a, b]) == [b]
    b.evidence[gates.HANDED_OVER] = a.id
    assert gates.cordon_ours(b)
    b.evidence[gates.LADDER_JOINED] = a.id
    assert gates.holding(a, [a, b]) == [], "an incident following a's ladder does not hold a's return"


async def test_incidents_stored_before_ports_load_as_node_or_gpu_incidents() -> None:
    store = kv.Store(memory.MemoryBus().add_bucket("state"))
    old = opened(fire(XID, gpu=1), "inc-old").model_dump(mode="json")
    del old["port"]
    for s in old["signals"]:
        del s["port"]
    await store.put(book.PREFIX + "inc-old", old)
    port = opened(fire(DOWN, "mlx5_3/1"), "inc-port")
    await store.put(book.PREFIX + "inc-port", port.model_dump(mode="json"))
    b = book.Book(store)
    assert await b.load() == 2
    loaded = b.get(("xid-fatal", "n1", 1, None))
    assert loaded is not None
    assert loaded.port is None
    again = b.get(("rdma-port-down", "n1", None, "mlx5_3/1"))
    assert again is not None
    assert again.id == "inc-port"
