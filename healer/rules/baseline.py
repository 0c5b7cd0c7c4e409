"""Healthy readings per GPU model: what a rule unit test's unspecified metrics read.

A test names only the metrics its scenario is about; every other field of every GPU reads as a healthy
board of that model under load (counters at 0, links up, PCIe at full gen and width). Figures are from
the product datasheets (``healer.schemas.datasheets``); an unknown model gets the H100 figures under its
own name.
"""

from __future__ import annotations

from typing import Any, Final

from healer.schemas import datasheets, fabric

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

_LOAD: Final[dict[str, dict[str, float]]] = {
    datasheets.H100.model: {"temp_c": 65.0, "mem_temp_c": 71.0, "power_w": 620.0, "mem_used_mib": 61440.0},
    datasheets.A100.model: {"temp_c": 62.0, "mem_temp_c": 68.0, "power_w": 350.0, "mem_used_mib": 61440.0},
}
"""A healthy board of the model under training load (the readings a datasheet does not give)."""


def _healthy_of(sheet: datasheets.Datasheet) -> dict[str, Any]:
    return {
        **_LOAD.get(sheet.model, _LOAD[datasheets.DEFAULT.model]),
        "slowdown_temp_c": sheet.slowdown_temp_c,
        "shutdown_temp_c": sheet.shutdown_temp_c,
        "mem_max_temp_c": sheet.mem_max_temp_c,
        "power_limit_w": sheet.power_default_w,
        "power_default_w": sheet.power_default_w,
        "power_min_w": sheet.power_min_w,
        "power_max_w": sheet.power_max_w,
        "mem_total_mib": sheet.mem_total_mib,
        "sm_clock_mhz": sheet.sm_clock_max_mhz,
        "sm_clock_max_mhz": sheet.sm_clock_max_mhz,
        "nvlink_links_total": sheet.nvlink_links,
        "nvlink_links_up": sheet.nvlink_links,
        "pcie_gen": sheet.pcie_gen_max,
        "pcie_gen_max": sheet.pcie_gen_max,
        "pcie_width": sheet.pcie_width_max,
        "pcie_width_max": sheet.pcie_width_max,
    }


MODELS: Final[dict[str, dict[str, Any]]] = {
    model: _healthy_of(sheet) for model, sheet in datasheets.BY_MODEL.items()
}
"""Healthy readings by model: the datasheet figures (``healer.schemas.datasheets``) at full clocks and
links, under the load figures above."""
DEFAULT_MODEL: Final = datasheets.DEFAULT.model


_PORT: Final[dict[str, Any]] = {
    "link_layer": "InfiniBand",
    "state": 4,
    "phys_state": 5,
    "rate_gbps": 400.0,
    **dict.fromkeys(fabric.COUNTERS, 0),
}
"""A healthy InfiniBand NDR port (ConnectX-7): ACTIVE, LinkUp, 400 Gb/s, every counter at 0."""


def healthy_port() -> dict[str, Any]:
    """Field values of a healthy RDMA port (PortSample keyword arguments, without device/port)."""
    return dict(_PORT)


def healthy(model: str | None) -> dict[str, Any]:
    """Field values of a healthy GPU of ``model`` (GpuSample keyword arguments, without index/uuid)."""
    name = model or DEFAULT_MODEL
    values = MODELS.get(name, MODELS[DEFAULT_MODEL])
    return {"model": name, **_COMMON, **values}
