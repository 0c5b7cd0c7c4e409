"""The power actuator end to end on the in-memory bus: command out, the agent's real CommandExecutor
answers, and the new limit must show up in telemetry before the action counts as done."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
import structlog.testing

from healer import config
from healer.actuators import base, power
from healer.agent import execution, power_limits
from healer.bus import base as bus_base
from healer.bus import memory, subjects
from healer.schemas import codec
from healer.sim import node_source
from healer.telemetry import source


class IgnoringDriver:
    """A GPU whose driver accepts a new limit and silently keeps the old one."""

    def __init__(self, inner: node_source.SimSource) -> None:
        self.inner = inner

    def power_limits(self, index: int) -> source.PowerLimits:
        return self.inner.power_limits(index)

    def set_power_limit(self, index: int, watts: float) -> None:
        pass


class LiveReadings:
    """Telemetry as the controller sees it: a fresh frame from the simulated node on every look."""

    def __init__(self, gpu: power_limits.PowerControl, node: str = "n1") -> None:
        self.gpu = gpu
        self.node = node
        self.looks = 0

    def latest_power_limit(self, node: str, gpu_index: int) -> tuple[float, float] | None:
        self.looks += 1
        if node != self.node:
            return None
        return time.time() + 1, self.gpu.power_limits(gpu_index).current_w


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
async def bus() -> AsyncIterator[memory.MemoryBus]:
    b = memory.MemoryBus()
    yield b
    await b.close()


@pytest.fixture
def gpu() -> node_source.SimSource:
    return node_source.SimSource("n1", gpus=2)


async def serve_agent(bus: memory.MemoryBus, control: power_limits.PowerControl) -> execution.CommandExecutor:
    executor = execution.CommandExecutor("n1", control, None, gpu_indices=lambda: [0, 1])

    async def on_command(msg: bus_base.Msg) -> None:
        await msg.respond(codec.encode(executor.execute(codec.decode_command(msg.data))))

    await bus.subscribe(subjects.Subjects().command("n1"), on_command)
    return executor


def actuator(
    bus: memory.MemoryBus, readings: power.PowerReadings, fake_time: FakeTime
) -> power.PowerActuator:
    settings = config.ActuatorSettings(
        retry_attempts=2, retry_initial_delay_s=0, retry_max_delay_s=0, power_reply_timeout_s=1
    )
    return power.PowerActuator(
        bus, readings, settings=settings, monotonic=fake_time.monotonic, sleep=fake_time.sleep
    )


def req(kind: base.RequestKind = "power_limit", **kw: object) -> base.ActionRequest:
    return base.ActionRequest.model_validate(
        {"incident_id": "inc-3", "kind": kind, "node": "n1", "gpu_index": 1, "summary": "hot", **kw}
    )


async def test_a_power_cap_is_done_once_telemetry_shows_it(
    bus: memory.MemoryBus, gpu: node_source.SimSource
) -> None:
    await serve_agent(bus, gpu)
    outcome = await actuator(bus, LiveReadings(gpu), FakeTime()).apply(req(params={"watts": 450}))
    assert outcome.status == "done", outcome
    assert outcome.items == [base.ItemResult(item="gpu 1", status="done", detail="700 W -> 450 W")]
    assert gpu.power_limits(1).current_w == 450
    assert gpu.power_limits(0).current_w == 700


async def test_restore_returns_the_limit_healer_found(
    bus: memory.MemoryBus, gpu: node_source.SimSource
) -> None:
    gpu.set_power_limit(1, 650)
    await serve_agent(bus, gpu)
    act = actuator(bus, LiveReadings(gpu), FakeTime())
    await act.apply(req(params={"percent_of_default": 80}))
    assert gpu.power_limits(1).current_w == 560
    outcome = await act.apply(req("restore_power_limit"))
    assert outcome.status == "done", outcome
    assert gpu.power_limits(1).current_w == 650


async def test_each_incident_holds_its_own_limit_and_the_tighter_one_holds(
    bus: memory.MemoryBus, gpu: node_source.SimSource
) -> None:
    """A hot GPU's incident and a rack's power budget on one GPU (#30): the command names its incident
    as the holder, so the budget's release leaves the thermal cap, and only the last restore puts back
    the operator's limit."""
    gpu.set_power_limit(1, 650)
    await serve_agent(bus, gpu)
    act = actuator(bus, LiveReadings(gpu), FakeTime())
    hot, rack = "inc-hot", "inc-rack"
    await act.apply(req(params={"percent_of_default": 80}, incident_id=hot))
    assert (await act.apply(req(params={"watts": 525}, incident_id=rack))).status == "done"
    assert gpu.power_limits(1).current_w == 525
    released = await act.apply(req("restore_power_limit", incident_id=rack))
    assert released.status == "done", released
    assert gpu.power_limits(1).current_w == 560, "up to the thermal cap, which still holds"
    assert "held at 560 W by inc-hot" in released.detail
    assert (await act.apply(req("restore_power_limit", incident_id=hot))).status == "done"
    assert gpu.power_limits(1).current_w == 650


async def test_an_unchanged_reading_is_a_failure(bus: memory.MemoryBus, gpu: node_source.SimSource) -> None:
    driver = IgnoringDriver(gpu)
    await serve_agent(bus, driver)
    outcome = await actuator(bus, LiveReadings(driver), FakeTime()).apply(req(params={"watts": 450}))
    assert outcome.status == "failed-temporary"
    [item] = outcome.items
    assert item.detail == "not confirmed: agent set 450 W but telemetry still shows 700 W"


async def test_no_reply_from_the_agent_is_a_failure(
    bus: memory.MemoryBus, gpu: node_source.SimSource
) -> None:
    outcome = await actuator(bus, LiveReadings(gpu), FakeTime()).apply(req(params={"watts": 450}))
    assert outcome.status == "failed-temporary"
    assert "no responders" in outcome.detail


async def test_a_stale_fencing_token_is_refused_by_the_agent(
    bus: memory.MemoryBus, gpu: node_source.SimSource
) -> None:
    executor = await serve_agent(bus, gpu)
    executor.fencing_token = 9
    outcome = await actuator(bus, LiveReadings(gpu), FakeTime()).apply(
        req(params={"watts": 450}, fencing_token=3)
    )
    assert outcome.status == "refused"
    assert "stale fencing token" in outcome.detail
    assert gpu.power_limits(1).current_w == 700


async def test_an_agent_that_cannot_check_a_new_token_is_a_temporary_failure(
    bus: memory.MemoryBus, gpu: node_source.SimSource
) -> None:
    """The agent checks a new fencing token against the lease in KV; while it cannot read it, the cap
    is not refused for good but tried again (a refusal would escalate the incident and stop there)."""
    executor = execution.CommandExecutor("n1", gpu, None, gpu_indices=lambda: [0, 1])
    unreadable = execution.LiveTokens(frozenset(), error="KV unreachable")

    async def on_command(msg: bus_base.Msg) -> None:
        await msg.respond(codec.encode(executor.execute(codec.decode_command(msg.data), unreadable)))

    await bus.subscribe(subjects.Subjects().command("n1"), on_command)
    outcome = await actuator(bus, LiveReadings(gpu), FakeTime()).apply(
        req(params={"watts": 450}, fencing_token=5)
    )
    assert outcome.status == "failed-temporary"
    assert "cannot be read" in outcome.detail
    assert gpu.power_limits(1).current_w == 700


async def test_a_cap_below_the_minimum_is_clamped_and_said_so(
    bus: memory.MemoryBus, gpu: node_source.SimSource
) -> None:
    await serve_agent(bus, gpu)
    outcome = await actuator(bus, LiveReadings(gpu), FakeTime()).apply(req(params={"percent_of_default": 10}))
    assert outcome.status == "done"
    assert outcome.items[0].detail.startswith("700 W -> 200 W; clamped from 70 W")


async def test_dry_run_sends_nothing(bus: memory.MemoryBus, gpu: node_source.SimSource) -> None:
    await serve_agent(bus, gpu)
    outcome = await actuator(bus, LiveReadings(gpu), FakeTime()).apply(
        req(params={"watts": 450}, dry_run=True)
    )
    assert outcome.status == "planned"
    [line] = outcome.plan
    assert line.startswith("request healer.cmd.n1 ")
    assert '"action":"set_power_limit"' in line
    assert gpu.power_limits(1).current_w == 700


async def test_bad_parameters_are_a_permanent_failure(
    bus: memory.MemoryBus, gpu: node_source.SimSource
) -> None:
    outcome = await actuator(bus, LiveReadings(gpu), FakeTime()).apply(req(params={}))
    assert outcome.status == "failed-permanent"
    assert "exactly one of watts or percent_of_default" in outcome.detail


class CountingReadings(LiveReadings):
    """LiveReadings that also hears about replies the actuator did not believe (as the controller does)."""

    def __init__(self, gpu: power_limits.PowerControl) -> None:
        super().__init__(gpu)
        self.rejected: list[str] = []

    def reply_rejected(self, reason: str) -> None:
        self.rejected.append(reason)


async def serve_forger(bus: memory.MemoryBus, gpu: node_source.SimSource, **override: object) -> None:
    """An agent on n1's command subject that executes the command but answers with ``override`` applied."""
    executor = execution.CommandExecutor("n1", gpu, None, gpu_indices=lambda: [0, 1])

    async def on_command(msg: bus_base.Msg) -> None:
        result = executor.execute(codec.decode_command(msg.data)).model_copy(update=override)
        await msg.respond(codec.encode(result))

    await bus.subscribe(subjects.Subjects().command("n1"), on_command)


@pytest.mark.parametrize(
    ("override", "reason"),
    [
        ({"node": "n2"}, "identity_mismatch"),
        ({"command_id": "inc-9:power_limit:1"}, "command_mismatch"),
        ({"command_id": ""}, "command_mismatch"),
    ],
)
async def test_a_reply_from_another_node_or_for_another_command_is_not_believed(
    bus: memory.MemoryBus, gpu: node_source.SimSource, override: dict[str, object], reason: str
) -> None:
    await serve_forger(bus, gpu, **override)
    readings = CountingReadings(gpu)
    with structlog.testing.capture_logs() as logs:
        outcome = await actuator(bus, readings, FakeTime()).apply(req(params={"watts": 450}))
    assert outcome.status == "failed-permanent", outcome
    assert f"reply not believed ({reason})" in outcome.detail
    assert readings.rejected == [reason]
    assert [e["reason"] for e in logs if e["event"] == "power.reply_rejected"] == [reason]


async def test_a_bare_refusal_without_the_command_id_is_still_heard(
    bus: memory.MemoryBus, gpu: node_source.SimSource
) -> None:
    """An agent that cannot decode a command answers a refusal without its id: believed, nothing done."""
    executor = execution.CommandExecutor("n1", gpu, None, gpu_indices=lambda: [0, 1])

    async def on_command(msg: bus_base.Msg) -> None:
        await msg.respond(codec.encode(executor.refuse_undecodable("bad command")))

    await bus.subscribe(subjects.Subjects().command("n1"), on_command)
    outcome = await actuator(bus, CountingReadings(gpu), FakeTime()).apply(req(params={"watts": 450}))
    assert outcome.status == "refused"
