"""GPU model profiles: the constants that make a simulated board look like an H100, H200 or A100.

Thresholds are what ``nvidia-smi -q`` reports for the SXM boards; the thermal resistance is chosen so a
GPU at its default power limit with nominal cooling settles about 45 °C above the inlet (a well-cooled
HGX node runs its GPUs at 65-75 °C under training load).
"""

from __future__ import annotations

import dataclasses
from typing import Final


@dataclasses.dataclass(frozen=True, slots=True)
class Profile:
    key: str
    """Short name used in scenario files (``H100``)."""
    model: str
    """Product name exactly as NVML reports it."""
    power_default_w: float
    power_min_w: float
    power_max_w: float
    power_idle_w: float
    """Draw of a powered-on GPU with nothing running."""
    power_full_w: float
    """What the board would draw at 100 % utilisation with no cap (a bit above the default limit)."""
    slowdown_temp_c: float
    """Hardware slowdown threshold (clocks drop hard)."""
    shutdown_temp_c: float
    max_operating_temp_c: float
    """Software thermal slowdown target: the driver holds the core here when cooling is short."""
    mem_max_temp_c: float
    mem_total_mib: float
    sm_clock_max_mhz: float
    sm_clock_idle_mhz: float
    nvlink_links: int
    pcie_gen_max: int
    pcie_width_max: int
    thermal_c_per_w: float
    """Steady-state core temperature rise above inlet per watt, at cooling efficiency 1."""
    thermal_tau_s: float
    """Time constant of the first-order thermal model."""
    hbm_offset_c: float
    """HBM runs this much warmer than the core at full load."""


H100: Final = Profile(
    key="H100",
    model="NVIDIA H100 80GB HBM3",
    power_default_w=700.0,
    power_min_w=200.0,
    power_max_w=700.0,
    power_idle_w=70.0,
    power_full_w=720.0,
    slowdown_temp_c=90.0,
    shutdown_temp_c=92.0,
    max_operating_temp_c=87.0,
    mem_max_temp_c=95.0,
    mem_total_mib=81559.0,
    sm_clock_max_mhz=1980.0,
    sm_clock_idle_mhz=345.0,
    nvlink_links=18,
    pcie_gen_max=5,
    pcie_width_max=16,
    thermal_c_per_w=0.064,
    thermal_tau_s=30.0,
    hbm_offset_c=5.0,
)

H200: Final = dataclasses.replace(
    H100,
    key="H200",
    model="NVIDIA H200",
    mem_total_mib=143771.0,
    power_idle_w=75.0,
    thermal_tau_s=35.0,
    hbm_offset_c=6.0,
)

A100: Final = Profile(
    key="A100",
    model="NVIDIA A100-SXM4-80GB",
    power_default_w=400.0,
    power_min_w=100.0,
    power_max_w=400.0,
    power_idle_w=55.0,
    power_full_w=415.0,
    slowdown_temp_c=89.0,
    shutdown_temp_c=92.0,
    max_operating_temp_c=85.0,
    mem_max_temp_c=95.0,
    mem_total_mib=81920.0,
    sm_clock_max_mhz=1410.0,
    sm_clock_idle_mhz=210.0,
    nvlink_links=12,
    pcie_gen_max=4,
    pcie_width_max=16,
    thermal_c_per_w=0.11,
    thermal_tau_s=30.0,
    hbm_offset_c=4.0,
)

PROFILES: Final = {p.key: p for p in (H100, H200, A100)}
"""Profiles by scenario key."""

# NVML clocks event (throttle) reason bits.
GPU_IDLE: Final = 0x1
SW_POWER_CAP: Final = 0x4
HW_SLOWDOWN: Final = 0x8
SW_THERMAL_SLOWDOWN: Final = 0x20
HW_THERMAL_SLOWDOWN: Final = 0x40
HW_POWER_BRAKE_SLOWDOWN: Final = 0x80

# NVML recovery actions.
RECOVERY_NONE: Final = 0
RECOVERY_GPU_RESET: Final = 1
RECOVERY_NODE_REBOOT: Final = 2
RECOVERY_DRAIN_AND_RESET: Final = 4
