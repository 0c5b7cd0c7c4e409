"""deploy/kubernetes/rbac.yaml grants exactly the calls the Kubernetes actuator makes, no more, and the
fake API server answers like the real one to what it does not serve."""

from __future__ import annotations

import json
import pathlib
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from healer import config
from healer.actuators import base
from healer.actuators import kubernetes as kube
from tests.fakes import fake_kube_api

RBAC = pathlib.Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "rbac.yaml"


def rbac_rules() -> list[dict[str, Any]]:
    return fake_kube_api.cluster_role_rules(RBAC.read_text())


def granted(rules: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(v, r) for rule in rules for r in rule["resources"] for v in rule["verbs"]}


@pytest.fixture
def api() -> Iterator[fake_kube_api.FakeKubeAPI]:
    fake = fake_kube_api.FakeKubeAPI(rbac_rules=rbac_rules())
    fake.start()
    fake.add_node("gpu-a")
    yield fake
    fake.stop()


def make_actuator(api: fake_kube_api.FakeKubeAPI, tmp_path: pathlib.Path) -> kube.KubernetesActuator:
    api.write_kubeconfig(str(tmp_path / "kubeconfig"))
    settings = config.ActuatorSettings(kube_config=str(tmp_path / "kubeconfig"), retry_attempts=1)
    return kube.KubernetesActuator(settings)


async def test_rbac_grants_exactly_the_calls_the_actuator_makes(
    api: fake_kube_api.FakeKubeAPI, tmp_path: pathlib.Path
) -> None:
    api.add_pod("ml", "trainer", "gpu-a")
    actuator = make_actuator(api, tmp_path)
    try:
        for kind in ("cordon", "migrate", "uncordon"):
            request = base.ActionRequest(incident_id="inc-1", kind=kind, node="gpu-a")
            assert (await actuator.apply(request)).ok
        assert "gpu-a" in await actuator.node_labels(["gpu-a"])
    finally:
        actuator.close()
    assert all(r.status < 400 for r in api.requests)
    assert api.calls() == granted(rbac_rules())
    assert all(rule["apiGroups"] == [""] for rule in rbac_rules())


async def test_a_missing_rbac_rule_fails_the_call_with_the_servers_403(tmp_path: pathlib.Path) -> None:
    rules = [r for r in rbac_rules() if r["resources"] != ["nodes/status"]]
    fake = fake_kube_api.FakeKubeAPI(rbac_rules=rules)
    fake.start()
    fake.add_node("gpu-a")
    actuator = make_actuator(fake, tmp_path)
    try:
        outcome = await actuator.apply(base.ActionRequest(incident_id="inc-1", kind="cordon", node="gpu-a"))
    finally:
        actuator.close()
        fake.stop()
    assert outcome.status == "failed-permanent"
    assert outcome.detail.startswith("403: nodes is forbidden")


def call(
    api: fake_kube_api.FakeKubeAPI,
    method: str,
    path: str,
    body: Any = None,
    content_type: str = "",
    token: str | None = "test-token",
) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        api.url + path, method=method, data=json.dumps(body).encode() if body else None
    )
    if content_type:
        request.add_header("Content-Type", content_type)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        with e:
            return e.code, json.loads(e.read())


@pytest.mark.parametrize(
    ("method", "path", "content_type", "token", "code"),
    [
        ("GET", "/api/v1/namespaces/ml/pods", "", "test-token", 404),
        ("DELETE", "/api/v1/nodes/gpu-a", "", "test-token", 405),
        ("PATCH", "/api/v1/nodes/gpu-a", "application/json-patch+json", "test-token", 415),
        ("GET", "/api/v1/nodes/gpu-a", "", None, 401),
        ("GET", "/api/v1/nodes/gpu-zz", "", "test-token", 404),
    ],
)
def test_the_fake_refuses_what_it_does_not_serve(
    api: fake_kube_api.FakeKubeAPI, method: str, path: str, content_type: str, token: str | None, code: int
) -> None:
    body = {"spec": {"unschedulable": True}} if method == "PATCH" else None
    status, answer = call(api, method, path, body, content_type, token)
    assert (status, answer["kind"], answer["code"]) == (code, "Status", code)
