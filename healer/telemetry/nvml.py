"""NvmlSource: every GpuSample field read from the driver through NVML (nvidia-ml-py), via one choke point.

Every reading goes through ``_read``, which is the only place that decides what an NVML failure means:

- NotSupported (or FunctionNotFound: an older driver) -> the field is ``None`` from now on, logged once per
  GPU and field, and never asked again;
- GpuIsLost -> the GPU is left out of the frame (a missing entry against ``gpus_expected``) and one
  ``gpu_lost`` NodeEvent is returned, not again until the GPU has answered once more;
- any other error -> the field is ``None`` this time and one ``nvml_error`` NodeEvent is returned per GPU,
  field and error code, re-armed once that reading succeeds again.

A value is never made up. Static readings (UUID, name, PCI bus id, thresholds, power-limit envelope, max
clock, max PCIe link) are read once and cached, so a frame costs about 40 NVML calls per GPU. The
``pynvml`` module is a parameter: the real one is imported lazily in ``open()``, tests and benchmarks pass
``FakeNvml(...).module()`` from ``tests/fakes/fake_pynvml.py``. Only this module and ``xid.py`` import
pynvml. docs/nvml.md maps each field to its NVML call. Acting on a GPU (power limits, identity, compute
processes, reset) is nvml_control.py's.
"""

from __future__ import annotations

import ctypes
import dataclasses
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any, Final

import pydantic
import structlog

from healer import errors
from healer.schemas import events, telemetry
from healer.telemetry import kmsg, nvml_control, source

log = structlog.get_logger(__name__)

MIB: Final = 1024 * 1024

FIELD_IDS: Final = (
    ("mem_temp_c", "NVML_FI_DEV_MEMORY_TEMP"),
    ("nvlink_links_total", "NVML_FI_DEV_NVLINK_LINK_COUNT"),
    ("nvlink_crc_flit_errors", "NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"),
    ("nvlink_crc_data_errors", "NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL"),
    ("nvlink_replay_errors", "NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"),
    ("nvlink_recovery_errors", "NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"),
    ("recovery_action", "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION"),
)
"""GpuSample field -> NVML field id, all read with one nvmlDeviceGetFieldValues call per GPU."""

VALUE_MEMBERS: Final = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
"""nvmlValueType_t -> the c_nvmlValue_t union member that holds it."""

FUNCTIONS: Final = {
    "name": "nvmlDeviceGetName",
    "uuid": "nvmlDeviceGetUUID",
    "pci": "nvmlDeviceGetPciInfo",
    "temp": "nvmlDeviceGetTemperature",
    "threshold": "nvmlDeviceGetTemperatureThreshold",
    "power": "nvmlDeviceGetPowerUsage",
    "limit": "nvmlDeviceGetPowerManagementLimit",
    "default_limit": "nvmlDeviceGetPowerManagementDefaultLimit",
    "constraints": "nvmlDeviceGetPowerManagementLimitConstraints",
    "energy": "nvmlDeviceGetTotalEnergyConsumption",
    "util": "nvmlDeviceGetUtilizationRates",
    "memory": "nvmlDeviceGetMemoryInfo",
    "clock": "nvmlDeviceGetClockInfo",
    "max_clock": "nvmlDeviceGetMaxClockInfo",
    "reasons": "nvmlDeviceGetCurrentClocksEventReasons",
    "ecc": "nvmlDeviceGetTotalEccErrors",
    "remapped": "nvmlDeviceGetRemappedRows",
    "retired": "nvmlDeviceGetRetiredPages",
    "retired_pending": "nvmlDeviceGetRetiredPagesPendingStatus",
    "fields": "nvmlDeviceGetFieldValues",
    "link_state": "nvmlDeviceGetNvLinkState",
    "pcie_gen": "nvmlDeviceGetCurrPcieLinkGeneration",
    "pcie_gen_max": "nvmlDeviceGetMaxPcieLinkGeneration",
    "pcie_width": "nvmlDeviceGetCurrPcieLinkWidth",
    "pcie_width_max": "nvmlDeviceGetMaxPcieLinkWidth",
    "pcie_replay": "nvmlDeviceGetPcieReplayCounter",
}
FALLBACKS: Final = {
    "temp": "nvmlDeviceGetTemperatureV",
    "reasons": "nvmlDeviceGetCurrentClocksThrottleReasons",
}
"""The other spelling of a call, used when this pynvml or this driver lacks the first (FunctionNotFound)."""

