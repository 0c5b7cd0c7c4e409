"""Adding an action touches one registry entry and one actuator handler (#40): a toy scheduler verb,
``quarantine`` (label the node), defined only here, runs end to end on the memory bus. A rule asks for it,
the controller plans it, the real Kubernetes actuator (against the faithful fake API) runs the handler
registered for it, and the incident records its outcome. Nothing in healer/ knows the word."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest

from healer import actions, config
from healer.actuators import base
from healer.actuators import kubernetes as kubernetes_actuator
from healer.bus import subjects
from healer.controller.core import service
from healer.schemas import codec, events
from tests import conftest
from tests.controller.conftest import Fleet, run_until, warm
from tests.fakes import fake_kube_api

RBAC = pathlib.Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "rbac.yaml"
LABEL = "healer.example/quarantined"
TOY = "quarantine"

# 1. The registry entry: what the kind is (a scheduler verb of its own, taking nothing out of service).
QUARANTINE = actions.ActionKind(
    TOY,
    actions.ReasonParams,
    "label the node quarantined (a toy verb: tests/controller/test_toy_action.py)",
    actuator=actions.Actuator.SCHEDULER,
    scheduler_verb=TOY,
)


# 2. The actuator handler: how Kubernetes carries it out.
async def quarantine(
    self: kubernetes_actuator.KubernetesActuator, node: str, request: base.ActionRequest
) -> base.ActionOutcome:
    steps = [(f"PATCH /api/v1/nodes/{node}", {"metadata": {"labels": {LABEL: "true"}}})]
    return await self._run_steps(node, steps, request, f"quarantined {node}")


@pytest.fixture
def toy_verb() -> Iterator[None]:
    actions.register(QUARANTINE)
    kubernetes_actuator.HANDLERS.handler(TOY)(quarantine)
    try:
        yield
    finally:
        kubernetes_actuator.HANDLERS.remove(TOY)
        actions.unregister(TOY)
    assert TOY not in actions.REQUESTS
    assert TOY not in actions.RULE_KINDS


RULE = f"""
rules:
  - id: xid-quarantine
    description: fatal XID, quarantine the node
    on_event: {{kind: xid, xid: [79]}}
    severity: critical
    actions: [{TOY}]
    resolve: {{for: 1h}}
"""


async def test_a_toy_scheduler_verb_runs_end_to_end_on_the_memory_bus(
    tmp_path: pathlib.Path, toy_verb: None
) -> None:
    api = fake_kube_api.FakeKubeAPI(rbac_rules=fake_kube_api.cluster_role_rules(RBAC.read_text()))
    api.start()
    kubeconfig = tmp_path / "kubeconfig"
    api.write_kubeconfig(str(kubeconfig))
    for n in ("n1", "n2"):
        api.add_node(n)
    kube = kubernetes_actuator.KubernetesActuator(config.ActuatorSettings(kube_config=str(kubeconfig)))
    subj = subjects.Subjects()
    bus = conftest.make_memory_bus(subj)
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "toy.yaml").write_text(RULE)
    settings = config.Settings(
        controller=config.ControllerSettings.model_validate(
            {"rules_dir": str(rules), "tick_s": 0.2, "mode": "enforce", "admission": "first-seen"}
        ),
    )
    ctl = await service.build(settings, bus, scheduler=kube)
    await ctl.start()
    try:
        fleet = Fleet(bus, ["n1", "n2"])
        await run_until(fleet, lambda: ctl.leader)
        await warm(fleet)
        event = events.new("n2", "xid", gpu_index=1, xid=79)
        await bus.publish_durable(subj.events("n2"), codec.encode(event), msg_id=event.id)

        def recorded() -> list[tuple[str, str]]:
            stream = bus.stream(subj.stream_incidents)
            docs = [codec.decode_incident(m.data) for m in stream.messages]
            return [(a.kind, a.status) for d in docs for a in d.data.actions if a.kind == TOY]

        await run_until(fleet, lambda: (TOY, "done") in recorded())
        assert api.nodes["n2"]["metadata"]["labels"][LABEL] == "true"
        assert LABEL not in api.nodes["n1"]["metadata"]["labels"]
        assert not api.nodes["n2"]["spec"].get("unschedulable")  # the toy verb, not a cordon
    finally:
        await ctl.stop()
        kube.close()
        api.stop()


def test_a_handler_for_an_unregistered_verb_is_refused_at_once() -> None:
    """A typo in a handler's verb fails where it is written, not as a request that fails later."""
    with pytest.raises(ValueError, match="no registered request"):
        kubernetes_actuator.HANDLERS.handler("quarantine_typo")(quarantine)


def test_a_kind_is_registered_once() -> None:
    with pytest.raises(ValueError, match="already registered"):
        actions.register(actions.spec("cordon"))
