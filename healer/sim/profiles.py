"""GPU model profiles: the constants that make a simulated board look like an H100, H200 or A100.

Thresholds and limits are the datasheet figures (``healer.schemas.datasheets``); the thermal resistance
is chosen so a GPU at its default power limit with nominal cooling settles about 45 °C above the inlet
(a well-cooled HGX node runs its GPUs at 65-75 °C under training load).
"""

from __future__ import annotations

import dataclasses
from typing import Final

from healer.schemas import datasheets


@dataclasses.dataclass(frozen=True, slots=True)
class Profile:
    """A simulated board: its datasheet (``sheet``, the one catalogue the rules read too) and the physics
    the simulator adds."""

    key: str
    """Short name used in scenario files (``H100``)."""
    sheet: datasheets.Datasheet
    """Model name, limits and thresholds, as ``nvidia-smi -q`` reports them."""
    power_idle_w: float
    """Draw of a powered-on GPU with nothing running."""
    power_full_w: float
    """What the board would draw at 100 % utilisation with no cap (a bit above the default limit)."""
    sm_clock_idle_mhz: float
    thermal_c_per_w: float
    """Steady-state core temperature rise above inlet per watt, at cooling efficiency 1."""
    thermal_tau_s: float
    """Time constant of the first-order thermal model."""
    hbm_offset_c: float
    """HBM runs this much warmer than the core at full load."""

    def figure(self, name: str) -> float:
        """A figure by name, the physics' or the datasheet's (``power_idle_w``, ``slowdown_temp_c``)."""
        source = self if name in _PHYSICS else self.sheet
        return float(getattr(source, name))


H100: Final = Profile(
    key="H100",
    sheet=datasheets.H100,
    power_idle_w=70.0,
    power_full_w=720.0,
    sm_clock_idle_mhz=345.0,
    thermal_c_per_w=0.064,
    thermal_tau_s=30.0,
    hbm_offset_c=5.0,
)

H200: Final = dataclasses.replace(
    H100,
    key="H200",
    sheet=datasheets.H200,
    power_idle_w=75.0,
    thermal_tau_s=35.0,
    hbm_offset_c=6.0,
)

A100: Final = Profile(
    key="A100",
    sheet=datasheets.A100,
    power_idle_w=55.0,
    power_full_w=415.0,
    sm_clock_idle_mhz=210.0,
    thermal_c_per_w=0.11,
    thermal_tau_s=30.0,
    hbm_offset_c=4.0,
)

_PHYSICS: Final = frozenset(f.name for f in dataclasses.fields(Profile)) - {"key", "sheet"}

PROFILES: Final = {p.key: p for p in (H100, H200, A100)}
"""Profiles by scenario key."""

# NVML recovery actions.
RECOVERY_NONE: Final = 0
RECOVERY_GPU_RESET: Final = 1
RECOVERY_NODE_REBOOT: Final = 2
RECOVERY_DRAIN_AND_RESET: Final = 4
