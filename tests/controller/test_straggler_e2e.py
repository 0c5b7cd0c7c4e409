"""A fail-slow GPU end to end: frames with job ids and step times from the job through a real
nats-server, a real controller, one ``gpu-straggler`` incident that names the job, the cause and the
step-time slowdown, and a drain (cordon) on the scheduler, never a requeue."""

from __future__ import annotations

import asyncio
import pathlib
import time

from healer import steps, testing
from healer.bus import subjects
from healer.schemas import codec, telemetry
from tests import conftest
from tests.controller.conftest import Harness

RULES = (pathlib.Path(__file__).resolve().parents[2] / "rules" / "stragglers.yaml").read_text()


def gpu(index: int, slow: bool) -> telemetry.GpuSample:
    return telemetry.GpuSample(
        index=index, util_gpu_pct=100.0, sm_clock_mhz=1530.0 if slow else 1830.0, sm_clock_max_mhz=1980.0,
        power_w=540.0 if slow else 660.0, power_limit_w=700.0, clocks_event_reasons=0x8 if slow else 0x4,
        jobs=["4711"],
    )  # fmt: skip


async def test_a_clock_limited_gpu_opens_one_straggler_incident_and_drains_its_node(harness: Harness) -> None:
    (harness.rules / "dbe.yaml").unlink()
    (harness.rules / "stragglers.yaml").write_text(RULES)
    actuator = testing.RecordingActuator()
    await harness.controller(actuator, straggler_window_s=0.6, jobs_refresh_s=0)
    subj = subjects.Subjects()
    sent: list[tuple[str, bytes]] = []
    reporters = [
        steps.StepReporter("4711", rank=r, node="gpu-01", gpu=r, publish=lambda s, p: sent.append((s, p)))
        for r in range(8)
    ]
    seq = 0

    def opened() -> list[object]:
        return [e for e in harness.feed.events if e.change == "opened"]

    async def tick(slow: bool) -> None:
        nonlocal seq
        seq += 1
        frame = telemetry.NodeFrame(
            node="gpu-01", ts=time.time(), seq=seq, boot_id="b", agent_version="t", source="sim",
            gpus_expected=8, gpus=[gpu(g, slow and g == 5) for g in range(8)],
        )  # fmt: skip
        await harness.bus.publish(subj.telemetry("gpu-01"), codec.encode(frame))
        for r in reporters:
            r.report(2.4 if slow else 2.0, compute_s=2.3 if slow and r.rank == 5 else 1.4)
        for s, p in sent:
            await harness.bus.publish(s, p)
        sent.clear()
        await asyncio.sleep(0.05)

    for _ in range(20):  # healthy first: no incident
        await tick(False)
    assert opened() == []
    async with asyncio.timeout(30):
        while not opened():
            await tick(True)
    (event,) = opened()
    data = event.data  # type: ignore[attr-defined]
    assert data.rule_id == "gpu-straggler"
    assert (data.node, data.gpu_index) == ("gpu-01", 5)
    assert data.evidence["straggler.job"] == "4711"
    assert data.evidence["straggler.cause"] == "hw_slowdown"
    assert data.evidence["straggler.test"] == "peers"
    await conftest.until(lambda: any(r.kind == "cordon" for r in actuator.requests))
    assert [r.kind for r in actuator.requests if r.node == "gpu-01"][:1] == ["cordon"]
    assert not any(r.kind == "migrate" for r in actuator.requests)


class SlurmLike(testing.RecordingActuator):
    """A scheduler actuator that lists its jobs as ``squeue --json`` does (``SlurmActuator.jobs``)."""

    async def jobs(self) -> dict[str, dict[str, object]]:
        return {"41": {"job_state": ["RUNNING"], "nodes": "gpu[01-02]"}}


async def test_the_controller_reads_job_placements_from_its_scheduler(harness: Harness) -> None:
    ctl = await harness.controller(SlurmLike(), jobs_refresh_s=0.1)
    failslow = ctl.learning.failslow
    assert failslow is not None
    await conftest.until(lambda: failslow.jobs.job_of("gpu02", 3) == "41")
    assert failslow.jobs.job_of("gpu03", 0) is None
