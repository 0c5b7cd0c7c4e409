"""SimSource: one healthy simulated node, so the agent and everything downstream run without a GPU.

The GPUs look like H100 SXM 80GB boards under a training job: utilisation wanders around 90 %, power
follows utilisation up to the power limit, temperature follows power through a first-order thermal
model (time constant 30 s), clocks drop when the power limit caps the draw. Counters stay at zero. A
lowered power limit therefore visibly cools the GPU, which is what the command round trip relies on.
The full fleet simulator with faults (healer.sim) plugs into the same Protocol.
"""

from __future__ import annotations

import math
import random
import time
import zlib
from collections.abc import Callable

from healer import errors
from healer.schemas import telemetry
from healer.telemetry import source

MODEL = "NVIDIA H100 80GB HBM3"
DEFAULT_W = 700.0
MIN_W = 200.0
MAX_W = 700.0
IDLE_W = 70.0
INLET_C = 25.0
C_PER_W = 0.075
TAU_S = 30.0
SM_MAX_MHZ = 1980.0
SW_POWER_CAP = 0x4  # NVML clocksEventReasonSwPowerCap


class SimSource:
    kind: telemetry.Source = "sim"

    def __init__(
        self,
        node: str,
        gpus: int = 8,
        *,
        seed: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node = node
        self.count = gpus
        self.gpus_expected: int | None = gpus
        self._rng = random.Random(seed if seed is not None else zlib.crc32(node.encode()))
        self._clock = clock
        self._limit_w = [DEFAULT_W] * gpus
        self._util = [90.0 + self._rng.uniform(-5, 5) for _ in range(gpus)]
        self._temp_c = [INLET_C + 35.0 + self._rng.uniform(-2, 2) for _ in range(gpus)]
        self._energy_j = [0.0] * gpus
        self._last: float | None = None
        self._opened = False

    def open(self) -> None:
        self._opened = True

    def close(self) -> None:
        self._opened = False

    def power_limits(self, index: int) -> source.PowerLimits:
        self._check(index)
        return source.PowerLimits(self._limit_w[index], DEFAULT_W, MIN_W, MAX_W)

    def set_power_limit(self, index: int, watts: float) -> None:
        self._check(index)
        if not MIN_W <= watts <= MAX_W:
            raise errors.PermanentError(f"power limit {watts} W outside [{MIN_W}, {MAX_W}]")
        self._limit_w[index] = watts

    def sample(self) -> source.Sample:
        now = self._clock()
        dt = 1.0 if self._last is None else max(0.0, now - self._last)
        self._last = now
        decay = 1.0 - math.exp(-dt / TAU_S)
        gpus = []
        for i in range(self.count):
            self._util[i] = min(
                100.0, max(0.0, self._util[i] + self._rng.gauss(0, 2) + (90 - self._util[i]) * 0.1)
            )
            wanted_w = IDLE_W + (DEFAULT_W - IDLE_W) * self._util[i] / 100.0
            power_w = min(wanted_w, self._limit_w[i]) + self._rng.gauss(0, 3)
            capped = wanted_w > self._limit_w[i]
            steady_c = INLET_C + C_PER_W * power_w
            self._temp_c[i] += (steady_c - self._temp_c[i]) * decay
            self._energy_j[i] += power_w * dt
            clock = SM_MAX_MHZ * (self._limit_w[i] / wanted_w) ** 0.5 if capped else SM_MAX_MHZ
            gpus.append(
                telemetry.GpuSample(
                    index=i,
                    uuid=f"GPU-sim-{self.node}-{i:02d}",
                    model=MODEL,
                    pci_bus_id=f"00000000:{0x18 + i * 0x10:02X}:00.0",
                    temp_c=round(self._temp_c[i], 1),
                    mem_temp_c=round(self._temp_c[i] + 6.0, 1),
                    slowdown_temp_c=90.0,
                    shutdown_temp_c=92.0,
                    mem_max_temp_c=95.0,
                    power_w=round(power_w, 1),
                    power_limit_w=self._limit_w[i],
                    power_default_w=DEFAULT_W,
                    power_min_w=MIN_W,
                    power_max_w=MAX_W,
                    energy_j=round(self._energy_j[i], 1),
                    util_gpu_pct=round(self._util[i], 1),
                    util_mem_pct=round(self._util[i] * 0.6, 1),
                    mem_used_mib=61440.0,
                    mem_total_mib=81559.0,
                    sm_clock_mhz=round(clock),
                    sm_clock_max_mhz=SM_MAX_MHZ,
                    clocks_event_reasons=SW_POWER_CAP if capped else 0,
                    ecc_sbe_volatile=0,
                    ecc_dbe_volatile=0,
                    ecc_sbe_aggregate=0,
                    ecc_dbe_aggregate=0,
                    remapped_rows_correctable=0,
                    remapped_rows_uncorrectable=0,
                    row_remap_pending=False,
                    row_remap_failure=False,
                    nvlink_links_total=18,
                    nvlink_links_up=18,
                    nvlink_crc_flit_errors=0,
                    nvlink_crc_data_errors=0,
                    nvlink_replay_errors=0,
                    nvlink_recovery_errors=0,
                    pcie_gen=5,
                    pcie_gen_max=5,
                    pcie_width=16,
                    pcie_width_max=16,
                    pcie_replay_count=0,
                    recovery_action=0,
                )
            )
        return source.Sample(gpus=gpus)

    def _check(self, index: int) -> None:
        if not 0 <= index < self.count:
            raise errors.PermanentError(f"no GPU {index} on {self.node} ({self.count} GPUs)")
