"""GPU datasheet figures: what ``nvidia-smi -q`` reports for each SXM board healer knows by name.

One catalogue, read by the rules' healthy baseline (``healer.rules.baseline``: what a rule test's
unspecified metrics read) and by the simulator's GPU profiles (``healer.sim.profiles``, which add the
physics: idle draw, thermal resistance and time constant). Names are the product names NVML reports.
"""

from __future__ import annotations

import dataclasses
from typing import Final


@dataclasses.dataclass(frozen=True, slots=True)
class Datasheet:
    model: str
    """Product name exactly as NVML reports it."""
    power_default_w: float
    power_min_w: float
    power_max_w: float
    slowdown_temp_c: float
    """Hardware slowdown threshold (clocks drop hard)."""
    shutdown_temp_c: float
    max_operating_temp_c: float
    """Software thermal slowdown target: the driver holds the core here when cooling is short."""
    mem_max_temp_c: float
    mem_total_mib: float
    sm_clock_max_mhz: float
    nvlink_links: int
    pcie_gen_max: int
    pcie_width_max: int


H100: Final = Datasheet(
    model="NVIDIA H100 80GB HBM3",
    power_default_w=700.0,
    power_min_w=200.0,
    power_max_w=700.0,
    slowdown_temp_c=90.0,
    shutdown_temp_c=92.0,
    max_operating_temp_c=87.0,
    mem_max_temp_c=95.0,
    mem_total_mib=81559.0,
    sm_clock_max_mhz=1980.0,
    nvlink_links=18,
    pcie_gen_max=5,
    pcie_width_max=16,
)

H200: Final = dataclasses.replace(H100, model="NVIDIA H200", mem_total_mib=143771.0)

A100: Final = Datasheet(
    model="NVIDIA A100-SXM4-80GB",
    power_default_w=400.0,
    power_min_w=100.0,
    power_max_w=400.0,
    slowdown_temp_c=89.0,
    shutdown_temp_c=92.0,
    max_operating_temp_c=85.0,
    mem_max_temp_c=95.0,
    mem_total_mib=81920.0,
    sm_clock_max_mhz=1410.0,
    nvlink_links=12,
    pcie_gen_max=4,
    pcie_width_max=16,
)

BY_MODEL: Final = {d.model: d for d in (H100, H200, A100)}
"""Datasheets by NVML product name."""
DEFAULT: Final = H100
"""What an unknown model is taken to be."""
