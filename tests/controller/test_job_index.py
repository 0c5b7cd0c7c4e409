"""Job peer groups (controller/jobs.py): from frames, Slurm's squeue JSON and GPU pods."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest

from healer import config
from healer.actuators import kubernetes as kube
from healer.controller import jobs
from healer.schemas import codec, telemetry
from tests.fakes import fake_kube_api

RBAC = pathlib.Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "rbac.yaml"


def frame(node: str, per_gpu: list[list[str] | None]) -> telemetry.NodeFrame:
    gpus = [telemetry.GpuSample(index=i, jobs=j) for i, j in enumerate(per_gpu)]
    return telemetry.NodeFrame(
        node=node, ts=1.0, seq=0, boot_id="b", agent_version="t", source="sim", gpus=gpus
    )


def test_frames_name_each_gpus_job_and_jobs_span_nodes() -> None:
    index = jobs.JobIndex()
    index.observe_frame(frame("a", [["7"], ["7"], ["8"], []]))
    index.observe_frame(frame("b", [["7"], None]))
    assert index.job_of("a", 0) == "7"
    assert index.job_of("a", 2) == "8"
    assert index.job_of("a", 3) is None
    assert index.job_of("b", 1) is None
    assert index.groups() == {"7": [("a", 0), ("a", 1), ("b", 0)], "8": [("a", 2)]}


def test_a_frame_with_jobs_round_trips_and_one_without_leaves_the_field_out() -> None:
    with_jobs = frame("a", [["7"], []])
    assert codec.decode_frame_view(codec.encode(with_jobs)).gpus[0].jobs == ["7"]  # type: ignore[attr-defined]
    assert codec.decode_frame(codec.encode(with_jobs)).gpus[1].jobs == []
    plain = frame("a", [None, None])
    assert b'"jobs"' not in codec.encode(plain)


def test_squeue_node_lists_place_running_jobs_on_their_nodes() -> None:
    listed: dict[str, dict[str, object]] = {
        "41": {"job_state": ["RUNNING"], "nodes": "gpu[01-03],gpu07"},
        "42": {"job_state": ["PENDING"], "nodes": ""},
        "43": {"job_state": "RUNNING", "nodes": "login1"},
    }
    placements = jobs.placements_from_squeue(listed)
    assert [(p.job, p.node) for p in placements] == [
        ("41", "gpu01"),
        ("41", "gpu02"),
        ("41", "gpu03"),
        ("41", "gpu07"),
        ("43", "login1"),
    ]
    index = jobs.JobIndex()
    index.observe_frame(frame("gpu02", [None, None]))
    index.set_scheduled("slurm", placements)
    assert index.job_of("gpu02", 1) == "41"
    assert index.groups() == {"41": [("gpu02", 0), ("gpu02", 1)]}


def test_a_frames_job_wins_over_the_schedulers_node_level_placement() -> None:
    index = jobs.JobIndex()
    index.set_scheduled("slurm", [jobs.Placement("41", "a"), jobs.Placement("42", "a")])
    index.observe_frame(frame("a", [["42"], None]))
    assert index.job_of("a", 0) == "42"
    assert index.job_of("a", 1) is None  # two jobs share the node: which GPU runs which is unknown


@pytest.fixture
def api() -> Iterator[fake_kube_api.FakeKubeAPI]:
    fake = fake_kube_api.FakeKubeAPI(rbac_rules=fake_kube_api.cluster_role_rules(RBAC.read_text()))
    fake.start()
    fake.add_node("gpu-a")
    fake.add_node("gpu-b")
    yield fake
    fake.stop()


async def test_gpu_pods_from_the_api_server_place_their_job(
    api: fake_kube_api.FakeKubeAPI, tmp_path: pathlib.Path
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    api.write_kubeconfig(str(kubeconfig))
    actuator = kube.KubernetesActuator(config.ActuatorSettings(kube_config=str(kubeconfig), retry_attempts=1))
    api.add_pod(
        "ml",
        "train-0",
        "gpu-a",
        gpus=4,
        labels={"job-name": "llm"},
        annotations={jobs.DEVICES_ANNOTATION: "0,1,2,3"},
    )
    api.add_pod("ml", "train-1", "gpu-b", gpus=8, labels={"job-name": "llm"})
    api.add_pod("web", "nginx", "gpu-a")  # no GPUs: not a peer of anything
    try:
        placements = jobs.placements_from_pods(await actuator.pods())
    finally:
        actuator.close()
    assert sorted(placements, key=lambda p: p.node) == [
        jobs.Placement("ml/llm", "gpu-a", (0, 1, 2, 3)),
        jobs.Placement("ml/llm", "gpu-b", None),
    ]
    index = jobs.JobIndex()
    index.set_scheduled("kubernetes", placements)
    assert index.job_of("gpu-a", 2) == "ml/llm"
    assert index.job_of("gpu-a", 5) is None
    assert index.job_of("gpu-b", 5) == "ml/llm"
