"""A burst's cordons against the fake Kubernetes API server (#43): they go out concurrently, never more
than the actuator's pool at once, and a conflict or a server error on one node is that node's outcome
only."""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import Iterator

import pytest

from healer import config
from healer.actuators import base, batching
from healer.actuators import kubernetes as kube
from tests.actuators.test_kube_actuator import rbac_rules
from tests.fakes import fake_kube_api

NODES = [f"gpu-{i:02d}" for i in range(40)]


@pytest.fixture
def api() -> Iterator[fake_kube_api.FakeKubeAPI]:
    fake = fake_kube_api.FakeKubeAPI(rbac_rules=rbac_rules())
    fake.start()
    for node in NODES:
        fake.add_node(node)
    fake.latency_s = 0.02
    yield fake
    fake.stop()


@pytest.fixture
def actuator(api: fake_kube_api.FakeKubeAPI, tmp_path: pathlib.Path) -> Iterator[kube.KubernetesActuator]:
    kubeconfig = tmp_path / "kubeconfig"
    api.write_kubeconfig(str(kubeconfig))
    settings = config.ActuatorSettings(
        kube_config=str(kubeconfig), retry_attempts=3, retry_initial_delay_s=0, retry_max_delay_s=0
    )
    actuator = kube.KubernetesActuator(settings)
    yield actuator
    actuator.close()


def cordon(node: str) -> base.ActionRequest:
    return base.ActionRequest(incident_id=f"inc-{node}", kind="cordon", node=node, summary="XID 48 on GPU 1")


async def test_a_bursts_cordons_go_out_concurrently_within_the_pool(
    api: fake_kube_api.FakeKubeAPI, actuator: kube.KubernetesActuator
) -> None:
    outcomes = await asyncio.gather(*(actuator.apply(cordon(n)) for n in NODES))
    assert [o.status for o in outcomes] == ["done"] * len(NODES)
    assert 1 < api.max_in_flight <= batching.KUBE_CONCURRENCY, api.max_in_flight
    for node in NODES:
        assert api.nodes[node]["spec"]["unschedulable"] is True
        assert api.nodes[node]["metadata"]["annotations"][kube.ANNOTATION] == f"inc-{node}"


async def test_a_conflict_or_a_server_error_is_that_nodes_outcome_only(
    api: fake_kube_api.FakeKubeAPI, actuator: kube.KubernetesActuator
) -> None:
    api.fail("PATCH", r"^/api/v1/nodes/gpu-07$", 409, times=1)  # retried on fresh state: done
    api.fail("PATCH", r"^/api/v1/nodes/gpu-13$", 500, times=10)  # past every retry
    outcomes = dict(
        zip(NODES, await asyncio.gather(*(actuator.apply(cordon(n)) for n in NODES)), strict=True)
    )
    assert outcomes["gpu-07"].status == "done"
    assert outcomes["gpu-13"].status == "failed-temporary"
    assert "500" in outcomes["gpu-13"].detail
    assert {n for n, o in outcomes.items() if o.status != "done"} == {"gpu-13"}
    assert api.nodes["gpu-13"]["spec"].get("unschedulable") is not True
    assert all(api.nodes[n]["spec"]["unschedulable"] is True for n in NODES if n != "gpu-13")
