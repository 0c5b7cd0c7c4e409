"""reset_gpu and validate end to end: the controller-side actuator, a real nats-server, the real agent
(``daemon.Agent``) over the fake NVML, and the lease in KV healer-leases as the fencing token."""

from __future__ import annotations

import pathlib
from collections.abc import AsyncIterator

import pytest

from healer import config, errors
from healer.actuators import base, gpu_reset
from healer.agent import daemon
from healer.bus import nats as natsbus
from healer.bus import subjects
from healer.schemas import telemetry
from healer.telemetry import nvml
from tests.agent import test_runner as test_agent
from tests.fakes import fake_pynvml


@pytest.fixture
async def frames(nats_bus: natsbus.NatsBus, subj: subjects.Subjects) -> test_agent.Frames:
    got = test_agent.Frames()
    await nats_bus.subscribe(subj.all_telemetry, got)
    await nats_bus.flush()
    return got


@pytest.fixture
async def agent(
    nats_bus: natsbus.NatsBus, tmp_path: pathlib.Path, frames: test_agent.Frames
) -> AsyncIterator[tuple[daemon.Agent, fake_pynvml.FakeNvml]]:
    fake = fake_pynvml.FakeNvml(gpus=2)

    def reset(index: int, uuid: str, timeout_s: float) -> str:
        try:
            return fake.gpu_reset(index)
        except RuntimeError as e:
            raise errors.PermanentError(str(e)) from e

    src = nvml.NvmlSource("n1", nvml=fake.module(), reset_command=reset)
    ag = daemon.Agent(node="n1", source=src, bus=nats_bus, state_dir=tmp_path, interval_s=0.05)
    run = test_agent.Running(ag)
    try:
        await frames.wait(lambda fs: len(fs) >= 1)  # sampling: validation has a frame to read
        yield ag, fake
    finally:
        await run.close()


def _dbe(frames: list[telemetry.NodeFrame], index: int) -> int | None:
    """GPU ``index``'s volatile DBE count in the newest frame on the bus."""
    return {g.index: g.ecc_dbe_volatile for g in frames[-1].gpus}.get(index) if frames else None


def actuator(bus: natsbus.NatsBus) -> gpu_reset.GpuRecoveryActuator:
    settings = config.ActuatorSettings(retry_attempts=1, gpu_reset_timeout_s=30, validate_timeout_s=30)
    return gpu_reset.GpuRecoveryActuator(bus, settings=settings)


def req(kind: base.RequestKind, token: int, **kw: object) -> base.ActionRequest:
    return base.ActionRequest.model_validate(
        {
            "incident_id": "inc-7",
            "kind": kind,
            "node": "n1",
            "fencing_token": token,
            "summary": "xid 48",
            **kw,
        }
    )


async def test_reset_then_validate_over_real_nats(
    nats_bus: natsbus.NatsBus,
    subj: subjects.Subjects,
    agent: tuple[daemon.Agent, fake_pynvml.FakeNvml],
    frames: test_agent.Frames,
) -> None:
    _, fake = agent
    fake.gpus[1].ecc[(fake_pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, fake_pynvml.NVML_VOLATILE_ECC)] = 2
    token = await test_agent.hold_lease(nats_bus, subj)
    act = actuator(nats_bus)
    await frames.wait(lambda fs: _dbe(fs, 1) == 2)  # a frame with the DBE
    before = await act.apply(req("validate", token))
    assert before.status == "failed-permanent"
    assert [(i.item, i.detail) for i in before.items] == [
        ("gpu 1 ecc_dbe_volatile_zero", "2 volatile double-bit ECC errors")
    ]
    fake.gpus[1].processes = [31337]
    busy = await act.apply(req("reset_gpu", token, gpu_index=1))
    assert busy.status == "refused"
    assert "pids 31337" in busy.detail
    fake.gpus[1].processes = []
    done = await act.apply(req("reset_gpu", token, gpu_index=1))
    assert done.status == "done", done.detail
    assert fake.gpus[1].resets == 1
    again = await act.apply(req("reset_gpu", token, gpu_index=1))  # the same id: answered, not rerun
    assert again.status == "done"
    assert fake.gpus[1].resets == 1
    await frames.wait(lambda fs: _dbe(fs, 1) == 0)  # a frame sampled after the reset
    after = await act.apply(req("validate", token, params={"action_id": "inc-7:validate:2"}))
    assert after.status == "done", after.items


async def test_a_token_that_is_no_leases_never_resets(
    nats_bus: natsbus.NatsBus, subj: subjects.Subjects, agent: tuple[daemon.Agent, fake_pynvml.FakeNvml]
) -> None:
    _, fake = agent
    token = await test_agent.hold_lease(nats_bus, subj)
    out = await actuator(nats_bus).apply(req("reset_gpu", token + 1000, gpu_index=0))
    assert out.status == "refused"
    assert "no lease's" in out.detail
    assert fake.gpus[0].resets == 0


async def test_dry_run_plans_the_command_and_sends_nothing(
    nats_bus: natsbus.NatsBus, agent: tuple[daemon.Agent, fake_pynvml.FakeNvml]
) -> None:
    _, fake = agent
    out = await actuator(nats_bus).apply(req("reset_gpu", 1, gpu_index=0, dry_run=True))
    assert out.status == "planned"
    assert out.plan[0].startswith("request healer.cmd.n1 ")
    assert '"action":"reset_gpu"' in out.plan[0]
    assert fake.gpus[0].resets == 0


async def test_reset_without_a_gpu_is_a_bad_request(nats_bus: natsbus.NatsBus) -> None:
    out = await actuator(nats_bus).apply(req("reset_gpu", 1))
    assert out.status == "failed-permanent"
    assert "needs a GPU" in out.detail


async def test_a_port_reset_request_becomes_a_fenced_command_naming_its_ports(
    nats_bus: natsbus.NatsBus,
) -> None:
    act = actuator(nats_bus)
    ports = {"ports": ["mlx5_3/1", "mlx5_6/1"]}
    cmd = act.command(req("reset_port", 5, params=ports))
    assert (cmd.action, cmd.ports, cmd.gpu_index, cmd.fencing_token) == (
        "reset_port",
        ports["ports"],
        None,
        5,
    )
    assert cmd.timeout_s == config.ActuatorSettings().port_reset_timeout_s
    assert act.command(req("validate", 5, params=ports)).ports == ports["ports"]
    planned = await act.apply(req("reset_port", 5, params=ports, dry_run=True))
    assert planned.detail == "would reset_port port mlx5_3/1, mlx5_6/1 on n1"
    missing = await act.apply(req("reset_port", 5))
    assert missing.status == "failed-permanent"
    assert "reset_port needs ports" in missing.detail
