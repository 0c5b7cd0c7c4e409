"""What a rule can read: the metric catalog, in one place.

Every numeric or boolean field of ``GpuSample`` is a GPU metric under its own name (booleans read as 0/1),
and also under the dcgm-exporter name SREs already know (``DCGM_FI_DEV_GPU_TEMP`` is ``temp_c``), always
in healer's units. Derived GPU metrics split the NVML clocks-event bitmask into named 0/1 flags. Node
metrics describe the frame itself (``gpus_missing`` against ``gpus_expected``). ``anomaly_score`` is fed
by the anomaly model and reads 0 until one is loaded. The rule checker resolves names here at load time.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Final, Literal

from healer.schemas import telemetry

Level = Literal["gpu", "node"]
Kind = Literal["gauge", "counter", "bool"]

# NVML clocksEventReasons bits (nvml.h: nvmlClocksEventReason*).
CLOCK_BITS: Final[dict[str, tuple[int, str]]] = {
    "clocks_sw_power_cap": (0x4, "software power cap (the power limit) is lowering clocks"),
    "clocks_hw_slowdown": (0x8, "hardware slowdown (thermal, power brake or supply) is active"),
    "clocks_sw_thermal_slowdown": (0x20, "driver thermal slowdown is active"),
    "clocks_hw_thermal_slowdown": (0x40, "hardware thermal slowdown is active"),
    "clocks_hw_power_brake": (0x80, "hardware power brake (external power brake assertion) is active"),
}

COUNTERS: Final = frozenset(
    {
        "energy_j",
        "ecc_sbe_volatile",
        "ecc_dbe_volatile",
        "ecc_sbe_aggregate",
        "ecc_dbe_aggregate",
        "retired_pages",
        "remapped_rows_correctable",
        "remapped_rows_uncorrectable",
        "nvlink_crc_flit_errors",
        "nvlink_crc_data_errors",
        "nvlink_replay_errors",
        "nvlink_recovery_errors",
        "pcie_replay_count",
    }
)

DCGM_ALIASES: Final[dict[str, str]] = {
    "DCGM_FI_DEV_GPU_TEMP": "temp_c",
    "DCGM_FI_DEV_MEMORY_TEMP": "mem_temp_c",
    "DCGM_FI_DEV_SLOWDOWN_TEMP": "slowdown_temp_c",
    "DCGM_FI_DEV_SHUTDOWN_TEMP": "shutdown_temp_c",
    "DCGM_FI_DEV_MEM_MAX_OP_TEMP": "mem_max_temp_c",
    "DCGM_FI_DEV_POWER_USAGE": "power_w",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": "power_limit_w",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF": "power_default_w",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT_MIN": "power_min_w",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX": "power_max_w",
    "DCGM_FI_DEV_GPU_UTIL": "util_gpu_pct",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "util_mem_pct",
    "DCGM_FI_DEV_FB_USED": "mem_used_mib",
    "DCGM_FI_DEV_FB_TOTAL": "mem_total_mib",
    "DCGM_FI_DEV_SM_CLOCK": "sm_clock_mhz",
    "DCGM_FI_DEV_MAX_SM_CLOCK": "sm_clock_max_mhz",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "clocks_event_reasons",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": "clocks_event_reasons",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": "ecc_sbe_volatile",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "ecc_dbe_volatile",
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": "ecc_sbe_aggregate",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": "ecc_dbe_aggregate",
    "DCGM_FI_DEV_RETIRED_PENDING": "retired_pages_pending",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "remapped_rows_correctable",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "remapped_rows_uncorrectable",
    "DCGM_FI_DEV_ROW_REMAP_PENDING": "row_remap_pending",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "row_remap_failure",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": "nvlink_crc_flit_errors",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": "nvlink_crc_data_errors",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": "nvlink_replay_errors",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": "nvlink_recovery_errors",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "pcie_replay_count",
    "DCGM_FI_DEV_PCIE_LINK_GEN": "pcie_gen",
    "DCGM_FI_DEV_PCIE_LINK_WIDTH": "pcie_width",
    "DCGM_FI_DEV_PCIE_MAX_LINK_GEN": "pcie_gen_max",
    "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH": "pcie_width_max",
}
"""dcgm-exporter field names → healer metric names (values are in healer's units)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Metric:
    name: str
    level: Level
    kind: Kind
    description: str
    source: Literal["sample", "derived", "node", "external"] = "sample"
    history: bool = True
    """Whether range functions (``rate(x[5m])``) may read it."""


def _sample_metrics() -> dict[str, Metric]:
    out: dict[str, Metric] = {}
    for name, field in telemetry.GpuSample.model_fields.items():
        ann = field.annotation
        args = set(typing.get_args(ann)) if isinstance(ann, types.UnionType) else {ann}
        args.discard(type(None))
        if args == {bool}:
            kind: Kind = "bool"
        elif args <= {int, float} and name != "index":
            kind = "counter" if name in COUNTERS else "gauge"
        else:
            continue
        out[name] = Metric(name, "gpu", kind, field.description or name.replace("_", " "))
    return out


SAMPLE: Final = _sample_metrics()
"""GpuSample fields readable by rules, in field order (the ingest column order)."""

DERIVED: Final = {
    name: Metric(name, "gpu", "bool", f"{desc} (clocks_event_reasons & {bit:#x})", "derived")
    for name, (bit, desc) in CLOCK_BITS.items()
}

NODE: Final = {
    "gpus_expected": Metric("gpus_expected", "node", "gauge", "GPUs configured for the node", "node", False),
    "gpus_present": Metric("gpus_present", "node", "gauge", "GPUs in the node's latest frame", "node", False),
    "gpus_missing": Metric(
        "gpus_missing", "node", "gauge", "gpus_expected - gpus_present, 0 when none missing", "node", False
    ),
}

EXTERNAL: Final = {
    "anomaly_score": Metric(
        "anomaly_score",
        "gpu",
        "gauge",
        "anomaly model output, 0..1 (0 until a model is loaded)",
        "external",
        False,
    ),
}

ALL: Final[dict[str, Metric]] = {**SAMPLE, **DERIVED, **NODE, **EXTERNAL}

TELEMETRY: Final = "telemetry"
"""Pseudo-metric for ``absent(telemetry[2m])``: no frame at all from the node."""


def resolve(name: str) -> Metric | None:
    """A metric by healer or dcgm-exporter name, or None if there is no such metric."""
    return ALL.get(DCGM_ALIASES.get(name, name))
