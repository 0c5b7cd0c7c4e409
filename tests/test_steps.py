"""The step-time client (healer/steps.py) through a real nats-server, and what the controller makes of it."""

from __future__ import annotations

import asyncio
import socket

from healer import steps
from healer.bus import base, embedded, subjects
from healer.bus import nats as natsbus
from healer.controller.failslow import detector
from healer.schemas import codec, stepreport, telemetry
from tests import conftest


def test_the_clients_subject_is_the_one_the_controller_subscribes_to() -> None:
    subj = subjects.Subjects()
    for job in ("4711", "ml/llm.v2", "a b*c>d%"):
        assert steps.subject(job) == subj.steps(job)
        assert subjects.unescape_node(steps.subject(job).split(".", 2)[2]) == job


async def test_step_times_arrive_through_nats_and_decode(
    nats_server: embedded.EmbeddedServer, nats_bus: natsbus.NatsBus, subj: subjects.Subjects
) -> None:
    got: list[stepreport.StepReport] = []

    async def on(msg: base.Msg) -> None:
        got.append(codec.decode_step(msg.data))

    await nats_bus.subscribe(subj.all_steps, on)
    await nats_bus.flush()
    reporter = steps.StepReporter("4711", rank=3, url=nats_server.url, node="gpu-07", gpu=3)

    def send() -> None:
        for i in range(5):
            assert reporter.report(1.5 + i / 100, step=i, compute_s=1.2)
        reporter.flush()
        reporter.close()

    await asyncio.to_thread(send)
    await conftest.until(lambda: len(got) == 5)
    assert [r.step for r in got] == [0, 1, 2, 3, 4]
    assert {(r.job, r.rank, r.node, r.gpu) for r in got} == {("4711", 3, "gpu-07", 3)}
    assert got[4].step_time_s == 1.54
    assert reporter.sent == 5
    assert reporter.failed == 0


def test_a_missing_server_costs_the_job_nothing_but_a_count() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    reporter = steps.StepReporter("1", rank=0, url=f"nats://127.0.0.1:{port}", retry_s=3600)
    assert reporter.report(1.0) is False
    assert reporter.report(1.0) is False  # not tried again before retry_s: no connect per step
    assert reporter.failed == 2


def test_a_publish_callable_replaces_the_socket() -> None:
    sent: list[tuple[str, bytes]] = []
    reporter = steps.StepReporter(
        "ml/llm", rank=1, publish=lambda s, p: sent.append((s, p)), node="n1", gpu=0
    )
    assert reporter.report(2.0, step=7)
    ((subject, payload),) = sent
    assert subject == "healer.steps.ml/llm"
    report = codec.decode_step(payload)
    assert (report.job, report.rank, report.step, report.step_time_s) == ("ml/llm", 1, 7, 2.0)


def _gpu(index: int, clock: float, power: float) -> telemetry.GpuSample:
    return telemetry.GpuSample(
        index=index, util_gpu_pct=100.0, sm_clock_mhz=clock, sm_clock_max_mhz=1980.0,
        power_w=power, power_limit_w=700.0, clocks_event_reasons=0, jobs=["4711"],
    )  # fmt: skip


def test_the_straggler_incident_says_how_much_slower_the_job_runs_and_which_rank() -> None:
    fs = detector.FailSlow()
    t0 = 1_800_000_000.0
    slow_from = t0 + 600
    for t in range(0, 900):
        now = t0 + t
        slow = now >= slow_from
        for rank in range(8):
            lagging = slow and rank == 5
            fs.steps.observe(
                stepreport.StepReport(
                    job="4711", rank=rank, step_time_s=2.4 if slow else 2.0,
                    compute_s=2.3 if lagging else 1.4, node="gpu-07", gpu=rank, ts=now,
                )
            )  # fmt: skip
        lag = {5: (1530.0, 560.0)} if slow else {}
        gpus = [_gpu(g, *lag.get(g, (1800.0, 650.0))) for g in range(8)]
        frame = telemetry.NodeFrame(
            node="gpu-07", ts=now, seq=t, boot_id="b", agent_version="t", source="sim", gpus=gpus
        )
        fs.observe(frame)
        fs.tick(now)
    why = fs.explain("gpu-07", 5)
    assert why["straggler.job"] == "4711"
    assert why["straggler.job_slowdown_pct"] == 20.0
    assert why["straggler.steps"] == (
        "job 4711 runs 20 % slower since 2027-01-15T08:10:00Z; rank 5 on gpu-07/GPU 5 is the outlier"
    )


def test_the_client_imports_nothing_outside_the_standard_library() -> None:
    import subprocess
    import sys

    code = "import sys, healer.steps; print(' '.join(sorted(m.split('.')[0] for m in sys.modules)))"
    loaded = set(
        subprocess.run(
            [sys.executable, "-c", code], check=True, capture_output=True, text=True
        ).stdout.split()
    )
    assert loaded.isdisjoint({"pydantic", "numpy", "nats", "orjson", "msgspec", "structlog", "yaml"})
