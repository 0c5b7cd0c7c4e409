"""SimSource: one simulated node behind the TelemetrySource Protocol, so the agent runs without a GPU.

It is a single-node view over the fleet simulator (``healer.sim``): the same physics, workloads and
frame encoding as ``healer sim``, so there is one model of a GPU, not two. By default the node is a
healthy H100 board set under a training job; pass ``scenario`` (a built-in name or a YAML file) to
inject that scenario's faults into this one node. A lowered power limit visibly cools the GPU, which is
what the command round trip relies on.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable

import orjson

from healer.schemas import events, telemetry
from healer.sim import scenarios, simulation
from healer.telemetry import source

DEFAULT_SCENARIO = scenarios.Scenario(name="sim-source", workload={"training": 1.0})
"""A healthy node that trains: steady, high utilisation, no faults."""


class SimSource:
    kind: telemetry.Source = "sim"

    def __init__(
        self,
        node: str,
        gpus: int = 8,
        *,
        seed: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        scenario: str | scenarios.Scenario | None = None,
    ) -> None:
        self.node = node
        self.count = gpus
        self.gpus_expected: int | None = gpus
        self._clock = clock
        if isinstance(scenario, str):
            scenario = scenarios.load(scenario)
        self._sim: simulation.Simulation = scenarios.build(
            scenario or DEFAULT_SCENARIO,
            nodes=1,
            gpus=gpus,
            seed=seed if seed is not None else zlib.crc32(node.encode()),
            start_ts=time.time(),
            names=[node],
        )
        self._sim.fleet.take_events()  # the agent announces its own start
        self._last: float | None = None
        self._opened = False
        self.processes: dict[int, list[int]] = {}
        """Compute processes per GPU index, as a test or demo sets them (a reset is refused while any run)."""

    @property
    def simulation(self) -> simulation.Simulation:
        """The one-node simulation behind this source (tests and demos reach into it)."""
        return self._sim

    def open(self) -> None:
        self._opened = True

    def close(self) -> None:
        self._opened = False

    def power_limits(self, index: int) -> source.PowerLimits:
        return self._sim.fleet.power_limits(0, index)

    def set_power_limit(self, index: int, watts: float) -> None:
        self._sim.fleet.set_power_limit(0, index, watts)

    def compute_processes(self, index: int) -> list[int]:
        self._sim.fleet.power_limits(0, index)  # the same checks: no such GPU, a lost GPU
        return sorted(self.processes.get(index, []))

    def device_info(self, index: int) -> dict[str, str | None]:
        self._sim.fleet.power_limits(0, index)
        return {
            "uuid": None,
            "serial": f"SIM{zlib.crc32(self.node.encode()):08x}{index:02d}",
            "board_part_number": "sim",
            "vbios_version": "sim",
            "driver_version": "sim",
        }

    def reset_gpu(self, index: int, timeout_s: float) -> str:
        """The fleet's reset model: volatile counters clear, a pending remap is applied, throttles clear."""
        self._sim.fleet.reset_gpu_checked(0, index)
        return f"simulated GPU {index} reset"

    def sample(self) -> source.Sample:
        now = self._clock()
        dt = 1.0 if self._last is None else max(0.0, now - self._last)
        self._last = now
        self._sim.step(dt)
        frames = self._sim.frames()
        gpus: list[telemetry.GpuSample] = []
        if frames:
            doc = orjson.loads(frames[0][1])
            gpus = [telemetry.GpuSample.model_validate(g) for g in doc["gpus"]]
        evts = [
            events.NodeEvent.model_validate(e)
            for e in self._sim.take_events()
            if e["kind"] not in ("agent_start", "agent_stop")
        ]
        return source.Sample(gpus=gpus, events=evts)
