"""NodeFrame and GpuSample: one message per node per interval with every GPU of the node.

Units are in the field names. ``None`` means the GPU (or driver) does not support the reading; it is
never a stand-in for "unknown value", and a lost GPU is an absent entry plus a ``gpu_lost`` event, not a
sample full of ``None``. Counters are cumulative exactly as NVML reports them; consumers derive rates and
handle resets.

``GpuSample.jobs`` (the job ids on the GPU, from the agent's job-mapping directory) is an optional,
additive field of both versions; an agent leaves it out while it has no mapping to report.

Versions: ``healer.telemetry.v2`` is v1 plus the optional ``ports`` (the node's RDMA ports,
schemas/fabric.py) and ``fabric_manager_up``. A decoder of this version takes both; an agent sends v2
only when it has one of them to report (a v1 frame stays byte for byte what it was), so controllers are
upgraded first, then agents (docs/wire-format.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Literal, Protocol

import pydantic

from healer.schemas import base, fabric

SCHEMA: Final = "healer.telemetry.v1"
SCHEMA_V2: Final = "healer.telemetry.v2"
"""v1 plus ``ports``: what an agent sends once it reports RDMA ports."""

Source = Literal["nvml", "sim", "replay"]

NODE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
"""Node names: Kubernetes / Slurm / DNS style. Dots are allowed (escaped in subjects, see bus.subjects)."""


TEMP_MIN_C: Final = -50.0
TEMP_MAX_C: Final = 250.0
"""Temperatures outside this are not physical for a running GPU (NVML reports whole degrees; dies
throttle near 90 C and shut down near 100 C): a reading past them is a broken sensor or a forged frame."""
POWER_MAX_W: Final = 10_000.0
"""Power draw and limits, W: a whole GB200 superchip board is under 3 kW."""
MEM_MAX_MIB: Final = 16 * 2**20
"""GPU memory, MiB (16 TiB; an H200 has 141 GiB)."""
CLOCK_MAX_MHZ: Final = 10_000.0
"""SM clocks, MHz (GPUs run below 3 GHz)."""
LINKS_MAX: Final = 256
"""NVLink links per GPU (an H100 has 18)."""
PCIE_GEN_MAX: Final = 32
PCIE_WIDTH_MAX: Final = 64
"""PCIe generation and lane width (gen 6, x16 today)."""
JOBS_MAX: Final = 16
"""Job ids on one GPU (a GPU shared by MPS or time-slicing runs a few)."""


class GpuSample(pydantic.BaseModel):
    """One GPU's readings at one instant."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    index: int = pydantic.Field(ge=0, le=255, description="NVML device index on the node")
    uuid: str | None = pydantic.Field(default=None, max_length=96, description="GPU UUID (GPU-...)")
    model: str | None = pydantic.Field(default=None, max_length=96, description="product name")
    pci_bus_id: str | None = pydantic.Field(default=None, max_length=32)
    temp_c: float | None = pydantic.Field(
        default=None, ge=TEMP_MIN_C, le=TEMP_MAX_C, description="GPU core temperature"
    )
    mem_temp_c: float | None = pydantic.Field(
        default=None, ge=TEMP_MIN_C, le=TEMP_MAX_C, description="HBM temperature"
    )
    slowdown_temp_c: float | None = pydantic.Field(
        default=None, ge=TEMP_MIN_C, le=TEMP_MAX_C, description="HW slowdown threshold"
    )
    shutdown_temp_c: float | None = pydantic.Field(
        default=None, ge=TEMP_MIN_C, le=TEMP_MAX_C, description="HW shutdown threshold"
    )
    mem_max_temp_c: float | None = pydantic.Field(
        default=None, ge=TEMP_MIN_C, le=TEMP_MAX_C, description="HBM max operating temp"
    )
    power_w: float | None = pydantic.Field(default=None, ge=0, le=POWER_MAX_W, description="board power draw")
    power_limit_w: float | None = pydantic.Field(
        default=None, ge=0, le=POWER_MAX_W, description="current power limit"
    )
    power_default_w: float | None = pydantic.Field(
        default=None, ge=0, le=POWER_MAX_W, description="default power limit"
    )
    power_min_w: float | None = pydantic.Field(
        default=None, ge=0, le=POWER_MAX_W, description="lowest settable limit"
    )
    power_max_w: float | None = pydantic.Field(
        default=None, ge=0, le=POWER_MAX_W, description="highest settable limit"
    )
    energy_j: float | None = pydantic.Field(default=None, ge=0, description="energy since driver load")
    util_gpu_pct: float | None = pydantic.Field(default=None, ge=0, le=100)
    util_mem_pct: float | None = pydantic.Field(default=None, ge=0, le=100)
    mem_used_mib: float | None = pydantic.Field(default=None, ge=0, le=MEM_MAX_MIB)
    mem_total_mib: float | None = pydantic.Field(default=None, ge=0, le=MEM_MAX_MIB)
    sm_clock_mhz: float | None = pydantic.Field(default=None, ge=0, le=CLOCK_MAX_MHZ)
    sm_clock_max_mhz: float | None = pydantic.Field(default=None, ge=0, le=CLOCK_MAX_MHZ)
    clocks_event_reasons: int | None = pydantic.Field(
        default=None, ge=0, description="NVML clocks event (throttle) reasons bitmask"
    )
    ecc_sbe_volatile: int | None = pydantic.Field(default=None, ge=0)
    ecc_dbe_volatile: int | None = pydantic.Field(default=None, ge=0)
    ecc_sbe_aggregate: int | None = pydantic.Field(default=None, ge=0)
    ecc_dbe_aggregate: int | None = pydantic.Field(default=None, ge=0)
    retired_pages: int | None = pydantic.Field(
        default=None, ge=0, description="pages retired (pre-Ampere page retirement; SBE + DBE causes)"
    )
    retired_pages_pending: bool | None = None
    remapped_rows_correctable: int | None = pydantic.Field(default=None, ge=0)
    remapped_rows_uncorrectable: int | None = pydantic.Field(default=None, ge=0)
    row_remap_pending: bool | None = None
    row_remap_failure: bool | None = None
    nvlink_links_total: int | None = pydantic.Field(default=None, ge=0, le=LINKS_MAX)
    nvlink_links_up: int | None = pydantic.Field(default=None, ge=0, le=LINKS_MAX)
    nvlink_crc_flit_errors: int | None = pydantic.Field(default=None, ge=0)
    nvlink_crc_data_errors: int | None = pydantic.Field(default=None, ge=0)
    nvlink_replay_errors: int | None = pydantic.Field(default=None, ge=0)
    nvlink_recovery_errors: int | None = pydantic.Field(default=None, ge=0)
    pcie_gen: int | None = pydantic.Field(default=None, ge=0, le=PCIE_GEN_MAX)
    pcie_gen_max: int | None = pydantic.Field(default=None, ge=0, le=PCIE_GEN_MAX)
    pcie_width: int | None = pydantic.Field(default=None, ge=0, le=PCIE_WIDTH_MAX)
    pcie_width_max: int | None = pydantic.Field(default=None, ge=0, le=PCIE_WIDTH_MAX)
    pcie_replay_count: int | None = pydantic.Field(default=None, ge=0)
    recovery_action: int | None = pydantic.Field(
        default=None,
        ge=0,
        description="NVML recovery action: 0 none, 1 reset, 2 reboot, 3 drain P2P, 4 drain+reset",
    )
    # NVLink fabric registration (nvmlDeviceGetGpuFabricInfo: H100/H200 and later in NVSwitch systems).
    fabric_state: int | None = pydantic.Field(
        default=None,
        ge=0,
        le=3,
        description="NVML_GPU_FABRIC_STATE_*: 1 not started, 2 in progress, 3 completed (null: no fabric)",
    )
    fabric_status: int | None = pydantic.Field(
        default=None, ge=0, description="nvmlReturn_t of the fabric registration once completed (0 success)"
    )
    jobs: list[str] | None = pydantic.Field(
        default=None,
        max_length=JOBS_MAX,
        description="scheduler job ids running on this GPU, from the agent's job-mapping directory "
        "(agent.job_map_dir); null: not read, []: no job. Additive and optional in v1 and v2",
    )


