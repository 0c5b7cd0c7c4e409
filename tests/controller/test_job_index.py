"""Job peer groups (controller/inventory/jobs.py): from frames, Slurm's squeue JSON and GPU pods."""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import Iterator

import pytest

from healer import config, testing
from healer.actuators import kubernetes as kube
from healer.controller.core import housekeeping
from healer.controller.inventory import jobs
from healer.schemas import codec, telemetry
from tests.controller.conftest import Fleet, Harness, run_until
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


def test_what_a_job_is_comes_from_the_listing_and_a_frames_unlisted_job_id_does_not_hide_it() -> None:
    """squeue's ``qos`` is ``""`` without accounting (Slurm 22.05): not said, not a QOS named ``""``."""
    listed: dict[str, dict[str, object]] = {
        "41": {"job_state": ["RUNNING"], "nodes": "a", "qos": "", "partition": "train"},
        "42": {"job_state": ["RUNNING"], "nodes": "b", "qos": "high", "partition": "gpu"},
        "43": {"job_state": ["PENDING"], "nodes": "", "qos": "low", "partition": "gpu"},
    }
    infos = jobs.infos_from_squeue(listed)
    assert infos == {"41": jobs.JobInfo(partition="train"), "42": jobs.JobInfo(qos="high", partition="gpu")}
    index = jobs.JobIndex()
    index.set_scheduled("slurm", jobs.placements_from_squeue(listed), infos)
    index.observe_frame(frame("a", [["run7-j3"], ["41"], []]))
    index.observe_frame(frame("b", [["42"]]))
    assert index.info_at("a", 0) == ("41", jobs.JobInfo(partition="train")), "the id the scheduler knows"
    assert index.info_at("a", 1) == ("41", jobs.JobInfo(partition="train"))
    assert index.info_at("b", 0) == ("42", jobs.JobInfo(qos="high", partition="gpu"))
    index.set_scheduled("slurm", [], {})
    assert index.info_at("a", 1) is None, "a job the next listing lacks is not described any more"


def test_a_job_the_frames_name_and_no_listing_describes_is_unlisted_until_the_next_listing() -> None:
    index = jobs.JobIndex()
    index.set_scheduled("slurm", [], {"41": jobs.JobInfo(partition="gpu")})
    index.observe_frame(frame("a", [["41"], []]))
    assert not index.unlisted(), "a listed job"
    index.observe_frame(frame("a", [["41"], ["42"]]))
    assert index.unlisted(), "42 started since the listing"
    index.set_scheduled("slurm", [], {"41": jobs.JobInfo(partition="gpu")})
    assert not index.unlisted()
    index.observe_frame(frame("a", [["41"], ["42"]]))
    assert not index.unlisted(), "a listing after it did not describe 42: it is not asked about again"
    index.observe_frame(frame("a", [["43"], ["42"]]))
    assert index.unlisted()


def test_jobs_are_listed_every_refresh_and_sooner_only_for_an_unlisted_job_when_jobs_rank_power() -> None:
    ranked = config.ControllerSettings(power_priority=config.PowerPriority(partition={"gpu": 1}))
    assert housekeeping.listing_due(ranked, 60.0, unlisted=False), "jobs_refresh_s (60) has passed"
    assert not housekeeping.listing_due(ranked, 30.0, unlisted=False)
    assert housekeeping.listing_due(ranked, 10.0, unlisted=True), "a new job: after 10 s, not 60"
    assert not housekeeping.listing_due(ranked, 9.0, unlisted=True), "at most every jobs_unlisted_refresh_s"
    assert not housekeeping.listing_due(config.ControllerSettings(), 30.0, unlisted=True), "no job ranks"
    never = ranked.model_copy(update={"jobs_unlisted_refresh_s": 0.0})
    assert not housekeeping.listing_due(never, 30.0, unlisted=True)
    assert not housekeeping.listing_due(ranked.model_copy(update={"jobs_refresh_s": 0.0}), 1e9, True)


class Squeue(testing.RecordingActuator):
    """Lists ``running`` as ``squeue --json`` does, counting its listings."""

    def __init__(self) -> None:
        super().__init__()
        self.running: dict[str, dict[str, object]] = {}
        self.listings = 0

    async def jobs(self) -> dict[str, dict[str, object]]:
        self.listings += 1
        return dict(self.running)


async def test_a_job_started_since_the_last_listing_is_listed_within_seconds_not_jobs_refresh_s(
    harness: Harness,
) -> None:
    """A budget ranking GPUs by their jobs must know a new job's QOS when it ramps, which is when a rack
    goes over: the frames naming a job no listing describes bring the next listing forward."""
    squeue = Squeue()
    ctl = await harness.controller(
        squeue, jobs_refresh_s=3600, jobs_unlisted_refresh_s=0.1,
        power_priority={"partition": {"train": 1}},
    )  # fmt: skip
    fleet = Fleet(harness.bus, ["gpu-01"])
    await run_until(fleet, lambda: squeue.listings >= 1)
    assert ctl.learning.failslow is not None
    index = ctl.learning.failslow.jobs
    assert index.info_of("77") is None
    squeue.running["77"] = {"job_state": ["RUNNING"], "nodes": "gpu-01", "qos": "", "partition": "train"}
    fleet.overrides[("gpu-01", 0)] = {"jobs": ["77"]}  # the agent's job map: job 77 on GPU 0
    await run_until(fleet, lambda: index.info_of("77") is not None)
    assert index.info_at("gpu-01", 0) == ("77", jobs.JobInfo(partition="train"))
    listings = squeue.listings
    for _ in range(5):  # the job listed, nothing new: no more early listings
        await fleet.publish()
        await asyncio.sleep(0.2)
    assert squeue.listings == listings


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
