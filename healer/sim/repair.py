"""What recovery does to each simulated fault kind: the chance a GPU reset fixes it, the chance a node
reboot fixes it when the reset did not, and the kinds only a replacement fixes.

These are healer's estimates, not measured figures: NVIDIA publishes which action to take per XID (its
"immediate action", healer/schemas/xids.yaml), not how often it works. Each row gives its reasoning so
a site can replace it with its own repair data. The recovery-ladder benchmark
(benchmarks/recovery_week.py) reads this table. The live simulated fleet's reset and reboot
(``Fleet.reset_gpu``, ``Fleet.reboot_node``) still always clear what they touch; drawing from this table
there is not done yet.

``reset`` is P(a GPU reset fixes it); ``reboot`` is P(a reboot fixes it | the reset did not, or was not
tried); what is left needs a person and a replacement part. ``ladder`` is the rule pack's ladder
(rules/ladders.yaml) that takes the fault's incident, or ``None`` where no ladder applies (the fault is
capped, cordoned or only reported, and waits for a person as before).
"""

from __future__ import annotations

import dataclasses
from typing import Final

import numpy as np

from healer import actions


@dataclasses.dataclass(frozen=True, slots=True)
class Recovery:
    reset: float
    reboot: float
    ladder: str | None
    why: str

    @property
    def replacement_only(self) -> bool:
        return self.reset == 0.0 and self.reboot == 0.0


MODEL: Final[dict[str, Recovery]] = {
    "ecc_dbe": Recovery(
        0.95, 0.9, "reset-then-reboot",
        "XID 48: the reset applies the pending row remap (NVIDIA: RESET_GPU after the remap); it fails "
        "when the bank has no spare row left, which shows as a remap failure next time",
    ),
    "row_remap_pending": Recovery(
        0.99, 0.9, "reset-then-reboot",
        "XID 63: the remap is recorded and applied on the next reset; nearly always succeeds",
    ),
    "uncontained_ecc": Recovery(
        0.9, 0.8, "reset-then-reboot",
        "XID 95: NVIDIA RESET_GPU; the DBE itself is transient, a weak cell recurs and trips the "
        "N-recoveries rule",
    ),
    "gsp_timeout": Recovery(
        0.85, 0.9, "reset-then-reboot",
        "XID 119: a hung GPU System Processor; a reset reloads its firmware, a reboot reloads the driver",
    ),
    "nvlink_down": Recovery(
        0.6, 0.7, "reset-then-reboot",
        "XID 74: a reset retrains the links; a link that stays down is a cable, connector or NVSwitch",
    ),
    "fell_off_bus": Recovery(
        0.0, 0.7, "reboot",
        "XID 79: a GPU off the bus cannot be reset (NVIDIA RESTART_BM); a reboot re-enumerates PCIe; one "
        "that falls off again is a board, riser or power fault",
    ),
    "row_remap_failure": Recovery(
        0.0, 0.0, "contact-support",
        "XID 64: no spare rows left in the bank; NVIDIA's guidance is to contact support (replace the GPU)",
    ),
    "pcie_downtrain": Recovery(
        0.3, 0.6, None,
        "a link retrains at reset and at boot; a degraded link that persists is a riser or slot",
    ),
    "pcie_replay_storm": Recovery(0.2, 0.4, None, "replays are mostly signal integrity: physical"),
    "nvlink_crc_rising": Recovery(0.2, 0.3, None, "rising CRC errors are mostly a cable or connector"),
    "ecc_sbe_storm": Recovery(
        0.7, 0.7, None, "volatile counts clear on reset; weak cells keep correcting"
    ),
    "power_brake": Recovery(0.0, 0.5, None, "a hardware brake is the PSU or BMC; a reboot clears it"),
    "node_silent": Recovery(0.0, 0.9, None, "host maintenance or a hung host: a reboot brings most back"),
    "cooling_degradation": Recovery(0.0, 0.0, None, "thermal interface or fan: mechanical, a person"),
    "inlet_failure": Recovery(0.0, 0.0, None, "facility cooling: nothing on the node fixes it"),
    "clock_limit": Recovery(
        0.2, 0.3, "reset-then-reboot",
        "a clock held low by a bad power stage (HW slowdown) is hardware; a reset or a reboot clears the "
        "odd firmware-held throttle, most need the board replaced",
    ),
    "nvlink_degraded": Recovery(
        0.6, 0.7, "reset-then-reboot",
        "links that dropped out retrain at reset, as for XID 74; one that stays dark is a cable, "
        "connector or NVSwitch",
    ),
    "port_congestion": Recovery(
        0.0, 0.0, None, "congestion is the fabric's or the traffic's: nothing on the node fixes it"
    ),
    "job_slowdown": Recovery(0.0, 0.0, None, "the job's own stall (data, storage): not the node's fault"),
    "port_flap": Recovery(
        0.0, 0.3, None,
        "a link that fails its error recovery and retrains is mostly a cable, transceiver or switch "
        "port; it is cordoned and comes back after quiet minutes, a reboot rarely changes it",
    ),
    "port_downtrain": Recovery(
        0.0, 0.5, None,
        "a port trained down retrains at the next driver load; a lane that stays dark is the cable "
        "or transceiver",
    ),
    "port_symbol_burst": Recovery(0.0, 0.2, None, "symbol errors are signal integrity: physical"),
    "hca_missing": Recovery(
        0.0, 0.7, "fabric",
        "an HCA gone after a firmware fault usually re-enumerates at boot; one that does not is the "
        "card or its slot",
    ),
}  # fmt: skip
"""Every fault kind of healer.sim.faults (a test keeps the two in step)."""


def fixed_by(kind: str, rung: str, rng: np.random.Generator) -> bool:
    """Whether this ``rung`` (``reset_gpu`` / ``reboot_node``) fixes a fault of ``kind``, drawn from ``rng``
    (for a reboot: given that a reset, if tried, did not)."""
    model = MODEL[kind]
    p = model.reboot if actions.spec(rung).reboots else model.reset
    return bool(rng.random() < p)
