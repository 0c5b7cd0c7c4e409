"""dcgm-exporter's names for healer's telemetry fields: one catalogue, read by the rules (which accept
``DCGM_FI_DEV_GPU_TEMP`` for ``temp_c``) and by the agent's ``/metrics`` (which serves the readings under
those names, so dashboards and alert rules written for dcgm-exporter work without running it).

Facts from NVIDIA's dcgm-exporter (``etc/default-counters.csv``: names, units, which fields are in its
default set) carry over; the mapping to GpuSample fields is healer's. Units: dcgm-exporter reports
energy in mJ and framebuffer in MiB, temperatures in C, power in W, clocks in MHz, utilisation in %;
``scale`` converts healer's field into dcgm-exporter's unit.
"""

from __future__ import annotations

import dataclasses
from typing import Final


@dataclasses.dataclass(frozen=True, slots=True)
class Field:
    name: str
    """The DCGM field name, which dcgm-exporter uses as the Prometheus metric name."""
    source: str
    """The GpuSample field it is read from (``mem_free_mib`` and ``xid_last`` are derived by the agent)."""
    help: str
    scale: float = 1.0
    default: bool = False
    """In dcgm-exporter's default counter set (etc/default-counters.csv)."""


EXPORTED: Final[tuple[Field, ...]] = (
    Field("DCGM_FI_DEV_SM_CLOCK", "sm_clock_mhz", "SM clock frequency (in MHz).", default=True),
    Field("DCGM_FI_DEV_MAX_SM_CLOCK", "sm_clock_max_mhz", "Maximum SM clock frequency (in MHz)."),
    Field("DCGM_FI_DEV_MEMORY_TEMP", "mem_temp_c", "Memory temperature (in C).", default=True),
    Field("DCGM_FI_DEV_GPU_TEMP", "temp_c", "GPU temperature (in C).", default=True),
    Field("DCGM_FI_DEV_SLOWDOWN_TEMP", "slowdown_temp_c", "Slowdown temperature (in C)."),
    Field("DCGM_FI_DEV_SHUTDOWN_TEMP", "shutdown_temp_c", "Shutdown temperature (in C)."),
    Field("DCGM_FI_DEV_MEM_MAX_OP_TEMP", "mem_max_temp_c", "Maximum memory operating temperature (in C)."),
    Field("DCGM_FI_DEV_POWER_USAGE", "power_w", "Power draw (in W).", default=True),
    Field(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "energy_j",
        "Total energy consumption since boot (in mJ).",
        scale=1000.0,
        default=True,
    ),
    Field("DCGM_FI_DEV_POWER_MGMT_LIMIT", "power_limit_w", "Current power limit (in W)."),
    Field("DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF", "power_default_w", "Default power limit (in W)."),
    Field("DCGM_FI_DEV_POWER_MGMT_LIMIT_MIN", "power_min_w", "Minimum power limit (in W)."),
    Field("DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX", "power_max_w", "Maximum power limit (in W)."),
    Field(
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "pcie_replay_count", "Total number of PCIe retries.", default=True
    ),
    Field("DCGM_FI_DEV_PCIE_LINK_GEN", "pcie_gen", "Current PCIe link generation."),
    Field("DCGM_FI_DEV_PCIE_LINK_WIDTH", "pcie_width", "Current PCIe link width."),
    Field("DCGM_FI_DEV_PCIE_MAX_LINK_GEN", "pcie_gen_max", "Maximum PCIe link generation."),
    Field("DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH", "pcie_width_max", "Maximum PCIe link width."),
    Field("DCGM_FI_DEV_GPU_UTIL", "util_gpu_pct", "GPU utilization (in %).", default=True),
    Field("DCGM_FI_DEV_MEM_COPY_UTIL", "util_mem_pct", "Memory utilization (in %).", default=True),
    Field("DCGM_FI_DEV_XID_ERRORS", "xid_last", "Value of the last XID error encountered.", default=True),
    Field("DCGM_FI_DEV_FB_FREE", "mem_free_mib", "Framebuffer memory free (in MiB).", default=True),
    Field("DCGM_FI_DEV_FB_USED", "mem_used_mib", "Framebuffer memory used (in MiB).", default=True),
    Field("DCGM_FI_DEV_FB_TOTAL", "mem_total_mib", "Framebuffer memory total (in MiB)."),
    Field("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "clocks_event_reasons", "Clocks event reasons (NVML bitmask)."),
    Field(
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "ecc_sbe_volatile", "Total number of single-bit volatile ECC errors."
    ),
    Field(
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "ecc_dbe_volatile", "Total number of double-bit volatile ECC errors."
    ),
    Field(
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        "ecc_sbe_aggregate",
        "Total number of single-bit persistent ECC errors.",
    ),
    Field(
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "ecc_dbe_aggregate",
        "Total number of double-bit persistent ECC errors.",
    ),
    Field(
        "DCGM_FI_DEV_RETIRED_PENDING", "retired_pages_pending", "Total number of pages pending retirement."
    ),
    Field(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "remapped_rows_uncorrectable",
        "Number of remapped rows for uncorrectable errors",
        default=True,
    ),
    Field(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "remapped_rows_correctable",
        "Number of remapped rows for correctable errors",
        default=True,
    ),
    Field(
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "row_remap_failure",
        "Whether remapping of rows has failed",
        default=True,
    ),
    Field("DCGM_FI_DEV_ROW_REMAP_PENDING", "row_remap_pending", "Whether remapping of rows is pending"),
    Field(
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "nvlink_crc_flit_errors",
        "Total number of NVLink flow-control CRC errors.",
    ),
    Field(
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        "nvlink_crc_data_errors",
        "Total number of NVLink data CRC errors.",
    ),
    Field(
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        "nvlink_replay_errors",
        "Total number of NVLink retries.",
    ),
    Field(
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
        "nvlink_recovery_errors",
        "Total number of NVLink recovery errors.",
    ),
)
"""What the agent serves, in dcgm-exporter's order where it has one."""

DERIVED: Final = frozenset({"mem_free_mib", "xid_last"})
"""Sources that are not GpuSample fields: the agent computes them (free = total - used; the last XID)."""

ALIASES: Final[dict[str, str]] = {
    **{f.name: f.source for f in EXPORTED if f.scale == 1.0 and f.source not in DERIVED},
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "clocks_event_reasons",
}
"""dcgm-exporter field names a rule may use → healer metric names (same units: rules read healer's)."""