class NodeFrame(base.WireModel):
    """Everything one node's agent saw in one sampling interval."""

    schema_: Literal["healer.telemetry.v1", "healer.telemetry.v2"] = pydantic.Field(
        default=SCHEMA, alias="schema"
    )
    node: str = pydantic.Field(min_length=1, max_length=253, pattern=NODE_PATTERN)
    ts: float = pydantic.Field(gt=0, description="unix seconds when sampling started")
    seq: int = pydantic.Field(ge=0, description="frame number since this agent started")
    boot_id: str = pydantic.Field(min_length=1, max_length=64, description="unique per agent start")
    agent_version: str = pydantic.Field(max_length=64)
    source: Source
    gpus_expected: int | None = pydantic.Field(
        default=None, ge=0, le=256, description="GPUs configured for this node; missing entries are lost GPUs"
    )
    gpus: list[GpuSample] = pydantic.Field(max_length=256)
    ports: list[fabric.PortSample] | None = pydantic.Field(
        default=None,
        max_length=fabric.PORTS_MAX,
        description="the node's RDMA ports (v2); null: not read (an older agent), []: the node has none",
    )
    fabric_manager_up: bool | None = pydantic.Field(
        default=None,
        description="NVIDIA Fabric Manager (nv-fabricmanager) is running (v2); null: not checked (no "
        "NVSwitch fabric on the node, or the check is off)",
    )


class GpuView(Protocol):
    """What the controller's hot path reads from one GPU's readings: a GpuSample, or the strict decoder's
    struct of the same fields (``codec.decode_frame_view``). Any other field is read by name."""

    @property
    def index(self) -> int: ...
    @property
    def uuid(self) -> str | None: ...
    @property
    def model(self) -> str | None: ...
    @property
    def temp_c(self) -> float | None: ...
    @property
    def power_w(self) -> float | None: ...
    @property
    def power_limit_w(self) -> float | None: ...
    @property
    def power_default_w(self) -> float | None: ...
    @property
    def util_gpu_pct(self) -> float | None: ...
    @property
    def sm_clock_mhz(self) -> float | None: ...
    @property
    def sm_clock_max_mhz(self) -> float | None: ...
    @property
    def clocks_event_reasons(self) -> int | None: ...
    @property
    def ecc_sbe_volatile(self) -> int | None: ...
    @property
    def nvlink_crc_flit_errors(self) -> int | None: ...
    @property
    def nvlink_crc_data_errors(self) -> int | None: ...
    @property
    def nvlink_replay_errors(self) -> int | None: ...
    @property
    def pcie_replay_count(self) -> int | None: ...


class FrameView(Protocol):
    """What the controller's hot path reads from a frame (a NodeFrame satisfies it)."""

    @property
    def node(self) -> str: ...
    @property
    def ts(self) -> float: ...
    @property
    def boot_id(self) -> str: ...
    @property
    def gpus_expected(self) -> int | None: ...
    @property
    def gpus(self) -> Sequence[GpuView]: ...
