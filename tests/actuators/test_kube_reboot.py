"""Kubernetes reboot through the node's agent, on the fake API server: only after healer's cordon and a
complete eviction, recorded on the node, completed when the kubelet reports a new bootID, returned by
uncordon. The agent is the real CommandExecutor behind the GPU recovery actuator on the in-memory bus."""

from __future__ import annotations

import pathlib
from collections.abc import AsyncIterator, Iterator

import pytest

from healer import config
from healer.actuators import base, gpu_reset
from healer.actuators import kubernetes as kube
from healer.agent import execution
from healer.bus import base as bus_base
from healer.bus import memory, subjects
from healer.schemas import codec
from healer.sim import node_source
from tests.actuators import test_kube_actuator as kube_tests
from tests.fakes import fake_kube_api


class Host:
    """The node's host: ``reboot`` is what ``agent.reboot_command`` would run."""

    def __init__(self) -> None:
        self.reboots = 0

    def reboot(self) -> str:
        self.reboots += 1
        return "reboot queued"


@pytest.fixture
def api() -> Iterator[fake_kube_api.FakeKubeAPI]:
    fake = fake_kube_api.FakeKubeAPI(rbac_rules=kube_tests.rbac_rules())
    fake.start()
    fake.add_node("gpu-a")
    yield fake
    fake.stop()


@pytest.fixture
async def host() -> AsyncIterator[tuple[memory.MemoryBus, Host]]:
    bus = memory.MemoryBus()
    h = Host()
    src = node_source.SimSource("gpu-a", gpus=2)
    executor = execution.CommandExecutor(
        "gpu-a", src, None, gpu_indices=lambda: [0, 1], gpu=src, reboot=h.reboot
    )

    async def on_command(msg: bus_base.Msg) -> None:
        await msg.respond(codec.encode(executor.execute(codec.decode_command(msg.data))))

    await bus.subscribe(subjects.Subjects().command("gpu-a"), on_command)
    yield bus, h
    await bus.close()


@pytest.fixture
def actuator(
    api: fake_kube_api.FakeKubeAPI, tmp_path: pathlib.Path, host: tuple[memory.MemoryBus, Host]
) -> Iterator[kube.KubernetesActuator]:
    kubeconfig = tmp_path / "kubeconfig"
    api.write_kubeconfig(str(kubeconfig))
    settings = config.ActuatorSettings(kube_config=str(kubeconfig), retry_attempts=1, kube_evict_timeout_s=5)
    agent = gpu_reset.GpuRecoveryActuator(host[0], settings=settings)
    act = kube.KubernetesActuator(settings, agent=agent)
    yield act
    act.close()


async def test_a_drained_node_is_rebooted_by_its_agent_and_returned_after_the_new_boot(
    api: fake_kube_api.FakeKubeAPI, actuator: kube.KubernetesActuator, host: tuple[memory.MemoryBus, Host]
) -> None:
    api.add_pod("train", "job-0", "gpu-a")
    early = await actuator.apply(kube_tests.req("reboot_node"))
    assert early.status == "refused"
    assert "cordoned by nobody" in early.detail
    assert (await actuator.apply(kube_tests.req("cordon"))).status == "done"
    busy = await actuator.apply(kube_tests.req("reboot_node"))
    assert busy.status == "refused"
    assert busy.detail.endswith("still runs 1 pod(s) (train/job-0): migrate first")
    assert (await actuator.apply(kube_tests.req("migrate"))).status == "done"

    out = await actuator.apply(kube_tests.req("reboot_node"))
    assert out.status == "done", out.detail
    assert host[1].reboots == 1
    assert api.nodes["gpu-a"]["metadata"]["annotations"][kube.REBOOT_ANNOTATION] == "inc-7 gpu-a-boot-0"
    assert (await actuator.apply(kube_tests.req("reboot_node"))).status == "already-done"
    assert host[1].reboots == 1
    assert (await actuator.reboot_status("gpu-a")).phase is base.RebootPhase.ISSUED

    api.boot("gpu-a", ready=False)
    assert (await actuator.reboot_status("gpu-a")).phase is base.RebootPhase.ISSUED  # not Ready yet
    api.boot("gpu-a")
    assert (await actuator.reboot_status("gpu-a")).phase is base.RebootPhase.COMPLETE
    assert api.nodes["gpu-a"]["spec"]["unschedulable"] is True  # still out until validation passes

    back = await actuator.apply(kube_tests.req("uncordon"))
    assert back.status == "done"
    annotations = api.nodes["gpu-a"]["metadata"]["annotations"]
    assert kube.REBOOT_ANNOTATION not in annotations
    assert (await actuator.reboot_status("gpu-a")).phase is base.RebootPhase.NONE


async def test_an_operators_cordon_is_never_rebooted(
    api: fake_kube_api.FakeKubeAPI, actuator: kube.KubernetesActuator, host: tuple[memory.MemoryBus, Host]
) -> None:
    api.add_node("gpu-b", unschedulable=True)
    out = await actuator.apply(kube_tests.req("reboot_node", node="gpu-b"))
    assert out.status == "refused"
    assert "cordoned by an operator" in out.detail
    assert host[1].reboots == 0


async def test_an_agent_that_cannot_reboot_leaves_no_mark(
    api: fake_kube_api.FakeKubeAPI, actuator: kube.KubernetesActuator, host: tuple[memory.MemoryBus, Host]
) -> None:
    assert (await actuator.apply(kube_tests.req("cordon"))).status == "done"
    lonely = memory.MemoryBus()
    src = node_source.SimSource("gpu-a", gpus=1)
    ex = execution.CommandExecutor("gpu-a", src, None, gpu=src)  # no agent.reboot_command

    async def on_command(msg: bus_base.Msg) -> None:
        await msg.respond(codec.encode(ex.execute(codec.decode_command(msg.data))))

    await lonely.subscribe(subjects.Subjects().command("gpu-a"), on_command)
    assert isinstance(actuator.agent, gpu_reset.GpuRecoveryActuator)
    actuator.agent.bus = lonely
    out = await actuator.apply(kube_tests.req("reboot_node"))
    await lonely.close()
    assert out.status == "refused"
    assert "agent.reboot_command is unset" in out.detail
    assert kube.REBOOT_ANNOTATION not in api.nodes["gpu-a"]["metadata"]["annotations"]


async def test_dry_run_plans_the_mark_and_the_agent_call(
    api: fake_kube_api.FakeKubeAPI, actuator: kube.KubernetesActuator, host: tuple[memory.MemoryBus, Host]
) -> None:
    assert (await actuator.apply(kube_tests.req("cordon"))).status == "done"
    out = await actuator.apply(kube_tests.req("reboot_node", dry_run=True))
    assert out.status == "planned"
    assert out.plan[1] == "reboot_node through the agent of gpu-a"
    assert host[1].reboots == 0