READS: Final = {
    "handle": ("*",),
    "pci_info": ("pci_bus_id",),
    "power_constraints": ("power_min_w", "power_max_w"),
    "utilization": ("util_gpu_pct", "util_mem_pct"),
    "memory": ("mem_used_mib", "mem_total_mib"),
    "remapped_rows": (
        "remapped_rows_correctable", "remapped_rows_uncorrectable", "row_remap_pending", "row_remap_failure",
    ),
    "retired_pages_sbe": ("retired_pages",),
    "retired_pages_dbe": ("retired_pages",),
    "field_values": tuple(key for key, _ in FIELD_IDS),
    "nvlink_state": ("nvlink_links_up",),
    "fabric": ("fabric_state", "fabric_status"),
}  # fmt: skip
"""A ``_read`` key that is not a GpuSample field -> the fields it fills (``nvlink_state[3]`` is
``nvlink_state``; ``*``: every field). Every other key is the field itself."""


class _Lost(Exception):
    """Internal: the GPU answered GpuIsLost; abandon it for this frame."""


@dataclasses.dataclass(eq=False, slots=True)
class _Gpu:
    index: int
    handle: Any = None
    static: dict[str, Any] = dataclasses.field(default_factory=dict)
    unsupported: set[str] = dataclasses.field(default_factory=set)
    failing: dict[str, set[int | str]] = dataclasses.field(default_factory=dict)
    lost: bool = False


def load_pynvml() -> ModuleType:
    """The real nvidia-ml-py module (imported only when a real source opens)."""
    try:
        import pynvml
    except ImportError as e:  # pragma: no cover - nvidia-ml-py is a runtime dependency
        raise errors.PermanentError("nvidia-ml-py (pynvml) is not installed") from e
    module: ModuleType = pynvml
    return module


def _with_fallback(nv: ModuleType, name: str, fallback: str | None) -> Callable[..., Any] | None:
    """``name`` from this pynvml, switching for good to ``fallback`` if the driver lacks ``name``."""
    first, second = getattr(nv, name, None), getattr(nv, fallback, None) if fallback else None
    if first is None or second is None:
        return first or second
    not_found = nvml_control.error_classes(nv, "NVMLError_FunctionNotFound")
    chosen = [first]

    def call(*args: Any) -> Any:
        try:
            return chosen[0](*args)
        except not_found:
            if chosen[0] is second:
                raise
            chosen[0] = second
            return second(*args)

    return call


