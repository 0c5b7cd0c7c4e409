"""The energy meter (#30): each frame's increase of the NVML energy counter, per domain and per job."""

from __future__ import annotations

import pytest

from healer.controller.inventory import jobs
from healer.controller.observability import metrics as controller_metrics
from healer.controller.power import energy_meter
from healer.schemas import telemetry
from tests.controller.conftest import metric


def frame(node: str, energy_j: list[float | None]) -> telemetry.NodeFrame:
    gpus = [telemetry.GpuSample(index=i, energy_j=e) for i, e in enumerate(energy_j)]
    return telemetry.NodeFrame(
        node=node, ts=1.0, seq=1, boot_id="b", agent_version="t", source="sim", gpus_expected=len(gpus),
        gpus=gpus,
    )  # fmt: skip


def meter(
    keys: tuple[str, ...] = (),
) -> tuple[energy_meter.EnergyMeter, controller_metrics.ControllerMetrics]:
    m = controller_metrics.ControllerMetrics()
    em = energy_meter.EnergyMeter(m, keys)
    em.set_topology({"a": {"rack": "r1", "pdu": "p1"}, "b": {"rack": "r1"}})
    return em, m


def test_each_frames_increase_counts_into_every_domain_of_the_node_the_first_only_sets_a_baseline() -> None:
    em, m = meter()
    em.observe(frame("a", [1000.0, 5000.0]), None, 0.0)
    em.observe(frame("b", [70.0]), None, 0.0)
    em.fold(0.0)
    assert metric(m, "energy_joules_total", domain="rack=r1") == 0, "a first reading is only a baseline"
    em.observe(frame("a", [1600.0, 5400.0]), None, 1.0)
    em.observe(frame("b", [170.0]), None, 1.0)
    em.fold(1.0)
    assert metric(m, "energy_joules_total", domain="rack=r1") == pytest.approx(1100.0)
    assert metric(m, "energy_joules_total", domain="pdu=p1") == pytest.approx(1000.0)
    assert em.joules("rack=r1") == pytest.approx(1100.0)


def test_a_counter_that_restarted_counts_what_was_drawn_since_and_a_gpu_without_one_counts_nothing() -> None:
    em, m = meter()
    em.observe(frame("a", [9000.0, None]), None, 0.0)
    em.observe(frame("a", [300.0, None]), None, 1.0)  # a GPU reset or driver reload: the counter restarts
    em.fold(1.0)
    assert metric(m, "energy_joules_total", domain="rack=r1") == pytest.approx(300.0)


def test_only_the_configured_keys_are_counted() -> None:
    em, m = meter(keys=("pdu",))
    em.observe(frame("a", [0.0]), None, 0.0)
    em.observe(frame("a", [50.0]), None, 1.0)
    em.fold(1.0)
    assert metric(m, "energy_joules_total", domain="pdu=p1") == pytest.approx(50.0)
    assert metric(m, "energy_joules_total", domain="rack=r1") == 0


def test_a_gpus_energy_goes_to_its_job_and_a_job_silent_for_an_hour_leaves_the_exposition() -> None:
    em, m = meter()
    index = jobs.JobIndex()
    index.set_scheduled("slurm", [jobs.Placement("job-7", "a", (1,)), jobs.Placement("job-8", "b")])
    em.observe(frame("a", [0.0, 0.0]), index.job_of, 0.0)
    em.observe(frame("b", [0.0]), index.job_of, 0.0)
    em.observe(frame("a", [10.0, 20.0]), index.job_of, 1.0)
    em.observe(frame("b", [40.0]), index.job_of, 1.0)
    em.fold(1.0)
    assert metric(m, "job_energy_joules_total", job="job-7") == pytest.approx(20.0), "GPU 1 only"
    assert metric(m, "job_energy_joules_total", job="job-8") == pytest.approx(40.0), "the node's job"
    assert em.job_joules("job-7") == pytest.approx(20.0)
    assert em.job_joules("job-unknown") is None
    em.fold(1.0 + energy_meter.JOB_TTL_S + 1)
    assert m.registry.get_sample_value("healer_controller_job_energy_joules_total", {"job": "job-7"}) is None
    assert em.job_joules("job-7") is None, "forgotten with its series"


def test_jobs_beyond_the_cap_are_not_counted_and_the_drop_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(energy_meter, "MAX_JOBS", 1)
    em, m = meter()
    index = jobs.JobIndex()
    index.set_scheduled("slurm", [jobs.Placement("job-1", "a", (0,)), jobs.Placement("job-2", "a", (1,))])
    em.observe(frame("a", [0.0, 0.0]), index.job_of, 0.0)
    em.observe(frame("a", [5.0, 5.0]), index.job_of, 1.0)
    em.fold(1.0)
    assert metric(m, "job_energy_joules_total", job="job-1") == pytest.approx(5.0)
    assert metric(m, "job_energy_joules_total", job="job-2") == 0
    assert metric(m, "energy_jobs_dropped_total") == 1, "counted"
    assert metric(m, "energy_joules_total", domain="rack=r1") == pytest.approx(10.0), "the domain has all"
