"""A burst's cordons against the fake Kubernetes API server (#43): they go out concurrently, never more
than the actuator's pool at once, and a conflict or a server error on one node is that node's outcome
only."""

from __future__ import annotations

import asyncio
import pathlib
import urllib.request
from collections.abc import Iterator

import pytest
from kubernetes.client import configuration as k8s_configuration

from healer import config
from healer.actuators import base, batching, kube_client
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


async def test_calls_reuse_the_pools_connections_errors_included(
    api: fake_kube_api.FakeKubeAPI, actuator: kube.KubernetesActuator
) -> None:
    api.fail("PATCH", r"^/api/v1/nodes/gpu-07$", 409, times=1)
    api.fail("GET", r"^/api/v1/nodes/gpu-13$", 404, times=1)
    outcomes = await asyncio.gather(*(actuator.apply(cordon(n)) for n in NODES))
    for node in NODES[:5]:  # one after another: each call finds a connection free
        await actuator.apply(base.ActionRequest(incident_id=f"inc-{node}", kind="uncordon", node=node))
    assert [str(o.status) for o in outcomes].count("done") == len(NODES) - 1
    assert len(api.requests) > 3 * len(NODES)
    assert api.connections <= batching.KUBE_CONCURRENCY, (api.connections, len(api.requests))


async def test_the_environments_proxy_is_read_once_and_still_honoured(
    api: fake_kube_api.FakeKubeAPI,
    actuator: kube.KubernetesActuator,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("http_proxy", "http://proxy.invalid:3128")
    monkeypatch.setenv("no_proxy", "127.0.0.1")  # the fake is on the loopback: reached directly
    built = kube_client.build_api_client(actuator.settings)
    assert built.configuration.proxy == "http://proxy.invalid:3128"
    built.close()  # type: ignore[no-untyped-call]
    assert (await actuator.apply(cordon("gpu-01"))).status == "done"
    reads: list[int] = []
    real = urllib.request.getproxies

    def counted() -> dict[str, str]:
        reads.append(1)
        return real()

    monkeypatch.setattr(k8s_configuration, "getproxies", counted)  # the client's own name for it
    assert (await actuator.apply(cordon("gpu-02"))).status == "done"
    assert (await actuator.apply(cordon("gpu-01"))).status == "already-done"
    assert reads == []
