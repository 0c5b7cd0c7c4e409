"""What NVML's clock event reasons say about a low clock, for the fail-slow scorer: which reasons name a
hardware cause (``CAUSE_BITS``, told in an incident by ``describe_cause``) and which explain a low clock on
a healthy chip (``CAPPED_BITS``); a loaded sample with none of those and under ``FREE_POWER`` of its limit
is *unconstrained*, the one whose clock is the chip's own.
"""

from __future__ import annotations

from typing import Final

import numpy as np

from healer.schemas import fields

WHY = fields.ClocksEventReason
APP_CLOCKS: Final = 0x2
"""NVML's applications-clocks-setting reason (a clock the site or the job set, or locked clocks)."""
SYNC_BOOST: Final = 0x10
"""NVML's sync-boost reason (clocks held to the group's slowest GPU). Neither is in
``ClocksEventReason`` (no rule reads them)."""
REASONS: Final = {int(r): str(r.name).lower() for r in WHY if r is not WHY.GPU_IDLE}
"""NVML clocks event reasons (schemas/fields.py ``ClocksEventReason``), bit → name."""
CAUSE_BITS: Final = int(
    WHY.HW_SLOWDOWN | WHY.SW_THERMAL_SLOWDOWN | WHY.HW_THERMAL_SLOWDOWN | WHY.HW_POWER_BRAKE_SLOWDOWN
)
"""Reasons that name a hardware cause of low clocks (not the power cap every busy GPU meets)."""
FAULT_BITS: Final = int(WHY.HW_SLOWDOWN | WHY.HW_POWER_BRAKE_SLOWDOWN)
"""Reasons that a power cap never explains: the hardware itself slows the clock."""
CAPPED_BITS: Final = int(
    WHY.SW_POWER_CAP | WHY.SW_THERMAL_SLOWDOWN | WHY.HW_THERMAL_SLOWDOWN | SYNC_BOOST | APP_CLOCKS
)
"""Reasons that explain a low clock on a healthy chip: its power cap, its own temperature (thermal
slowdowns have their own rules), a sync-boost group (another GPU's clock), or a clock someone set."""
OFFCAP_BITS: Final = int(WHY.SW_POWER_CAP | WHY.SW_THERMAL_SLOWDOWN | WHY.HW_THERMAL_SLOWDOWN)
"""Reasons that hold a healthy chip below the clock it may run at (its power cap, its temperature): a
loaded sample under ``FREE_POWER`` with none of them is *off the cap*. A clock someone set (applications
clocks) or a sync-boost group is a ceiling the job's GPUs share, so such a sample still runs at least
where its capped peers run (the fail-slow scorer's test against its job's loaded clock, #39)."""
FREE_POWER: Final = 0.95
"""A loaded sample is *unconstrained* (free) when none of ``CAPPED_BITS`` is set and it draws under
this share of its power limit: nothing that a healthy chip obeys lowers its clock there, so a healthy
one runs at the clock its peers (and its own past) run at, whatever its chip factor or its job."""


def describe_cause(reasons: int, link_down: bool) -> str:
    """What the telemetry names as the cause: clock reasons that point at hardware, a down-trained link."""
    parts = [name for bit, name in REASONS.items() if reasons & bit & CAUSE_BITS]
    if link_down:
        parts.append("link_down_trained")
    return ",".join(parts)


def cap_explains(loaded: np.ndarray, free: np.ndarray, reasons: np.ndarray, share: float) -> np.ndarray:
    """Per GPU: its window's loaded clock is explained by its power-to-clock relation, not a fault: at
    least ``share`` of its loaded samples were not unconstrained (at or near its power cap, or held by a
    reason a healthy chip obeys: ``CAPPED_BITS``), and no reason of the window names the hardware
    (``FAULT_BITS``). ``loaded`` and ``free`` count the window's loaded and unconstrained samples,
    ``reasons`` is the OR of its reasons. At its cap a chip's clock is what the cap allows for the work
    it does: a phase that needs more power per clock lowers it, healthy; a fault that limits the clock
    lowers the power too, off the cap."""
    out: np.ndarray = (loaded > 0) & (loaded - free >= share * loaded) & ((reasons & FAULT_BITS) == 0)
    return out
