"""The Kubernetes actuator, through the real ``kubernetes`` client, against the strict fake API server
(tests/fakes/fake_kube_api.py) that enforces the RBAC rules shipped in deploy/kubernetes/rbac.yaml."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from typing import Any

import pytest

from healer import config, errors
from healer.actuators import base
from healer.actuators import kubernetes as kube
from tests.fakes import fake_kube_api

RBAC = pathlib.Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "rbac.yaml"


def rbac_rules() -> list[dict[str, Any]]:
    return fake_kube_api.cluster_role_rules(RBAC.read_text())


class FakeTime:
    """Eviction back-off runs on this clock: sleeping advances it, nothing really waits."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def api() -> Iterator[fake_kube_api.FakeKubeAPI]:
    fake = fake_kube_api.FakeKubeAPI(rbac_rules=rbac_rules())
    fake.start()
    fake.add_node("gpu-a")
    yield fake
    fake.stop()


@pytest.fixture
def fake_time() -> FakeTime:
    return FakeTime()


@pytest.fixture
def actuator(
    api: fake_kube_api.FakeKubeAPI, tmp_path: pathlib.Path, fake_time: FakeTime
) -> Iterator[kube.KubernetesActuator]:
    kubeconfig = tmp_path / "kubeconfig"
    api.write_kubeconfig(str(kubeconfig))
    settings = config.ActuatorSettings(
        kube_config=str(kubeconfig),
        retry_attempts=3,
        retry_initial_delay_s=0,
        retry_max_delay_s=0,
        kube_evict_timeout_s=60,
        kube_evict_backoff_s=5,
    )
    actuator = kube.KubernetesActuator(settings, sleep=fake_time.sleep, clock=fake_time.clock)
    yield actuator
    actuator.close()


def req(kind: base.RequestKind, node: str = "gpu-a", **kw: Any) -> base.ActionRequest:
    return base.ActionRequest.model_validate(
        {"incident_id": "inc-7", "kind": kind, "node": node, "summary": "XID 79 on GPU 2", **kw}
    )


def condition(node: dict[str, Any]) -> dict[str, Any]:
    conds: list[dict[str, Any]] = [c for c in node["status"]["conditions"] if c["type"] == "GpuHealthy"]
    [cond] = conds
    return cond


def writes(api: fake_kube_api.FakeKubeAPI) -> list[str]:
    return [f"{r.method} {r.path}" for r in api.requests if r.method != "GET"]


async def test_cordon_marks_the_node_as_healers_and_reports_the_condition(
    api: fake_kube_api.FakeKubeAPI, actuator: kube.KubernetesActuator
) -> None:
    outcome = await actuator.apply(req("cordon"))
    assert outcome.status == "done", outcome
    node = api.nodes["gpu-a"]
    assert node["spec"]["unschedulable"] is True
    assert node["metadata"]["annotations"]["healer.io/incident"] == "inc-7"
    assert node["spec"]["taints"] == [{"key": "healer.io/gpu-fault", "effect": "NoSchedule"}]
    cond = condition(node)
    assert (cond["status"], cond["reason"], cond["message"]) == (
        "False",
        "GpuFault",
        "healer: inc-7 XID 79 on GPU 2",
    )
    assert {r.content_type for r in api.requests if r.method == "PATCH"} == {fake_kube_api.SMP}
    assert writes(api) == ["PATCH /api/v1/nodes/gpu-a", "PATCH /api/v1/nodes/gpu-a/status"]
    assert (await actuator.apply(req("cordon"))).status == "already-done"
    assert len(writes(api)) == 2


async def test_cordon_leaves_an_operators_cordon_untouched(
    api: fake_kube_api.FakeKubeAPI, actuator: kube.KubernetesActuator
) -> None:
    api.add_node("gpu-b", unschedulable=True)
    outcome = await actuator.apply(req("cordon", "gpu-b"))
    assert outcome.status == "already-done"
    assert writes(api) == []
    uncordon = await actuator.apply(req("uncordon", "gpu-b", params={"any_incident": True}))
    assert uncordon.status == "refused"
    assert api.nodes["gpu-b"]["spec"]["unschedulable"] is True


