"""The frame's readers that read a columnar frame's plane (``Frame.readings``) read what its GPUs say.

The fail-slow scorer, the job index and the energy meter read a frame the compiled decoder wrote into the
engine's plane from the plane's rows (NaN for null) instead of decoding its GPUs as objects. Fed the
same frames as pydantic NodeFrames, they must end in exactly the same state.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from healer.controller.failslow import detector
from healer.controller.inventory import jobs
from healer.controller.observability import metrics as controller_metrics
from healer.controller.power import energy_meter
from healer.schemas import codec, framecols, telemetry

pytestmark = pytest.mark.skipif(not framecols.ACCELERATED, reason="the compiled decoder was not built")


def columnar(nf: telemetry.NodeFrame) -> framecols.Frame:
    """``nf`` as the controller gets it: decoded into a plane, its rows still there."""
    plane = np.full((framecols.ROWS_MAX, framecols.WIDTH), -1.0)
    frame = framecols.decode_into(codec.encode(nf), plane, 0)
    assert frame.exact, "the compiled decoder decided it"
    return frame


def nullable(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | values


gpus = st.lists(
    st.fixed_dictionaries(
        {
            "util_gpu_pct": nullable(st.sampled_from([0.0, 49.9, 50.0, 100.0])),
            "sm_clock_mhz": nullable(st.sampled_from([0.0, 1200.0, 1980.0])),
            "sm_clock_max_mhz": nullable(st.sampled_from([0.0, 1980.0])),
            "power_w": nullable(st.sampled_from([0.0, 300.0, 690.0])),
            "power_limit_w": nullable(st.sampled_from([0.0, 700.0])),
            "pcie_gen": nullable(st.integers(0, 5)),
            "pcie_gen_max": nullable(st.integers(0, 5)),
            "nvlink_links_up": nullable(st.integers(0, 18)),
            "nvlink_links_total": nullable(st.integers(0, 18)),
            "pcie_width": nullable(st.sampled_from([8, 16])),
            "pcie_width_max": nullable(st.sampled_from([8, 16])),
            "clocks_event_reasons": nullable(st.sampled_from([0, 0x1, 0x4, 0x10, 0x2 | 0x20, 2**40 + 4])),
            "energy_j": nullable(st.sampled_from([0.0, 10.5, 1e6])),
            "jobs": nullable(st.lists(st.sampled_from(["7", "slurm-12"]), max_size=2)),
        }
    ),
    min_size=1,
    max_size=8,
)


def node_frame(node: str, readings: list[dict[str, Any]], ts: float) -> telemetry.NodeFrame:
    return telemetry.NodeFrame(
        node=node, ts=ts, seq=0, boot_id="b", agent_version="t", source="sim",
        gpus=[telemetry.GpuSample(index=(3 * i) % 8, **r) for i, r in enumerate(readings)],
    )  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(first=gpus, second=gpus)
def test_the_fail_slow_scorer_and_job_index_read_the_plane_as_the_objects(
    first: list[dict[str, Any]], second: list[dict[str, Any]]
) -> None:
    by_objects, by_plane = detector.FailSlow(), detector.FailSlow()
    for ts, readings in ((1.0, first), (10.0, second)):
        nf = node_frame("n1", readings, ts)
        by_objects.observe(nf)
        by_plane.observe(columnar(nf))
    assert by_plane.scorer._pending == by_objects.scorer._pending
    assert by_plane.scorer._slot == by_objects.scorer._slot
    assert by_plane.jobs._known == by_objects.jobs._known
    assert by_plane.jobs._from_frames == by_objects.jobs._from_frames


HEALTHY = {
    "util_gpu_pct": 100.0, "sm_clock_mhz": 1500.0, "sm_clock_max_mhz": 1980.0, "power_w": 600.0,
    "power_limit_w": 700.0, "pcie_gen": 5, "pcie_gen_max": 5, "nvlink_links_up": 18, "nvlink_links_total": 18,
    "pcie_width": 16, "pcie_width_max": 16, "clocks_event_reasons": 0, "energy_j": 5.0,
}  # fmt: skip


@pytest.mark.parametrize("value", [None, 0, 1])
@pytest.mark.parametrize("field", sorted(HEALTHY))
def test_each_reading_null_zero_or_low_reads_the_same(field: str, value: int | None) -> None:
    """A healthy loaded GPU beside one whose ``field`` is null, zero or 1 (each test of the scorer's)."""
    odd = {**HEALTHY, field: value if value is None or isinstance(HEALTHY[field], int) else float(value)}
    by_objects, by_plane = detector.FailSlow(), detector.FailSlow()
    meters = [energy_meter.EnergyMeter(controller_metrics.ControllerMetrics(), ()) for _ in range(2)]
    for ts in (1.0, 10.0):
        nf = node_frame("n1", [HEALTHY, odd], ts)
        by_objects.observe(nf)
        by_plane.observe(columnar(nf))
        meters[0].observe(nf, None, ts)
        meters[1].observe(columnar(nf), None, ts)
    assert by_plane.scorer._pending == by_objects.scorer._pending
    assert meters[1].last == meters[0].last


@settings(max_examples=100, deadline=None)
@given(first=gpus, second=gpus)
def test_the_energy_meter_reads_the_plane_as_the_objects(
    first: list[dict[str, Any]], second: list[dict[str, Any]]
) -> None:
    meters = [energy_meter.EnergyMeter(controller_metrics.ControllerMetrics(), ()) for _ in range(2)]
    for m in meters:
        m.set_topology({"n1": {"rack": "r1"}})
    index = jobs.JobIndex()
    for ts, readings in ((1.0, first), (2.0, second)):
        nf = node_frame("n1", readings, ts)
        meters[0].observe(nf, index.job_of, ts)
        meters[1].observe(columnar(nf), index.job_of, ts)
    assert meters[1].last == meters[0].last
    assert meters[1].by_domain == meters[0].by_domain


def test_a_frame_whose_rows_were_written_over_is_read_from_its_objects() -> None:
    """Once the next frame is decoded where its rows were (``FleetState.decode``), a frame is no longer
    ``exact`` and its readers decode its GPUs instead: never another frame's readings."""
    from tests.rules.rules_helpers import frame, make_engine, rule

    eng = make_engine(rule("temp_c > 0"))
    a = eng.decode(codec.encode(frame("a", 0.0, util_gpu_pct=10.0)))
    assert a.exact
    eng.ingest(a)
    b = eng.decode(codec.encode(frame("b", 0.0, util_gpu_pct=90.0)))
    assert b.exact
    assert not a.exact
    assert a.readings(np.array([framecols.COLUMN["util_gpu_pct"]])) is None
    assert a.gpus[0].util_gpu_pct == 10.0
