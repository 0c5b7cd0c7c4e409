"""Facts about telemetry fields that the schema's types do not carry: which are counters, what clears
them, and what the bits of ``clocks_event_reasons`` mean. One catalogue beside ``telemetry.GpuSample``,
read by the rules (``rate()`` and friends only make sense on a counter; the metric catalogue marks them;
each clock reason is a 0/1 metric of its own), the simulator (which advances and resets the counters and
sets the reason bits) and the anomaly model's features.

A counter is cumulative exactly as NVML reports it: it only grows, except when the event in
``cleared_by`` happens. Every other numeric field is a gauge. Units are in the field names (``energy_j``).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Final, Literal

ClearedBy = Literal["gpu-reset", "driver-load", "never"]


class Scope(enum.StrEnum):
    """What one value describes, declared once: a metric's level (``rules.metric_catalog``), what a
    rule fires per (``scope:`` in a rule file, the same strings) and what an incident is about."""

    GPU = "gpu"
    """One GPU (a ``GpuSample`` field)."""
    NODE = "node"
    """The whole node (a ``NodeFrame`` field, or an aggregation over its GPUs)."""
    PORT = "port"
    """One RDMA port of the node (``fabric.PortSample``)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Counter:
    name: str
    """The GpuSample field."""
    cleared_by: ClearedBy
    """``gpu-reset``: volatile, a GPU reset or driver reload clears it; ``driver-load``: only a driver
    (re)load or reboot does; ``never``: persists on the board (aggregate ECC, remapped rows, retired
    pages)."""
    error: bool = True
    """An error count (a rise is a fault signal), as opposed to an accumulating reading (energy)."""


COUNTERS: Final[dict[str, Counter]] = {
    c.name: c
    for c in (
        Counter("energy_j", "driver-load", error=False),
        Counter("ecc_sbe_volatile", "gpu-reset"),
        Counter("ecc_dbe_volatile", "gpu-reset"),
        Counter("ecc_sbe_aggregate", "never"),
        Counter("ecc_dbe_aggregate", "never"),
        Counter("retired_pages", "never"),
        Counter("remapped_rows_correctable", "never"),
        Counter("remapped_rows_uncorrectable", "never"),
        Counter("nvlink_crc_flit_errors", "gpu-reset"),
        Counter("nvlink_crc_data_errors", "gpu-reset"),
        Counter("nvlink_replay_errors", "gpu-reset"),
        Counter("nvlink_recovery_errors", "gpu-reset"),
        Counter("pcie_replay_count", "gpu-reset"),
    )
}
"""Every cumulative GpuSample field, in a stable order (the simulator's column order follows it)."""


ERROR_COUNTERS: Final[tuple[str, ...]] = tuple(c.name for c in COUNTERS.values() if c.error)
"""The error counts, in catalogue order."""
CLEARED_BY_RESET: Final[tuple[str, ...]] = tuple(
    c.name for c in COUNTERS.values() if c.cleared_by == "gpu-reset"
)
"""Counters a GPU reset or driver reload clears (aggregate ECC, retired pages and remapped rows persist)."""


class ClocksEventReason(enum.IntFlag):
    """The bits of ``clocks_event_reasons``, NVML's clocks event (throttle) reasons bitmask
    (nvml.h: ``nvmlClocksEventReason*``)."""

    GPU_IDLE = 0x1
    SW_POWER_CAP = 0x4
    HW_SLOWDOWN = 0x8
    SW_THERMAL_SLOWDOWN = 0x20
    HW_THERMAL_SLOWDOWN = 0x40
    HW_POWER_BRAKE_SLOWDOWN = 0x80


CLOCK_BITS: Final[dict[str, tuple[ClocksEventReason, str]]] = {
    "clocks_sw_power_cap": (
        ClocksEventReason.SW_POWER_CAP,
        "software power cap (the power limit) is lowering clocks",
    ),
    "clocks_hw_slowdown": (
        ClocksEventReason.HW_SLOWDOWN,
        "hardware slowdown (thermal, power brake or supply) is active",
    ),
    "clocks_sw_thermal_slowdown": (
        ClocksEventReason.SW_THERMAL_SLOWDOWN,
        "driver thermal slowdown is active",
    ),
    "clocks_hw_thermal_slowdown": (
        ClocksEventReason.HW_THERMAL_SLOWDOWN,
        "hardware thermal slowdown is active",
    ),
    "clocks_hw_power_brake": (
        ClocksEventReason.HW_POWER_BRAKE_SLOWDOWN,
        "hardware power brake (external power brake assertion) is active",
    ),
}
"""The reasons a rule reads as 0/1 metrics of their own: metric name -> (bit, what it means)."""