class NvmlSource(nvml_control.Control):
    """The real GPUs of this node. ``nvml`` is the pynvml module; tests pass a fake."""

    kind: telemetry.Source = "nvml"

    def __init__(
        self,
        node: str,
        *,
        gpus_expected: int | None = None,
        nvml: ModuleType | None = None,
        reset_command: nvml_control.ResetCommand = nvml_control.nvidia_smi_reset,
    ) -> None:
        self.node = node
        self._reset_command = reset_command
        self.gpus_expected = gpus_expected
        """As configured; after ``open()`` the count NVML found if it was not configured."""
        self._module = nvml
        self._nv: ModuleType | None = None
        self._gpus: list[_Gpu] = []
        self._events: list[events.NodeEvent] = []
        self._lock = threading.Lock()
        self._log = log.bind(node=node, source="nvml")
        self._fn: dict[str, Callable[..., Any] | None] = {}
        self._const: dict[str, int | None] = {}
        self._field_ids: list[tuple[str, int | None]] = []
        self._unsupported_errors: tuple[type[BaseException], ...] = ()
        self._lost_errors: tuple[type[BaseException], ...] = ()
        self._success = 0

    # -- lifecycle -------------------------------------------------------------------------------------
    def open(self) -> None:
        with self._lock:
            if self._nv is not None:
                return
            nv = self._module if self._module is not None else load_pynvml()
            try:
                nv.nvmlInit()
            except nv.NVMLError as e:
                raise nvml_control.init_failed(nv, e) from e
            try:
                count = int(nv.nvmlDeviceGetCount())
            except nv.NVMLError as e:
                nv.nvmlShutdown()
                raise errors.TemporaryError(f"NVML device count failed: {e}", delay=5.0) from e
            if count == 0:
                nv.nvmlShutdown()
                raise errors.PermanentError("NVML sees no GPU on this node")
            self._resolve(nv)
            self._nv = nv
            self._gpus = [_Gpu(i) for i in range(count)]
            for gpu in self._gpus:
                try:
                    gpu.handle = nv.nvmlDeviceGetHandleByIndex(gpu.index)
                except nv.NVMLError as e:  # retried (and reported) by sample()
                    self._log.warning("nvml_handle_failed", gpu_index=gpu.index, error=str(e))
            if self.gpus_expected is None:
                self.gpus_expected = count
            elif count != self.gpus_expected:
                self._log.warning("nvml_gpu_count_mismatch", found=count, expected=self.gpus_expected)
            self._log.info("nvml_opened", gpus=count, gpus_expected=self.gpus_expected)

    def close(self) -> None:
        with self._lock:
            nv, self._nv = self._nv, None
            self._gpus = []
            if nv is None:
                return
            try:
                nv.nvmlShutdown()
            except nv.NVMLError as e:
                self._log.warning("nvml_shutdown_failed", error=str(e))

    def _resolve(self, nv: ModuleType) -> None:
        """Look every function and constant up once; what this pynvml lacks reads as unsupported."""
        self._fn = {k: _with_fallback(nv, name, FALLBACKS.get(k)) for k, name in FUNCTIONS.items()}
        self._fn["fabric"] = _fabric_reader(nv)
        names = [
            "NVML_SUCCESS", "NVML_TEMPERATURE_GPU", "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN",
            "NVML_TEMPERATURE_THRESHOLD_SHUTDOWN", "NVML_TEMPERATURE_THRESHOLD_MEM_MAX", "NVML_CLOCK_SM",
            "NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_VOLATILE_ECC",
            "NVML_AGGREGATE_ECC", "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS",
            "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR", "NVML_FEATURE_ENABLED",
        ]  # fmt: skip
        self._const = {name: getattr(nv, name, None) for name in names}
        self._field_ids = [(key, getattr(nv, name, None)) for key, name in FIELD_IDS]
        self._unsupported_errors = nvml_control.error_classes(
            nv, "NVMLError_NotSupported", "NVMLError_FunctionNotFound"
        )
        self._lost_errors = nvml_control.error_classes(nv, "NVMLError_GpuIsLost")
        self._success = self._const["NVML_SUCCESS"] or 0

    # -- sampling ----------------------------------------------------------------------------------------
    def sample(self) -> source.Sample:
        with self._lock:
            nv = self._opened()
            self._events = []
            gpus: list[telemetry.GpuSample] = []
            for gpu in self._gpus:
                try:
                    if gpu.handle is None:
                        gpu.handle = self._read(
                            gpu, "handle", lambda _h, i=gpu.index: nv.nvmlDeviceGetHandleByIndex(i)
                        )
                        if gpu.handle is None:
                            continue
                    gpus.append(self._read_gpu(gpu))
                except _Lost as e:
                    self._gpu_lost(gpu, e)
                    continue
                if gpu.lost:
                    gpu.lost = False
                    self._log.warning("nvml_gpu_back", gpu_index=gpu.index, gpu_uuid=gpu.static.get("uuid"))
            found, self._events = self._events, []
            return source.Sample(gpus=gpus, events=found)

    def _gpu_lost(self, gpu: _Gpu, e: _Lost) -> None:
        if gpu.lost:
            return
        gpu.lost = True
        uuid = gpu.static.get("uuid")
        self._log.error("nvml_gpu_lost", gpu_index=gpu.index, gpu_uuid=uuid, field=str(e))
        message = f"GPU {gpu.index} is lost (NVML GpuIsLost reading {e}): off the bus or needs a reset"
        self._events.append(
            events.new(self.node, "gpu_lost", gpu_index=gpu.index, gpu_uuid=uuid, message=message)
        )

    def _read(self, gpu: _Gpu, key: str, fn: Callable[..., Any] | None, *args: Any) -> Any:
        """THE choke point: one NVML call for one GPU and one field; ``None`` when it gave no value."""
        if key in gpu.unsupported:
            return None
        if fn is None or None in args:
            self._unsupported(gpu, key, "not in this nvidia-ml-py")
            return None
        try:
            value = fn(gpu.handle, *args)
        except Exception as e:
            self._failed(gpu, key, e)
            return None
        if gpu.failing:
            self._ok(gpu, key)
        return value

    def _static(self, gpu: _Gpu, key: str, fn: Callable[..., Any] | None, *args: Any) -> Any:
        """A reading that never changes while the driver is loaded: read once, then from the cache."""
        cache = gpu.static
        if key in cache:
            return cache[key]
        value = self._read(gpu, key, fn, *args)
        if value is not None or key in gpu.unsupported:
            if isinstance(value, bytes):  # nvidia-ml-py before 11.515 returns bytes
                value = value.decode(errors="replace")
            cache[key] = value
        return value

    def _failed(self, gpu: _Gpu, key: str, e: BaseException) -> None:
        if isinstance(e, self._lost_errors):
            raise _Lost(key) from e
        if isinstance(e, self._unsupported_errors):
            self._unsupported(gpu, key, str(e))
            return
        code = getattr(e, "value", None)
        tag: int | str = code if isinstance(code, int) else type(e).__name__
        seen = gpu.failing.setdefault(key, set())
        if tag in seen:
            return
        seen.add(tag)
        uuid = gpu.static.get("uuid")
        self._log.warning(
            "nvml_read_failed", gpu_index=gpu.index, gpu_uuid=uuid, field=key, code=tag, error=str(e)
        )
        message = f"reading {key} failed: {e} (NVML error {tag})"
        self._events.append(
            events.new(self.node, "nvml_error", gpu_index=gpu.index, gpu_uuid=uuid, message=message)
        )

    def _ok(self, gpu: _Gpu, key: str) -> None:
        if gpu.failing.pop(key, None):
            self._log.info(
                "nvml_read_recovered", gpu_index=gpu.index, gpu_uuid=gpu.static.get("uuid"), field=key
            )

    def _unsupported(self, gpu: _Gpu, key: str, why: str) -> None:
        gpu.unsupported.add(key)
        self._log.info(
            "nvml_field_unsupported", gpu_index=gpu.index, gpu_uuid=gpu.static.get("uuid"), field=key, why=why
        )

    def _read_gpu(self, gpu: _Gpu) -> telemetry.GpuSample:
        r, st, f, c = self._read, self._static, self._fn, self._const
        v: dict[str, Any] = {"index": gpu.index}
        v["temp_c"] = r(gpu, "temp_c", f["temp"], c["NVML_TEMPERATURE_GPU"])  # first: a live probe
        v["uuid"] = st(gpu, "uuid", f["uuid"])
        v["model"] = st(gpu, "model", f["name"])
        if "pci_bus_id" not in gpu.static and (pci := st(gpu, "pci_info", f["pci"])) is not None:
            bus_id = pci.busId
            gpu.static["pci_bus_id"] = bus_id.decode() if isinstance(bus_id, bytes) else bus_id
        v["pci_bus_id"] = gpu.static.get("pci_bus_id")
        v["slowdown_temp_c"] = st(
            gpu, "slowdown_temp_c", f["threshold"], c["NVML_TEMPERATURE_THRESHOLD_SLOWDOWN"]
        )
        v["shutdown_temp_c"] = st(
            gpu, "shutdown_temp_c", f["threshold"], c["NVML_TEMPERATURE_THRESHOLD_SHUTDOWN"]
        )
        v["mem_max_temp_c"] = st(
            gpu, "mem_max_temp_c", f["threshold"], c["NVML_TEMPERATURE_THRESHOLD_MEM_MAX"]
        )
        v["power_w"] = _milli(r(gpu, "power_w", f["power"]))
        v["power_limit_w"] = _milli(r(gpu, "power_limit_w", f["limit"]))
        v["power_default_w"] = _milli(st(gpu, "power_default_w", f["default_limit"]))
        if (limits := st(gpu, "power_constraints", f["constraints"])) is not None:
            v["power_min_w"], v["power_max_w"] = limits[0] / 1000.0, limits[1] / 1000.0
        v["energy_j"] = _milli(r(gpu, "energy_j", f["energy"]))
        if (util := r(gpu, "utilization", f["util"])) is not None:
            v["util_gpu_pct"], v["util_mem_pct"] = util.gpu, util.memory
        if (mem := r(gpu, "memory", f["memory"])) is not None:
            v["mem_used_mib"], v["mem_total_mib"] = mem.used / MIB, mem.total / MIB
        v["sm_clock_mhz"] = r(gpu, "sm_clock_mhz", f["clock"], c["NVML_CLOCK_SM"])
        v["sm_clock_max_mhz"] = st(gpu, "sm_clock_max_mhz", f["max_clock"], c["NVML_CLOCK_SM"])
        v["clocks_event_reasons"] = r(gpu, "clocks_event_reasons", f["reasons"])
        corrected, uncorrected = (
            c["NVML_MEMORY_ERROR_TYPE_CORRECTED"],
            c["NVML_MEMORY_ERROR_TYPE_UNCORRECTED"],
        )
        volatile, aggregate = c["NVML_VOLATILE_ECC"], c["NVML_AGGREGATE_ECC"]
        v["ecc_sbe_volatile"] = r(gpu, "ecc_sbe_volatile", f["ecc"], corrected, volatile)
        v["ecc_dbe_volatile"] = r(gpu, "ecc_dbe_volatile", f["ecc"], uncorrected, volatile)
        v["ecc_sbe_aggregate"] = r(gpu, "ecc_sbe_aggregate", f["ecc"], corrected, aggregate)
        v["ecc_dbe_aggregate"] = r(gpu, "ecc_dbe_aggregate", f["ecc"], uncorrected, aggregate)
        if (rows := r(gpu, "remapped_rows", f["remapped"])) is not None:
            correctable, uncorrectable, pending, failure = rows
            v["remapped_rows_correctable"], v["remapped_rows_uncorrectable"] = correctable, uncorrectable
            v["row_remap_pending"], v["row_remap_failure"] = bool(pending), bool(failure)
        sbe_cause = c["NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS"]
        sbe_pages = r(gpu, "retired_pages_sbe", f["retired"], sbe_cause)
        dbe_pages = r(
            gpu, "retired_pages_dbe", f["retired"], c["NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR"]
        )
        if sbe_pages is not None and dbe_pages is not None:
            v["retired_pages"] = len(sbe_pages) + len(dbe_pages)
        if (pending_pages := r(gpu, "retired_pages_pending", f["retired_pending"])) is not None:
            v["retired_pages_pending"] = pending_pages == c["NVML_FEATURE_ENABLED"]
        self._field_values(gpu, v)
        v["pcie_gen"] = r(gpu, "pcie_gen", f["pcie_gen"])
        v["pcie_gen_max"] = st(gpu, "pcie_gen_max", f["pcie_gen_max"])
        v["pcie_width"] = r(gpu, "pcie_width", f["pcie_width"])
        v["pcie_width_max"] = st(gpu, "pcie_width_max", f["pcie_width_max"])
        v["pcie_replay_count"] = r(gpu, "pcie_replay_count", f["pcie_replay"])
        if (fabric := r(gpu, "fabric", f["fabric"])) is not None:
            v["fabric_state"], v["fabric_status"] = fabric
        return self._validated(gpu, v)

    def _field_values(self, gpu: _Gpu, v: dict[str, Any]) -> None:
        """Memory temperature, NVLink totals and recovery action in one call, then the state of each link."""
        wanted: list[tuple[str, int]] = []
        for key, field_id in self._field_ids:
            if field_id is None:
                self._read(gpu, key, None)  # logs "unsupported" once
            elif key not in gpu.unsupported:
                wanted.append((key, field_id))
        if wanted:
            values = self._read(gpu, "field_values", self._fn["fields"], [fid for _, fid in wanted])
            if values is not None:
                make_error = self._nv.NVMLError if self._nv is not None else None
                for (key, _), fv in zip(wanted, values, strict=False):
                    if fv.nvmlReturn == self._success:
                        if gpu.failing:
                            self._ok(gpu, key)
                        v[key] = getattr(fv.value, VALUE_MEMBERS.get(fv.valueType, "ullVal"))
                    elif make_error is not None:
                        self._failed(gpu, key, make_error(fv.nvmlReturn))
        links = v.get("nvlink_links_total")
        if links:
            enabled = self._const["NVML_FEATURE_ENABLED"]
            states = [
                self._read(gpu, f"nvlink_state[{link}]", self._fn["link_state"], link)
                for link in range(links)
            ]
            if any(state is not None for state in states):
                v["nvlink_links_up"] = sum(1 for state in states if state == enabled)

    def _validated(self, gpu: _Gpu, v: dict[str, Any]) -> telemetry.GpuSample:
        """Build the sample; a value the schema refuses (a driver bug) becomes None and an nvml_error."""
        try:
            return telemetry.GpuSample(**v)
        except pydantic.ValidationError as e:
            for err in e.errors():
                key = str(err["loc"][0]) if err["loc"] else "?"
                if key in v and key != "index":
                    self._failed(gpu, key, ValueError(f"{v[key]!r} refused: {err['msg']}"))
                    v[key] = None
            return telemetry.GpuSample(**v)

    # -- what each read gave (for `healer doctor`) -----------------------------------------------------
    def read_state(self, index: int) -> tuple[frozenset[str], frozenset[str]]:
        """(read keys NotSupported for good, read keys whose last attempt failed) of one GPU, as ``_read``
        decided them; ``READS`` maps a key to its GpuSample fields."""
        with self._lock:
            _, gpu = self._device(index)
            return frozenset(gpu.unsupported), frozenset(gpu.failing)

    # -- PCI addresses (for the kernel log) ------------------------------------------------------------
    def gpu_at(self, address: kmsg.PciAddress) -> tuple[int, str | None] | None:
        """The (index, UUID) of the GPU at a PCI domain:bus:device, read through ``_read`` (cached like
        every static reading); None for an address that is none of this node's GPUs."""
        with self._lock:
            if self._nv is None:
                return None
            for gpu in self._gpus:
                if gpu.handle is None:
                    continue
                try:
                    pci = self._static(gpu, "pci_info", self._fn["pci"])
                    if pci is None or (pci.domain, pci.bus, pci.device) != (
                        address.domain,
                        address.bus,
                        address.device,
                    ):
                        continue
                    return gpu.index, self._static(gpu, "uuid", self._fn["uuid"])
                except _Lost:  # a lost GPU still owns its address: say which it was
                    return gpu.index, gpu.static.get("uuid")
            return None


def _fabric_reader(nv: ModuleType) -> Callable[[Any], tuple[int, int]] | None:
    """nvmlDeviceGetGpuFabricInfo fills a caller-allocated struct: (state, status) for ``_read``. A GPU
    outside any NVLink fabric answers state NOT_SUPPORTED, which reads as NotSupported (null, asked once)."""
    fn, struct = getattr(nv, "nvmlDeviceGetGpuFabricInfo", None), getattr(nv, "c_nvmlGpuFabricInfo_t", None)
    not_supported = getattr(nv, "NVML_ERROR_NOT_SUPPORTED", None)
    if fn is None or struct is None or not_supported is None:
        return None

    def read(handle: Any) -> tuple[int, int]:
        info = struct()
        fn(handle, ctypes.byref(info))
        if int(info.state) == getattr(nv, "NVML_GPU_FABRIC_STATE_NOT_SUPPORTED", 0):
            raise nv.NVMLError(not_supported)
        return int(info.state), int(info.status)

    return read


def _milli(value: Any) -> float | None:
    """mW -> W, mJ -> J."""
    return None if value is None else value / 1000.0