async def test_uncordon_undoes_only_what_healer_did(
    api: fake_kube_api.FakeKubeAPI, actuator: kube.KubernetesActuator
) -> None:
    other_taint = {"key": "maintenance", "value": "bios", "effect": "NoSchedule"}
    api.add_node("gpu-c", taints=[other_taint], annotations={"team": "ml"})
    await actuator.apply(req("cordon", "gpu-c"))
    refused = await actuator.apply(req("uncordon", "gpu-c", incident_id="inc-other"))
    assert refused.status == "refused"
    outcome = await actuator.apply(req("uncordon", "gpu-c"))
    assert outcome.status == "done", outcome
    node = api.nodes["gpu-c"]
    assert "unschedulable" not in node["spec"]
    assert node["metadata"]["annotations"] == {"team": "ml"}
    assert node["spec"]["taints"] == [other_taint]
    assert condition(node)["status"] == "True"
    assert (await actuator.apply(req("uncordon", "gpu-c"))).status == "already-done"


async def test_migrate_evicts_movable_pods_and_skips_the_rest(
    api: fake_kube_api.FakeKubeAPI, actuator: kube.KubernetesActuator, fake_time: FakeTime
) -> None:
    api.add_pod("ml", "trainer", "gpu-a")
    api.add_pod("ml", "guarded", "gpu-a", pdb_refusals=2)
    api.add_pod("kube-system", "dcgm-exporter", "gpu-a", owner_kind="DaemonSet")
    api.add_pod("kube-system", "static-proxy", "gpu-a", owner_kind=None, mirror=True)
    api.add_pod("ml", "finished", "gpu-a", phase="Succeeded")
    api.add_pod("ml", "elsewhere", "gpu-z")
    outcome = await actuator.apply(req("migrate"))
    assert outcome.status == "done", outcome
    by_item = {i.item: i.status for i in outcome.items}
    assert by_item == {
        "pod ml/trainer": "done",
        "pod ml/guarded": "done",
        "pod kube-system/dcgm-exporter": "skipped",
        "pod kube-system/static-proxy": "skipped",
        "pod ml/finished": "skipped",
    }
    left = {
        ("kube-system", "dcgm-exporter"),
        ("kube-system", "static-proxy"),
        ("ml", "finished"),
        ("ml", "elsewhere"),
    }
    assert set(api.pods) == left
    assert fake_time.slept == [5, 10]
    assert api.nodes["gpu-a"]["spec"]["unschedulable"] is True


async def test_a_budget_that_never_allows_it_leaves_the_pod_reported_not_moved(
    api: fake_kube_api.FakeKubeAPI, actuator: kube.KubernetesActuator, fake_time: FakeTime
) -> None:
    api.add_pod("ml", "stuck", "gpu-a", pdb_refusals=1000)
    outcome = await actuator.apply(req("migrate"))
    assert outcome.status == "failed-temporary"
    [item] = outcome.items
    assert item.item == "pod ml/stuck"
    assert item.status == "failed-temporary"
    assert "violate the pod's disruption budget" in item.detail
    assert sum(fake_time.slept) <= 60
    assert ("ml", "stuck") in api.pods


async def test_a_pod_gone_before_its_eviction_counts_as_moved(
    api: fake_kube_api.FakeKubeAPI, actuator: kube.KubernetesActuator
) -> None:
    api.add_pod("ml", "vanishing", "gpu-a")
    api.fail("POST", r"/pods/vanishing/eviction$", 404)
    outcome = await actuator.apply(req("migrate"))
    assert outcome.status == "done"
    assert outcome.items == [
        base.ItemResult(item="pod ml/vanishing", status="already-done", detail="pod already gone")
    ]


