"""Healthy readings per GPU model: what a rule unit test's unspecified metrics read.

A test names only the metrics its scenario is about; every other field of every GPU reads as a healthy
board of that model under load (counters at 0, links up, PCIe at full gen and width). Figures are from
the product datasheets; an unknown model gets the H100 figures under its own name.
"""

from __future__ import annotations

from typing import Any, Final

_COMMON: Final[dict[str, Any]] = {
    "clocks_event_reasons": 0,
    "ecc_sbe_volatile": 0,
    "ecc_dbe_volatile": 0,
    "ecc_sbe_aggregate": 0,
    "ecc_dbe_aggregate": 0,
    "retired_pages": 0,
    "retired_pages_pending": False,
    "remapped_rows_correctable": 0,
    "remapped_rows_uncorrectable": 0,
    "row_remap_pending": False,
    "row_remap_failure": False,
    "nvlink_crc_flit_errors": 0,
    "nvlink_crc_data_errors": 0,
    "nvlink_replay_errors": 0,
    "nvlink_recovery_errors": 0,
    "pcie_replay_count": 0,
    "recovery_action": 0,
    "util_gpu_pct": 90.0,
    "util_mem_pct": 55.0,
    "energy_j": 0.0,
}

MODELS: Final[dict[str, dict[str, Any]]] = {
    "NVIDIA H100 80GB HBM3": {
        "temp_c": 65.0,
        "mem_temp_c": 71.0,
        "slowdown_temp_c": 90.0,
        "shutdown_temp_c": 92.0,
        "mem_max_temp_c": 95.0,
        "power_w": 620.0,
        "power_limit_w": 700.0,
        "power_default_w": 700.0,
        "power_min_w": 200.0,
        "power_max_w": 700.0,
        "mem_used_mib": 61440.0,
        "mem_total_mib": 81559.0,
        "sm_clock_mhz": 1980.0,
        "sm_clock_max_mhz": 1980.0,
        "nvlink_links_total": 18,
        "nvlink_links_up": 18,
        "pcie_gen": 5,
        "pcie_gen_max": 5,
        "pcie_width": 16,
        "pcie_width_max": 16,
    },
    "NVIDIA A100-SXM4-80GB": {
        "temp_c": 62.0,
        "mem_temp_c": 68.0,
        "slowdown_temp_c": 89.0,
        "shutdown_temp_c": 92.0,
        "mem_max_temp_c": 95.0,
        "power_w": 350.0,
        "power_limit_w": 400.0,
        "power_default_w": 400.0,
        "power_min_w": 100.0,
        "power_max_w": 400.0,
        "mem_used_mib": 61440.0,
        "mem_total_mib": 81920.0,
        "sm_clock_mhz": 1410.0,
        "sm_clock_max_mhz": 1410.0,
        "nvlink_links_total": 12,
        "nvlink_links_up": 12,
        "pcie_gen": 4,
        "pcie_gen_max": 4,
        "pcie_width": 16,
        "pcie_width_max": 16,
    },
}
DEFAULT_MODEL: Final = "NVIDIA H100 80GB HBM3"


def healthy(model: str | None) -> dict[str, Any]:
    """Field values of a healthy GPU of ``model`` (GpuSample keyword arguments, without index/uuid)."""
    name = model or DEFAULT_MODEL
    values = MODELS.get(name, MODELS[DEFAULT_MODEL])
    return {"model": name, **_COMMON, **values}