async def test_a_conflicting_node_update_is_retried_on_fresh_state(
    api: fake_kube_api.FakeKubeAPI, actuator: kube.KubernetesActuator
) -> None:
    api.fail("PATCH", r"^/api/v1/nodes/gpu-a$", 409)
    outcome = await actuator.apply(req("cordon"))
    assert outcome.status == "done"
    assert [r.status for r in api.requests if r.path == "/api/v1/nodes/gpu-a" and r.method == "PATCH"] == [
        409,
        200,
    ]


async def test_a_failing_api_server_is_a_temporary_failure(
    api: fake_kube_api.FakeKubeAPI, actuator: kube.KubernetesActuator
) -> None:
    api.fail("GET", r"^/api/v1/nodes/gpu-a$", 500, times=10)
    outcome = await actuator.apply(req("cordon"))
    assert outcome.status == "failed-temporary"
    assert "500" in outcome.detail
    assert len(api.requests) == 3


async def test_an_unknown_node_is_a_permanent_failure_with_the_servers_text(
    actuator: kube.KubernetesActuator,
) -> None:
    outcome = await actuator.apply(req("cordon", "gpu-nope"))
    assert outcome.status == "failed-permanent"
    assert outcome.detail == '404: nodes "gpu-nope" not found'


async def test_dry_run_reads_and_writes_nothing(
    api: fake_kube_api.FakeKubeAPI, actuator: kube.KubernetesActuator
) -> None:
    api.add_pod("ml", "trainer", "gpu-a")
    outcome = await actuator.apply(req("migrate", dry_run=True))
    assert outcome.status == "planned"
    assert [p.split(" ", 2)[:2] for p in outcome.plan] == [
        ["PATCH", "/api/v1/nodes/gpu-a"],
        ["PATCH", "/api/v1/nodes/gpu-a/status"],
        ["POST", "/api/v1/namespaces/ml/pods/trainer/eviction"],
    ]
    assert writes(api) == []
    assert ("ml", "trainer") in api.pods


async def test_a_kubeconfig_that_cannot_be_read_is_a_permanent_failure(tmp_path: pathlib.Path) -> None:
    settings = config.ActuatorSettings(kube_config=str(tmp_path / "missing"))
    outcome = await kube.KubernetesActuator(settings).apply(req("cordon"))
    assert outcome.status == "failed-permanent"
    assert "Kubernetes configuration" in outcome.detail


async def test_the_taint_is_optional(api: fake_kube_api.FakeKubeAPI, tmp_path: pathlib.Path) -> None:
    api.write_kubeconfig(str(tmp_path / "kubeconfig"))
    settings = config.ActuatorSettings(kube_config=str(tmp_path / "kubeconfig"), kube_taint=False)
    actuator = kube.KubernetesActuator(settings)
    try:
        assert (await actuator.apply(req("cordon"))).status == "done"
    finally:
        actuator.close()
    assert api.nodes["gpu-a"]["spec"]["unschedulable"] is True
    assert "taints" not in api.nodes["gpu-a"]["spec"]


async def test_node_labels_come_from_one_node_list(
    api: fake_kube_api.FakeKubeAPI, actuator: kube.KubernetesActuator
) -> None:
    api.add_node("gpu-b", labels={"pool": "train", "nvidia.com/gpu.product": "H100"})
    labels = await actuator.node_labels(["gpu-a", "gpu-b", "gpu-unknown"])
    assert labels == {
        "gpu-a": {"kubernetes.io/hostname": "gpu-a"},
        "gpu-b": {"kubernetes.io/hostname": "gpu-b", "pool": "train", "nvidia.com/gpu.product": "H100"},
    }
    assert [f"{r.method} {r.path}" for r in api.requests] == ["GET /api/v1/nodes"]


async def test_node_labels_failing_is_an_error_the_caller_sees(
    api: fake_kube_api.FakeKubeAPI, actuator: kube.KubernetesActuator
) -> None:
    api.fail("GET", r"^/api/v1/nodes$", 500)
    with pytest.raises(errors.TemporaryError, match="500"):
        await actuator.node_labels(["gpu-a"])
